#include "server/responses.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <set>
#include <tuple>
#include <utility>

#include "common/utf8.h"

namespace torchtpu::server {
namespace {

// The text of a message's content: a string, or text parts (input_text, output_text).
std::string content_text(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(param, "a string or an array of text parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string p = at_index(param, i);
    if (!part.is_object()) throw wrong_type(p, "an object", part);
    const std::string& type = required_string(part, "type", p);
    if (type != "input_text" && type != "output_text") {
      throw unsupported(p + ".type",
                        "must be \"input_text\" or \"output_text\": this field holds text "
                        "only (images and audio go in a user message's own content), got \"" +
                            type + "\"");
    }
    text += required_string(part, "text", p);
  }
  return text;
}

// A user or system message's content as chat's: a string when it is all text, else chat's parts
// (input_image as image_url, input_audio as it is) with the field of each image and audio part
// appended to `media_params`, in order. Images and audio only in user messages.
ojson chat_content(const ojson& content, const std::string& param, bool user,
                   std::vector<std::pair<std::string, std::string>>& media_params) {
  if (content.is_string()) return content;
  if (!content.is_array())
    throw wrong_type(param, "a string or an array of content parts", content);
  ojson parts = ojson::array();
  bool media = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& part = content[i];
    const std::string p = at_index(param, i);
    if (!part.is_object()) throw wrong_type(p, "an object", part);
    const std::string& type = required_string(part, "type", p);
    if ((type == "input_image" || type == "input_audio") && !user) {
      throw invalid(p + ".type", "is \"" + type + "\": images and audio belong to user messages");
    }
    if (type == "input_text" || type == "output_text") {
      parts.push_back({{"type", "text"}, {"text", required_string(part, "text", p)}});
    } else if (type == "input_image") {
      if (field(part, "file_id")) {
        throw unsupported(p + ".file_id",
                          "is not supported: this server stores no files; send "
                          "the image as a data: URL in image_url");
      }
      const std::string& url = required_string(part, "image_url", p);
      const ojson* detail = field(part, "detail");
      const MediaSource source =
          image_from_url(url, p + ".image_url", image_tokens_for_detail(detail, p + ".detail"));
      media_params.emplace_back(source.param, source.mime_param);
      ojson image = {{"url", url}};
      if (detail) image["detail"] = *detail;
      parts.push_back({{"type", "image_url"}, {"image_url", std::move(image)}});
      media = true;
    } else if (type == "input_audio") {
      const MediaSource source = audio_from_input_audio(part, p);
      media_params.emplace_back(source.param, source.mime_param);
      parts.push_back({{"type", "input_audio"}, {"input_audio", part["input_audio"]}});
      media = true;
    } else {
      throw unsupported(p + ".type",
                        "must be \"input_text\", \"output_text\", \"input_image\" or "
                        "\"input_audio\", got \"" +
                            type + "\"");
    }
  }
  if (media) return parts;
  std::string text;
  for (const auto& part : parts) text += part["text"].get<std::string>();
  return text;
}

// The name the model is offered a namespace's function under (chat_tools), and calls it by. No
// function's own name holds a '.' (OpenAI's are letters, digits, '_' and '-'), nor may a
// namespace's, so the first '.' splits it again.
std::string namespaced_name(const std::string& space, const std::string& name) {
  return space + "." + name;
}

// An item's function as the model is offered it: `name`, under `namespace` when it has one (a
// function_call's, an allowed tool's).
std::string function_name(const ojson& item, const std::string& p) {
  const std::string& name = required_string(item, "name", p);
  const ojson* space = field(item, "namespace");
  if (!space) return name;
  if (!space->is_string()) throw wrong_type(p + ".namespace", "a string", *space);
  return namespaced_name(space->get<std::string>(), name);
}

// Responses input items as chat messages. The items of one assistant turn (reasoning, message,
// function_call) merge into one assistant message, as the chat template reads a turn.
class Conversation {
 public:
  explicit Conversation(ojson earlier) : messages_(std::move(earlier)) {
    for (const auto& m : messages_) {
      for (const auto& call : m.value("tool_calls", ojson::array())) {
        call_ids_.insert(call.value("id", ""));
      }
    }
  }

