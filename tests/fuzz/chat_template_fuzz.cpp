// libFuzzer harness: Gemma 4's chat template (data/gemma4/chat_template.jinja) rendering
// arbitrary JSON. An object input gives messages, tools and chat_template_kwargs as a request
// would; any other JSON value is rendered as the messages. Malformed messages and the template's
// own raise_exception are ValueErrors; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "common/errors.h"
#include "common/json_depth.h"
#include "text/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

const torchtpu::ChatTemplate& gemma4_template() {
  static const torchtpu::ChatTemplate t = [] {
    std::ifstream in(TORCHTPU_FUZZ_CHAT_TEMPLATE, std::ios::binary);
    std::ostringstream source;
    source << in.rdbuf();
    return torchtpu::ChatTemplate::from_string(source.str());
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool add_generation_prompt = data[0] & 1;
  // Parsed as the server parses request bodies: JSON nested deeper than it allows never reaches
  // the template.
  struct TooDeep {};
  ojson input;
  try {
    input = torchtpu::parse_json_within_depth<ojson>(
        std::string_view(reinterpret_cast<const char*>(data + 1), size - 1),
        [] { throw TooDeep(); });
  } catch (const ojson::exception&) {
    return 0;
  } catch (const TooDeep&) {
    return 0;
  }
  ojson messages = input, tools = nullptr, kwargs = ojson::object();
  if (input.is_object()) {
    messages = input.value("messages", ojson());
    tools = input.value("tools", ojson());
    kwargs = input.value("chat_template_kwargs", ojson::object());
  }
  try {
    gemma4_template().render(messages, tools, add_generation_prompt, kwargs);
  } catch (const torchtpu::ValueError&) {
  }
  return 0;
}
