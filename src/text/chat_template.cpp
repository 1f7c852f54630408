#include "text/chat_template.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "common/errors.h"
#include "common/json_depth.h"
#include "common/json_type.h"

extern "C" {
int tt_jinja_render(const char* source, const char* context_json, char** out, size_t* out_len,
                    char** err);
void tt_jinja_free(char* s);
void tt_jinja_free_text(char* p, size_t len);
}

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// Status codes of tt_jinja_render (src/text/jinja/src/lib.rs).
constexpr int kJinjaOk = 0;
constexpr int kJinjaRaised = 2;

// The named special tokens transformers passes to every template (SPECIAL_TOKENS_ATTRIBUTES).
constexpr std::array<const char*, 7> kSpecialTokenNames = {
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"};

// The names a message's reasoning goes by; transformers copies the first one set into
// "thinking" and "reasoning_content" so that every template finds it.
constexpr std::array<const char*, 3> kReasoningFields = {"reasoning_content", "thinking",
                                                         "reasoning"};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError("cannot open " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

ojson read_json(const fs::path& path) {
  try {
    return parse_json_within_depth<ojson>(read_file(path), [&] {
      throw FormatError(path.string() + " is not valid JSON: arrays and objects nest deeper than " +
                        std::to_string(kMaxJsonDepth) + " levels");
    });
  } catch (const ojson::exception& e) {
    // Not only parse_error: a number beyond double's range (1e999) is out_of_range.
    throw FormatError(path.string() + " is not valid JSON: " + json_error_text(e));
  }
}

// A special token is written as a string or as an AddedToken object {"content": ...}.
void take_special_tokens(const ojson& config, const fs::path& file, ojson& tokens) {
  for (const char* name : kSpecialTokenNames) {
    auto it = config.find(name);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) {
      tokens[name] = *it;
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      tokens[name] = (*it)["content"];
    } else {
      throw FormatError(file.string() + ": " + name +
                        " must be a string or an object with a string \"content\", got " +
                        it->dump());
    }
  }
}

// apply_chat_template's normalisation: keys whose value is null are dropped, reasoning aliased.
ojson normalize_message(const ojson& message, size_t index) {
  if (!message.is_object()) {
    throw ValueError("chat messages must be objects, but message " + std::to_string(index) +
                     " is " + message.dump());
  }
  ojson kept = ojson::object();
  for (const auto& [key, value] : message.items()) {
    if (!value.is_null()) kept[key] = value;
  }
  const ojson* reasoning = nullptr;
  for (const char* field : kReasoningFields) {
    if (kept.contains(field)) {
      reasoning = &kept[field];
      break;
    }
  }
  if (reasoning == nullptr) return kept;
  // Python's {"thinking": r, **message, "reasoning_content": r}: an existing key keeps its place.
  ojson aliased = ojson::object();
  aliased["thinking"] = *reasoning;
  for (const auto& [key, value] : kept.items()) aliased[key] = value;
  aliased["reasoning_content"] = *reasoning;
  return aliased;
}

struct JinjaString {
  char* p = nullptr;
  ~JinjaString() { tt_jinja_free(p); }
};

// The rendered text: its bytes and their count, since the messages' text may hold NULs.
struct JinjaText {
  char* p = nullptr;
  size_t size = 0;
  ~JinjaText() { tt_jinja_free_text(p, size); }
};

}  // namespace