  void add_item(const ojson& item, const std::string& p) {
    if (!item.is_object()) throw wrong_type(p, "an object", item);
    const ojson* type = field(item, "type");
    if (type && !type->is_string()) throw wrong_type(p + ".type", "a string", *type);
    const std::string kind = type ? type->get<std::string>() : "message";
    if (kind == "message") {
      add_message(item, p);
    } else if (kind == "function_call") {
      const std::string& call_id = required_string(item, "call_id", p);
      // A call to a namespace's function names it as the model saw it (chat_tools).
      const std::string name = function_name(item, p);
      const std::string& arguments = required_string(item, "arguments", p);
      ojson& turn = assistant_turn();
      if (!turn.contains("tool_calls")) turn["tool_calls"] = ojson::array();
      turn["tool_calls"].push_back(
          {{"id", call_id},
           {"type", "function"},
           {"function",
            {{"name", name}, {"arguments", parse_arguments(arguments, p + ".arguments")}}}});
      call_ids_.insert(call_id);
    } else if (kind == "function_call_output") {
      const std::string& call_id = required_string(item, "call_id", p);
      if (!call_ids_.count(call_id)) {
        throw invalid(p + ".call_id", "names no earlier function_call: \"" + call_id + "\"");
      }
      const ojson* output = field(item, "output");
      if (!output) throw missing(p + ".output");
      messages_.push_back({{"role", "tool"},
                           {"tool_call_id", call_id},
                           {"content", content_text(*output, p + ".output")}});
    } else if (kind == "reasoning") {
      std::string text;
      if (const ojson* content = field(item, "content")) {
        if (!content->is_array()) throw wrong_type(p + ".content", "an array", *content);
        for (size_t i = 0; i < content->size(); ++i) {
          const ojson& part = (*content)[i];
          if (!part.is_object()) throw wrong_type(at_index(p + ".content", i), "an object", part);
          text += required_string(part, "text", at_index(p + ".content", i));
        }
      } else if (const ojson* sealed = field(item, "encrypted_content")) {
        // This server's own encrypted_content is the reasoning text itself (see the renderer).
        if (!sealed->is_string()) throw wrong_type(p + ".encrypted_content", "a string", *sealed);
        text = sealed->get<std::string>();
      }
      if (!text.empty()) {
        ojson& turn = assistant_turn();
        turn["reasoning_content"] = turn.value("reasoning_content", "") + text;
      }
    } else {
      throw unsupported(p + ".type",
                        "must be \"message\", \"function_call\", "
                        "\"function_call_output\" or \"reasoning\", got \"" +
                            kind + "\"");
    }
  }

  ojson take() { return std::move(messages_); }
  // The fields (data, media type) of this request's image and audio parts, in order.
  const std::vector<std::pair<std::string, std::string>>& media_params() const {
    return media_params_;
  }

 private:
  void add_message(const ojson& item, const std::string& p) {
    const std::string& role = required_string(item, "role", p);
    if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
      throw invalid(p + ".role",
                    "must be \"user\", \"system\", \"developer\" or \"assistant\", "
                    "got \"" +
                        role + "\"");
    }
    const ojson* content = field(item, "content");
    if (!content) throw missing(p + ".content");
    if (role == "assistant") {
      std::string text = content_text(*content, p + ".content");
      ojson& turn = assistant_turn();
      const std::string before =
          turn["content"].is_string() ? turn["content"].get<std::string>() : "";
      turn["content"] = before + text;
    } else {
      messages_.push_back(
          {{"role", role},
           {"content", chat_content(*content, p + ".content", role == "user", media_params_)}});
    }
  }

  // The assistant message this item belongs to: the last message if it is an assistant's (and
  // no tool result or user turn came after it), else a new one.
  ojson& assistant_turn() {
    if (messages_.empty() || messages_.back()["role"] != "assistant") {
      messages_.push_back({{"role", "assistant"}, {"content", nullptr}});
    }
    return messages_.back();
  }

  ojson messages_;
  std::set<std::string> call_ids_;
  std::vector<std::pair<std::string, std::string>> media_params_;
};

// A Responses function tool at `p` in chat's shape, offered to the model as `name`.
ojson chat_function(const ojson& tool, const std::string& p, const std::string& name) {
  ojson function = {{"name", name}};
  if (const ojson* description = field(tool, "description")) {
    if (!description->is_string()) throw wrong_type(p + ".description", "a string", *description);
    function["description"] = *description;
  }
  if (const ojson* parameters = field(tool, "parameters")) {
    if (!parameters->is_object()) throw wrong_type(p + ".parameters", "an object", *parameters);
    function["parameters"] = *parameters;
  }
  if (const ojson* strict = field(tool, "strict")) {
    if (!strict->is_boolean()) throw wrong_type(p + ".strict", "a boolean", *strict);
    function["strict"] = *strict;
  }
  return {{"type", "function"}, {"function", std::move(function)}};
}

