// A checkpoint's chat template, rendered as transformers' apply_chat_template(tokenize=False)
// renders it: MiniJinja behind one C function (src/text/jinja), set up as transformers sets up
// Jinja2, with the same message normalisation before rendering.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace torchtpu {

class ChatTemplate {
 public:
  // From a checkpoint dir: chat_template.jinja (plus additional_chat_templates/*.jinja), else the
  // "chat_template" key of tokenizer_config.json (a string, or a list of {name, template}).
  // Special tokens (bos_token, eos_token, ...) come from tokenizer_config.json.
  // NotFoundError if the dir has no template; FormatError if a file there is unreadable JSON.
  static ChatTemplate from_dir(const std::string& dir);
  static ChatTemplate from_string(std::string source, std::string bos_token = "<bos>",
                                  std::string eos_token = "<eos>");

  // messages: an OpenAI-style array; tools: an OpenAI-style array or null; kwargs: extra template
  // variables such as enable_thinking. Template errors (raise_exception, syntax, runtime) and
  // malformed arguments throw ValueError; for raise_exception the message is the template's own.
  std::string render(const nlohmann::json& messages, const nlohmann::json& tools,
                     bool add_generation_prompt,
                     const nlohmann::json& kwargs = nlohmann::json::object()) const;
  // The same, keeping the caller's key order, which Python dicts keep and templates that print
  // `x | tojson` or iterate `.items()` show. Parse requests with ordered_json to get it.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt,
                     const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;

  // The template transformers would pick with tools null: "default", or the only one.
  const std::string& source() const;

  // What the template does with each kind of chat content, found as llama.cpp finds its
  // chat_template_caps: a probe conversation is rendered and its marker text looked for in the
  // prompt (a render that raises counts as no).
  struct Caps {
    bool system_role = false;          // a system message's text
    bool tools = false;                // declared tools
    bool tool_calls = false;           // an assistant turn's tool call
    bool tool_responses = false;       // a tool message's result
    bool parallel_tool_calls = false;  // both of an assistant turn's two calls
    bool tool_call_id = false;         // a call's id
    bool preserve_reasoning = false;   // reasoning_content of a tool-call turn in history
    bool reasoning_effort = false;     // a reasoning_effort variable changes the prompt

    // Under llama.cpp's names ("supports_system_role", ...), in the order above.
    std::vector<std::pair<const char*, bool>> named() const;
  };
  Caps caps() const;

 private:
  ChatTemplate() = default;
  const std::string& select(bool has_tools) const;

  std::map<std::string, std::string> templates_;  // by name; a single template is "default"
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
};

}  // namespace torchtpu
