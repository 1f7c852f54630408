// Renders chat templates for the Python cross-check against transformers. Reads JSON lines
// {template_path | model_dir, messages, tools, add_generation_prompt, kwargs} on stdin and prints
// one JSON line per request: {"rendered": text} or {"error": message}.
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "common/errors.h"
#include "text/chat_template.h"

namespace {

using nlohmann::ordered_json;

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw torchtpu::NotFoundError("cannot open " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

ordered_json handle(const ordered_json& request) {
  const torchtpu::ChatTemplate chat =
      request.contains("model_dir")
          ? torchtpu::ChatTemplate::from_dir(request["model_dir"].get<std::string>())
          : torchtpu::ChatTemplate::from_string(
                read_whole(request["template_path"].get<std::string>()));
  const ordered_json kwargs = request.value("kwargs", ordered_json::object());
  try {
    return {{"rendered", chat.render(request["messages"], request.value("tools", ordered_json()),
                                     request.value("add_generation_prompt", false), kwargs)}};
  } catch (const torchtpu::ValueError& e) {
    return {{"error", e.what()}};
  }
}

}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    std::cout << handle(ordered_json::parse(line)).dump() << std::endl;
  }
  return 0;
}