// Responses' tools in chat's shape. The function tools of a namespace (Codex sends its sub-agent
// tools so, and MCP servers' tools come so) are offered under namespaced_name; `namespaced` gets
// those names, so that calls to them go out again with their namespace. Built-in tools
// (web_search, …) and a namespace's custom tools: this server runs none of them, so the model is
// not offered them, and the request goes on with its function tools (a tool_choice that forces
// one is still refused). Codex sends both with every request.
ojson chat_tools(const ojson& tools, std::set<std::string>& namespaced) {
  if (!tools.is_array()) throw wrong_type("tools", "an array", tools);
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& tool = tools[i];
    const std::string p = at_index("tools", i);
    if (!tool.is_object()) throw wrong_type(p, "an object", tool);
    const std::string& type = required_string(tool, "type", p);
    if (type == "function") {
      out.push_back(chat_function(tool, p, required_string(tool, "name", p)));
      continue;
    }
    if (type != "namespace") continue;
    const std::string& space = required_string(tool, "name", p);
    if (space.find('.') != std::string::npos) {
      throw invalid(p + ".name", "must not hold '.', got \"" + space + "\"");
    }
    const ojson* members = field(tool, "tools");
    if (!members) throw missing(p + ".tools");
    if (!members->is_array()) throw wrong_type(p + ".tools", "an array", *members);
    for (size_t j = 0; j < members->size(); ++j) {
      const ojson& member = (*members)[j];
      const std::string q = at_index(p + ".tools", j);
      if (!member.is_object()) throw wrong_type(q, "an object", member);
      if (required_string(member, "type", q) != "function") continue;
      const std::string name = namespaced_name(space, required_string(member, "name", q));
      out.push_back(chat_function(member, q, name));
      namespaced.insert(name);
    }
  }
  return out;
}

// 400 naming `param` unless `tools` (in chat's shape) declares the function `name`.
void check_declared(const std::string& name, const ojson& tools, const std::string& param) {
  if (!declares_function(tools, name)) {
    throw invalid(param, "names the function '" + name + "', which is not in 'tools'");
  }
}

// Responses' {"type": "allowed_tools", "mode", "tools": [{"type": "function", "name",
// "namespace"?}, ...]} in chat's shape. Its other entries name built-in tools, which the model is
// not offered (see chat_tools): allowing only those leaves no call to make, "none" unless a call is
// required.
ojson chat_allowed_tools(const ojson& choice, const ojson& tools) {
  const std::string& mode = required_string(choice, "mode", "tool_choice");
  check_one_of(mode, "tool_choice.mode", {"auto", "required"});
  const ojson* list = field(choice, "tools");
  if (!list) throw missing("tool_choice.tools");
  if (!list->is_array() || list->empty()) {
    throw wrong_type("tool_choice.tools", "a non-empty array", *list);
  }
  ojson functions = ojson::array();
  for (size_t i = 0; i < list->size(); ++i) {
    const ojson& entry = (*list)[i];
    const std::string p = at_index("tool_choice.tools", i);
    if (!entry.is_object()) throw wrong_type(p, "an object", entry);
    if (required_string(entry, "type", p) != "function") continue;
    const std::string name = function_name(entry, p);
    check_declared(name, tools, p + ".name");
    functions.push_back({{"type", "function"}, {"function", {{"name", name}}}});
  }
  if (functions.empty()) {
    if (mode == "auto") return "none";
    throw unsupported("tool_choice.tools",
                      "allows no function, and this server runs no built-in tools: mode "
                      "\"required\" has no call to make");
  }
  return {{"type", "allowed_tools"}, {"allowed_tools", {{"mode", mode}, {"tools", functions}}}};
}

// Responses' tool_choice in chat's shape: the strings as they are, {"type":"function","name"}
// as {"type":"function","function":{"name"}}, allowed_tools as chat_allowed_tools writes it.
ojson chat_tool_choice(const ojson& choice, const ojson& tools) {
  if (choice.is_string()) {
    if (choice != "auto" && choice != "none" && choice != "required") {
      throw invalid("tool_choice",
                    "must be \"auto\", \"none\", \"required\" or "
                    "{\"type\":\"function\",\"name\":...}, got " +
                        choice.dump());
    }
    return choice;
  }
  if (!choice.is_object()) throw wrong_type("tool_choice", "a string or an object", choice);
  const std::string& type = required_string(choice, "type", "tool_choice");
  if (type == "allowed_tools") return chat_allowed_tools(choice, tools);
  if (type != "function") {
    throw unsupported("tool_choice.type",
                      "must be \"function\" or \"allowed_tools\" (this server runs no built-in "
                      "tools), got \"" +
                          type + "\"");
  }
  const std::string& name = required_string(choice, "name", "tool_choice");
  check_declared(name, tools, "tool_choice.name");
  return {{"type", "function"}, {"function", {{"name", name}}}};
}