ChatTemplate ChatTemplate::from_dir(const std::string& dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw NotFoundError("checkpoint directory " + dir + " not found");
  ChatTemplate t;
  const fs::path jinja = root / "chat_template.jinja";
  if (fs::is_regular_file(jinja)) t.templates_["default"] = read_file(jinja);
  const fs::path extra = root / "additional_chat_templates";
  if (fs::is_directory(extra)) {
    for (const auto& entry : fs::directory_iterator(extra)) {
      if (entry.path().extension() == ".jinja") {
        t.templates_[entry.path().stem().string()] = read_file(entry.path());
      }
    }
  }
  const fs::path config_path = root / "tokenizer_config.json";
  ojson config = ojson::object();
  if (fs::is_regular_file(config_path)) config = read_json(config_path);
  if (!config.is_object()) throw FormatError(config_path.string() + " is not a JSON object");
  // Template files take priority over the tokenizer_config.json key, as in transformers.
  if (t.templates_.empty() && config.contains("chat_template")) {
    const ojson& key = config["chat_template"];
    if (key.is_string()) {
      t.templates_["default"] = key.get<std::string>();
    } else if (key.is_array()) {
      for (const ojson& entry : key) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string()) {
          throw FormatError(config_path.string() +
                            ": each entry of chat_template must be {\"name\": string, "
                            "\"template\": string}, got " +
                            entry.dump());
        }
        t.templates_[entry["name"].get<std::string>()] = entry["template"].get<std::string>();
      }
    } else if (!key.is_null()) {
      throw FormatError(config_path.string() +
                        ": chat_template must be a string or a list of {name, template}, got " +
                        key.dump());
    }
  }
  if (t.templates_.empty()) {
    throw NotFoundError("no chat template in " + dir +
                        ": neither chat_template.jinja nor a \"chat_template\" key in "
                        "tokenizer_config.json");
  }
  take_special_tokens(config, config_path, t.special_tokens_);
  // Legacy checkpoints keep the special tokens in special_tokens_map.json; transformers reads it,
  // over the config's values, only when the config has no added_tokens_decoder.
  const fs::path map_path = root / "special_tokens_map.json";
  if (!config.contains("added_tokens_decoder") && fs::is_regular_file(map_path)) {
    const ojson map = read_json(map_path);
    if (map.is_object()) take_special_tokens(map, map_path, t.special_tokens_);
  }
  return t;
}

ChatTemplate ChatTemplate::from_string(std::string source, std::string bos_token,
                                       std::string eos_token) {
  ChatTemplate t;
  t.templates_["default"] = std::move(source);
  t.special_tokens_["bos_token"] = std::move(bos_token);
  t.special_tokens_["eos_token"] = std::move(eos_token);
  return t;
}

const std::string& ChatTemplate::select(bool has_tools) const {
  if (templates_.size() == 1 && templates_.begin()->first == "default") {
    return templates_.begin()->second;
  }
  // transformers' get_chat_template for a checkpoint with several named templates.
  if (has_tools) {
    if (auto it = templates_.find("tool_use"); it != templates_.end()) return it->second;
  }
  if (auto it = templates_.find("default"); it != templates_.end()) return it->second;
  std::string names;
  for (const auto& [name, _] : templates_) names += (names.empty() ? "" : ", ") + name;
  throw ValueError("this checkpoint has several chat templates (" + names +
                   ") and none is named \"default\"");
}

const std::string& ChatTemplate::source() const { return select(false); }

std::string ChatTemplate::render(const nlohmann::json& messages, const nlohmann::json& tools,
                                 bool add_generation_prompt, const nlohmann::json& kwargs) const {
  return render(ojson(messages), ojson(tools), add_generation_prompt, ojson(kwargs));
}

std::string ChatTemplate::render(const ojson& messages, const ojson& tools,
                                 bool add_generation_prompt, const ojson& kwargs) const {
  if (!messages.is_array()) {
    throw ValueError("messages must be an array of message objects, got " + messages.dump());
  }
  if (messages.empty()) {
    throw ValueError(
        "Cannot apply chat template to an empty conversation. Provide at least one message.");
  }
  if (!tools.is_null()) {
    if (!tools.is_array()) throw ValueError("tools must be an array or null, got " + tools.dump());
    for (const ojson& tool : tools) {
      if (!tool.is_object()) {
        throw ValueError("each tool must be a JSON schema object, got " + tool.dump());
      }
    }
  }
  if (!kwargs.is_null() && !kwargs.is_object()) {
    throw ValueError("template kwargs must be an object, got " + kwargs.dump());
  }

  ojson context = special_tokens_;
  if (kwargs.is_object()) {
    for (const auto& [key, value] : kwargs.items()) {
      if (key == "messages" || key == "tools" || key == "documents" ||
          key == "add_generation_prompt") {
        throw ValueError("template kwargs must not set \"" + key +
                         "\", which render() passes itself");
      }
      context[key] = value;
    }
  }
  ojson normalized = ojson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    normalized.push_back(normalize_message(messages[i], i));
  }
  context["messages"] = std::move(normalized);
  context["tools"] = tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;

  std::string context_json;
  try {
    context_json = context.dump();
  } catch (const ojson::type_error& e) {
    throw ValueError(std::string("chat messages, tools or kwargs are not valid UTF-8: ") +
                     e.what());
  }
  JinjaText out;
  JinjaString err;
  const int status = tt_jinja_render(select(!tools.is_null()).c_str(), context_json.c_str(), &out.p,
                                     &out.size, &err.p);
  if (status == kJinjaOk) return std::string(out.p, out.size);
  if (status == kJinjaRaised) throw ValueError(err.p);
  throw ValueError(std::string("chat template: ") + err.p);
}