// Fields the Responses API has and this server cannot honour: refused rather than ignored.
void refuse_unsupported(const ojson& body) {
  for (const char* name : {"background", "conversation", "prompt", "max_tool_calls"}) {
    const ojson* v = field(body, name);
    if (v && *v != false) {
      throw unsupported(name, "is not supported by this server");
    }
  }
  if (const ojson* include = field(body, "include")) {
    if (!include->is_array()) throw wrong_type("include", "an array", *include);
    for (size_t i = 0; i < include->size(); ++i) {
      if ((*include)[i] != "reasoning.encrypted_content" &&
          (*include)[i] != "message.output_text.logprobs") {
        throw unsupported(at_index("include", i),
                          "must be \"reasoning.encrypted_content\" or "
                          "\"message.output_text.logprobs\", the inclusions this server "
                          "offers, got " +
                              (*include)[i].dump());
      }
    }
  }
}

// text.format in the shape of chat's response_format, whose parser (and the grammar it
// compiles) then enforces it: a json_schema format's name, schema, strict and description sit
// beside its type here, inside json_schema there. Null for plain text.
ojson chat_response_format(const ojson& body) {
  const ojson* text = field(body, "text");
  if (!text) return nullptr;
  if (!text->is_object()) throw wrong_type("text", "an object", *text);
  const ojson* format = field(*text, "format");
  if (!format) return nullptr;
  if (!format->is_object()) throw wrong_type("text.format", "an object", *format);
  const std::string& type = required_string(*format, "type", "text.format");
  if (type != "json_schema") return *format;
  // The Responses API requires the schema that Chat Completions makes optional.
  if (!field(*format, "schema")) throw missing("text.format.schema");
  ojson spec = ojson::object();
  for (const auto& [key, value] : format->items()) {
    if (key != "type") spec[key] = value;
  }
  return {{"type", "json_schema"}, {"json_schema", std::move(spec)}};
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ojson or_null(const ojson* v) { return v ? *v : ojson(nullptr); }

// body.text.`name`, or null when either is absent (chat_response_format checks that text is an
// object).
const ojson* text_field(const ojson& body, const char* name) {
  const ojson* text = field(body, "text");
  return text && text->is_object() ? field(*text, name) : nullptr;
}

// OpenAI's bounds on metadata: at most 16 pairs, keys of at most 64 characters, string values of
// at most 512.
void check_metadata(const ojson& metadata) {
  if (!metadata.is_object()) throw wrong_type("metadata", "an object", metadata);
  if (metadata.size() > 16) {
    throw invalid("metadata", "may hold at most 16 pairs, got " + std::to_string(metadata.size()));
  }
  for (const auto& [key, value] : metadata.items()) {
    if (utf8_characters(key) > 64) {
      throw invalid("metadata", "keys may be at most 64 characters long, got \"" + key + "\"");
    }
    if (!value.is_string()) throw wrong_type("metadata." + key, "a string", value);
    if (utf8_characters(value.get_ref<const std::string&>()) > 512) {
      throw invalid("metadata." + key, "may be at most 512 characters long");
    }
  }
}

// An input item (already checked by Conversation) as input_items lists it: a message in its full
// form (type, content as parts) and every item with an id, its own or a new one.
ojson input_item(const ojson& given) {
  ojson item = given;
  if (!item.contains("type")) item["type"] = "message";
  if (item["type"] == "message" && item["content"].is_string()) {
    const bool assistant = item["role"] == "assistant";
    item["content"] = ojson::array(
        {{{"type", assistant ? "output_text" : "input_text"}, {"text", item["content"]}}});
  }
  if (!item.contains("id")) {
    const std::string& type = item["type"].get_ref<const std::string&>();
    item["id"] = new_completion_id(type == "message"         ? "msg_"
                                   : type == "function_call" ? "fc_"
                                   : type == "reasoning"     ? "rs_"
                                                             : "fco_");
  }
  return item;
}

}  // namespace

ApiError as_responses_error(const ApiError& error) {
  return renamed(
      error, {{"response_format.json_schema", "text.format"}, {"response_format", "text.format"}});
}

ResponseStore::ResponseStore(size_t capacity) : capacity_(capacity) {}

void ResponseStore::put(const std::string& id, StoredResponse entry) {
  std::lock_guard lock(mutex_);
  if (auto it = slots_.find(id); it != slots_.end()) {
    order_.erase(it->second.position);
    slots_.erase(it);
  }
  order_.push_front(id);
  slots_.emplace(id, Slot{std::move(entry), order_.begin()});
  while (slots_.size() > capacity_) {
    slots_.erase(order_.back());
    order_.pop_back();
  }
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second.position);
  return it->second.entry;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = slots_.find(id);
  if (it == slots_.end()) return false;
  order_.erase(it->second.position);
  slots_.erase(it);
  return true;
}

ojson input_items_page(const ojson& items, const std::multimap<std::string, std::string>& query) {
  int64_t limit = 20;
  bool ascending = false;
  std::string after;
  for (const auto& [key, value] : query) {
    if (key == "limit") {
      int64_t n = 0;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (error != std::errc() || end != value.data() + value.size() || n < 1 || n > 100) {
        throw invalid("limit", "must be an integer from 1 to 100, got \"" + value + "\"");
      }
      limit = n;
    } else if (key == "order") {
      if (value != "asc" && value != "desc") {
        throw invalid("order", "must be \"asc\" or \"desc\", got \"" + value + "\"");
      }
      ascending = value == "asc";
    } else if (key == "after") {
      after = value;
    } else {
      throw unsupported(key, "is not a parameter of this list (limit, order and after are)");
    }
  }
  std::vector<const ojson*> ordered;
  for (const auto& item : items) ordered.push_back(&item);
  if (!ascending) std::reverse(ordered.begin(), ordered.end());
  size_t from = 0;
  if (!after.empty()) {
    while (from < ordered.size() && (*ordered[from])["id"] != after) ++from;
    if (from == ordered.size()) {
      throw invalid("after", "names no input item of this response: \"" + after + "\"");
    }
    ++from;
  }
  ojson data = ojson::array();
  for (size_t i = from; i < ordered.size() && static_cast<int64_t>(data.size()) < limit; ++i) {
    data.push_back(*ordered[i]);
  }
  const bool more = from + data.size() < ordered.size();
  return {{"object", "list"},
          {"data", data},
          {"first_id", data.empty() ? ojson(nullptr) : data.front()["id"]},
          {"last_id", data.empty() ? ojson(nullptr) : data.back()["id"]},
          {"has_more", more}};
}