std::vector<std::pair<const char*, bool>> ChatTemplate::Caps::named() const {
  return {{"supports_system_role", system_role},
          {"supports_tools", tools},
          {"supports_tool_calls", tool_calls},
          {"supports_tool_responses", tool_responses},
          {"supports_parallel_tool_calls", parallel_tool_calls},
          {"supports_tool_call_id", tool_call_id},
          {"supports_preserve_reasoning", preserve_reasoning},
          {"supports_reasoning_effort", reasoning_effort}};
}

ChatTemplate::Caps ChatTemplate::caps() const {
  using json = nlohmann::json;
  auto prompt = [&](const json& messages, const json& tools, const json& kwargs) {
    try {
      return render(messages, tools, false, kwargs);
    } catch (const ValueError&) {
      return std::string();
    }
  };
  auto shows = [&](const json& messages, const json& tools,
                   std::initializer_list<const char*> all) {
    const std::string text = prompt(messages, tools, json::object());
    return std::all_of(all.begin(), all.end(),
                       [&](const char* marker) { return text.find(marker) != std::string::npos; });
  };
  const json user = {{"role", "user"}, {"content", "Hey"}};
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "probe_tool"},
                                     {"description", "A probe"},
                                     {"parameters",
                                      {{"type", "object"},
                                       {"properties", {{"arg", {{"type", "string"}}}}},
                                       {"required", {"arg"}}}}}}}});
  auto call = [](const char* id, const char* arg) {
    return json{{"id", id},
                {"type", "function"},
                {"function", {{"name", "probe_tool"}, {"arguments", {{"arg", arg}}}}}};
  };
  const json one_call = {{"role", "assistant"},
                         {"content", ""},
                         {"reasoning_content", "reasoning marker"},
                         {"tool_calls", json::array({call("call_probe_1", "call marker")})}};
  const json two_calls = {
      {"role", "assistant"},
      {"content", ""},
      {"tool_calls", json::array({call("call_probe_1", "first marker"),
                                  call("call_probe_2", "second marker")})}};
  const json response = {{"role", "tool"},
                         {"tool_call_id", "call_probe_1"},
                         {"name", "probe_tool"},
                         {"content", "response marker"}};
  const json after_call = json::array({user, one_call, response});
  Caps caps;
  caps.system_role =
      shows(json::array({{{"role", "system"}, {"content", "system marker"}}, user}), nullptr,
            {"system marker"});
  caps.tools = shows(json::array({user}), tools, {"probe_tool"});
  caps.tool_calls = shows(after_call, tools, {"call marker"});
  caps.tool_responses = shows(after_call, tools, {"response marker"});
  caps.parallel_tool_calls =
      shows(json::array({user, two_calls}), tools, {"first marker", "second marker"});
  caps.tool_call_id = shows(after_call, tools, {"call_probe_1"});
  caps.preserve_reasoning = shows(after_call, tools, {"reasoning marker"});
  const json hey = json::array({user});
  caps.reasoning_effort = prompt(hey, nullptr, {{"reasoning_effort", "high"}}) !=
                          prompt(hey, nullptr, {{"reasoning_effort", "low"}});
  return caps;
}

}  // namespace torchtpu