ResponsesRequest parse_responses_request(const ojson& body, ResponseStore& store) {
  ResponsesRequest out;
  refuse_unsupported(body);

  ojson earlier = ojson::array();
  out.input_items = ojson::array();
  const ojson* previous = field(body, "previous_response_id");
  if (previous) {
    if (!previous->is_string()) throw wrong_type("previous_response_id", "a string", *previous);
    auto stored = store.get(previous->get<std::string>());
    if (!stored) {
      throw ApiError(404,
                     "previous response '" + previous->get<std::string>() +
                         "' is not stored on this server: responses made with store: false are "
                         "not kept, the store holds the most recently used responses only, and "
                         "it is lost when the server restarts",
                     "invalid_request_error", "previous_response_id",
                     "previous_response_not_found");
    }
    earlier = std::move(stored->conversation);
    out.input_items = std::move(stored->input_items);
    for (const auto& item : stored->response["output"]) out.input_items.push_back(item);
  }
  Conversation conversation(std::move(earlier));
  const ojson* input = field(body, "input");
  if (!input) throw missing("input");
  if (input->is_string()) {
    const ojson item = {{"role", "user"}, {"content", *input}};
    conversation.add_item(item, "input");
    out.input_items.push_back(input_item(item));
  } else if (input->is_array()) {
    if (input->empty()) throw invalid("input", "must hold at least one item");
    for (size_t i = 0; i < input->size(); ++i) {
      conversation.add_item((*input)[i], at_index("input", i));
      out.input_items.push_back(input_item((*input)[i]));
    }
  } else {
    throw wrong_type("input", "a string or an array of items", *input);
  }
  out.conversation = conversation.take();
  const auto media_params = conversation.media_params();

  ojson chat = {{"messages", ojson::array()}};
  const ojson* instructions = field(body, "instructions");
  if (instructions) {
    if (!instructions->is_string()) throw wrong_type("instructions", "a string", *instructions);
    chat["messages"].push_back({{"role", "system"}, {"content", *instructions}});
  }
  for (const auto& m : out.conversation) chat["messages"].push_back(m);

  ojson tools = ojson::array();
  if (const ojson* t = field(body, "tools")) tools = chat_tools(*t, out.namespaced);
  if (!tools.empty()) chat["tools"] = tools;
  if (const ojson* choice = field(body, "tool_choice")) {
    chat["tool_choice"] = chat_tool_choice(*choice, tools);
  }
  if (const ojson* n = field(body, "max_output_tokens")) {
    if (!n->is_number_integer()) throw wrong_type("max_output_tokens", "an integer", *n);
    if (*n < 1) throw invalid("max_output_tokens", "must be at least 1, got " + n->dump());
    chat["max_completion_tokens"] = *n;
  }
  const ojson* reasoning = field(body, "reasoning");
  ojson effort = nullptr;
  if (reasoning) {
    if (!reasoning->is_object()) throw wrong_type("reasoning", "an object", *reasoning);
    if (const ojson* e = field(*reasoning, "effort")) {
      check_reasoning_effort(*e, "reasoning.effort");
      effort = *e;
      chat["reasoning_effort"] = *e;
    }
  }
  for (const char* name : {"model", "temperature", "top_p", "stream", "cache_salt", "id_slot", "lora"}) {
    if (const ojson* v = field(body, name)) chat[name] = *v;
  }
  if (const ojson* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) throw wrong_type("parallel_tool_calls", "a boolean", *p);
    out.one_call = !p->get<bool>();
  }
  if (const ojson* s = field(body, "store")) {
    if (!s->is_boolean()) throw wrong_type("store", "a boolean", *s);
    out.store = s->get<bool>();
  }
  const ojson* metadata = field(body, "metadata");
  if (metadata) check_metadata(*metadata);
  bool logprobs = false;
  if (const ojson* include = field(body, "include")) {
    for (const auto& item : *include) {
      out.sealed_reasoning = out.sealed_reasoning || item == "reasoning.encrypted_content";
      logprobs = logprobs || item == "message.output_text.logprobs";
    }
  }
  // Alternatives (chat's checks: 0 - 20) ask for the logprobs too.
  if (const ojson* n = field(body, "top_logprobs")) {
    logprobs = logprobs || *n != 0;
    if (logprobs) chat["top_logprobs"] = *n;
  }
  if (logprobs) chat["logprobs"] = true;

  const ojson response_format = chat_response_format(body);
  if (!response_format.is_null()) chat["response_format"] = response_format;
  try {
    out.generation = parse_chat_request(chat);
  } catch (const ApiError& e) {
    throw as_responses_error(e);
  }
  // Chat named the parts by their place in its messages; name them by the request's fields, and
  // those of earlier turns by the field that brought them back.
  std::vector<MediaSource>& media = out.generation.media;
  const size_t earlier_media = media.size() - media_params.size();
  for (size_t i = 0; i < media.size(); ++i) {
    if (i < earlier_media) {
      media[i].param = media[i].mime_param = "previous_response_id";
    } else {
      std::tie(media[i].param, media[i].mime_param) = media_params[i - earlier_media];
    }
  }
  out.generation.parallel_tool_calls = !out.one_call;
  const ojson* choice = field(body, "tool_choice");
  // Fields that change nothing here and that the response repeats, checked as OpenAI checks them.
  const auto one_of = [](const ojson* v, const std::string& p,
                         std::initializer_list<const char*> allowed) {
    if (v && !v->is_null()) check_one_of(*v, p, allowed);
  };
  const ojson* verbosity = text_field(body, "verbosity");
  one_of(verbosity, "text.verbosity", {"low", "medium", "high"});
  const ojson* summary = reasoning ? field(*reasoning, "summary") : nullptr;
  one_of(summary, "reasoning.summary", {"auto", "concise", "detailed"});
  one_of(field(body, "service_tier"), "service_tier",
         {"auto", "default", "flex", "scale", "priority"});
  const ojson* truncation = field(body, "truncation");
  one_of(truncation, "truncation", {"auto", "disabled"});
  out.generation.drop_old_turns = truncation && *truncation == "auto";
  for (const char* name : {"user", "safety_identifier", "prompt_cache_key"}) {
    const ojson* v = field(body, name);
    if (v && !v->is_string() && !v->is_null()) throw wrong_type(name, "a string", *v);
  }
  out.echo = {{"instructions", or_null(instructions)},
              {"max_output_tokens", or_null(field(body, "max_output_tokens"))},
              {"metadata", metadata ? *metadata : ojson::object()},
              {"parallel_tool_calls", !out.one_call},
              {"previous_response_id", or_null(previous)},
              {"prompt_cache_key", or_null(field(body, "prompt_cache_key"))},
              {"reasoning", {{"effort", effort}, {"summary", or_null(summary)}}},
              {"safety_identifier", or_null(field(body, "safety_identifier"))},
              {"service_tier", "default"},
              {"store", out.store},
              {"temperature", or_null(field(body, "temperature"))},
              {"text",
               {{"format", response_format.is_null() ? ojson{{"type", "text"}}
                                                     : (*field(body, "text"))["format"]},
                {"verbosity", verbosity && !verbosity->is_null() ? *verbosity : ojson("medium")}}},
              {"tool_choice", choice ? *choice : ojson("auto")},
              {"tools", field(body, "tools") ? *field(body, "tools") : ojson::array()},
              {"top_p", or_null(field(body, "top_p"))},
              {"truncation", truncation ? *truncation : ojson("disabled")},
              {"user", or_null(field(body, "user"))}};
  return out;
}

ResponsesRenderer::ResponsesRenderer(std::string model, const ResponsesRequest& request,
                                     ResponseStore* store)
    : conversation_(request.conversation),
      input_items_(request.input_items),
      store_(request.store ? store : nullptr),
      sealed_reasoning_(request.sealed_reasoning),
      namespaced_(request.namespaced) {
  response_ = {
      {"id", new_completion_id("resp_")}, {"object", "response"},   {"created_at", unix_seconds()},
      {"status", "in_progress"},          {"background", false},    {"error", nullptr},
      {"incomplete_details", nullptr},    {"completed_at", nullptr}};
  for (const auto& [key, value] : request.echo.items()) {
    response_[key] = value;
  }
  response_["model"] = std::move(model);
  response_["output"] = ojson::array();
  response_["usage"] = nullptr;
  assistant_ = {{"role", "assistant"}, {"content", nullptr}};
}

std::string ResponsesRenderer::event(const std::string& type, ojson data) {
  ojson e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : data.items()) e[key] = std::move(value);
  return sse_event(type, e);
}

std::string ResponsesRenderer::start() {
  std::string out = event("response.created", {{"response", response_}});
  return out + event("response.in_progress", {{"response", response_}});
}

std::string ResponsesRenderer::open(Open kind) {
  if (open_ == kind) return "";
  std::string out = close();
  open_ = kind;
  item_id_ = new_completion_id(kind == Open::kReasoning ? "rs_" : "msg_");
  const size_t index = response_["output"].size();
  ojson item, part;
  if (kind == Open::kReasoning) {
    item = {{"id", item_id_},
            {"type", "reasoning"},
            {"summary", ojson::array()},
            {"content", ojson::array()}};
    part = {{"type", "reasoning_text"}, {"text", ""}};
  } else {
    item = {{"id", item_id_},
            {"type", "message"},
            {"status", "in_progress"},
            {"role", "assistant"},
            {"content", ojson::array()}};
    part = {{"type", "output_text"},
            {"annotations", ojson::array()},
            {"logprobs", ojson::array()},
            {"text", ""}};
  }
  out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
  out +=
      event("response.content_part.added",
            {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  return out;
}

std::string ResponsesRenderer::close(const char* status) {
  if (open_ == Open::kNone) return "";
  const size_t index = response_["output"].size();
  const bool reasoning = open_ == Open::kReasoning;
  ojson part, item;
  std::string out;
  if (reasoning) {
    part = {{"type", "reasoning_text"}, {"text", text_}};
    item = {{"id", item_id_},
            {"type", "reasoning"},
            {"summary", ojson::array()},
            {"content", ojson::array({part})}};
    // Clients that keep no state (store: false) send reasoning back as this opaque field. It is
    // the text itself: nothing here is secret from the client that received it.
    if (sealed_reasoning_) item["encrypted_content"] = text_;
    out += event(
        "response.reasoning_text.done",
        {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    assistant_["reasoning_content"] = assistant_.value("reasoning_content", "") + text_;
  } else {
    part = {{"type", "output_text"},
            {"annotations", ojson::array()},
            {"logprobs", text_logprobs_},
            {"text", text_}};
    item = {{"id", item_id_},
            {"type", "message"},
            {"status", status},
            {"role", "assistant"},
            {"content", ojson::array({part})}};
    out += event("response.output_text.done",
                 {{"item_id", item_id_},
                  {"output_index", index},
                  {"content_index", 0},
                  {"text", text_},
                  {"logprobs", std::exchange(text_logprobs_, ojson::array())}});
    assistant_["content"] =
        (assistant_["content"].is_string() ? assistant_["content"].get<std::string>() : "") + text_;
  }
  out +=
      event("response.content_part.done",
            {{"item_id", item_id_}, {"output_index", index}, {"content_index", 0}, {"part", part}});
  out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
  response_["output"].push_back(std::move(item));
  open_ = Open::kNone;
  text_.clear();
  return out;
}

void ResponsesRenderer::logprobs(const ojson& entries) {
  for (const auto& entry : entries) logprobs_.push_back(entry);
}

std::string ResponsesRenderer::add(const OutputDelta& delta) {
  std::string out;
  // The output text's logprobs are those of the tokens since the last reasoning or call: the
  // text's own, and the markers or held-back text between (one piece of both reasoning and
  // text, as a read of several tokens can make, gives all of its tokens to the text).
  ojson logprobs;
  if (!delta.content.empty()) {
    logprobs = std::exchange(logprobs_, ojson::array());
  } else if (!delta.reasoning.empty() || !delta.tool_calls.empty()) {
    logprobs_ = ojson::array();
  }
  if (!delta.reasoning.empty()) {
    out += open(Open::kReasoning);
    text_ += delta.reasoning;
    out += event("response.reasoning_text.delta", {{"item_id", item_id_},
                                                   {"output_index", response_["output"].size()},
                                                   {"content_index", 0},
                                                   {"delta", delta.reasoning}});
  }
  if (!delta.content.empty()) {
    out += open(Open::kMessage);
    text_ += delta.content;
    for (const auto& entry : logprobs) text_logprobs_.push_back(entry);
    out += event("response.output_text.delta", {{"item_id", item_id_},
                                                {"output_index", response_["output"].size()},
                                                {"content_index", 0},
                                                {"delta", delta.content},
                                                {"logprobs", std::move(logprobs)}});
  }
  for (const auto& call : delta.tool_calls) {
    out += close();
    const size_t index = response_["output"].size();
    const std::string id = new_completion_id("fc_");
    const std::string call_id = new_completion_id("call_");
    const std::string arguments = call.arguments.dump();
    ojson item = {{"id", id},        {"type", "function_call"}, {"status", "in_progress"},
                  {"arguments", ""}, {"call_id", call_id},      {"name", call.name}};
    if (namespaced_.count(call.name) > 0) {  // namespaced_name's split
      const size_t dot = call.name.find('.');
      item["namespace"] = call.name.substr(0, dot);
      item["name"] = call.name.substr(dot + 1);
    }
    out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    out += event("response.function_call_arguments.delta",
                 {{"item_id", id}, {"output_index", index}, {"delta", arguments}});
    out += event("response.function_call_arguments.done", {{"item_id", id},
                                                           {"output_index", index},
                                                           {"arguments", arguments},
                                                           {"name", item["name"]}});
    item["status"] = "completed";
    item["arguments"] = arguments;
    out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
    response_["output"].push_back(std::move(item));
    if (!assistant_.contains("tool_calls")) assistant_["tool_calls"] = ojson::array();
    assistant_["tool_calls"].push_back(
        {{"id", call_id},
         {"type", "function"},
         {"function", {{"name", call.name}, {"arguments", ojson(call.arguments)}}}});
  }
  return out;
}

std::string ResponsesRenderer::finish(const GenerationOutcome& outcome) {
  const bool cut = outcome.finish == "length";
  // A message cut off by max_output_tokens is incomplete, as OpenAI marks it.
  std::string out = close(cut ? "incomplete" : "completed");
  response_["status"] = cut ? "incomplete" : "completed";
  response_["completed_at"] = cut ? ojson(nullptr) : ojson(unix_seconds());
  if (cut) response_["incomplete_details"] = {{"reason", "max_output_tokens"}};
  response_["usage"] = {{"input_tokens", outcome.prompt_tokens},
                        {"input_tokens_details", {{"cached_tokens", outcome.cached_tokens}}},
                        {"output_tokens", outcome.completion_tokens},
                        {"output_tokens_details", {{"reasoning_tokens", outcome.reasoning_tokens}}},
                        {"total_tokens", outcome.prompt_tokens + outcome.completion_tokens}};
  out += event(cut ? "response.incomplete" : "response.completed", {{"response", response_}});
  if (store_) {
    ojson conversation = conversation_;
    conversation.push_back(assistant_);
    store_->put(response_["id"].get<std::string>(),
                {response_, std::move(conversation), input_items_});
  }
  return out;
}

std::string ResponsesRenderer::error(const ApiError& error) {
  response_["status"] = "failed";
  response_["error"] = {{"code", error.code.empty() ? "server_error" : error.code},
                        {"message", error.what()}};
  return event("error", {{"code", error.code.empty() ? ojson(nullptr) : ojson(error.code)},
                         {"message", error.what()},
                         {"param", error.param.empty() ? ojson(nullptr) : ojson(error.param)}});
}

}  // namespace torchtpu::server
