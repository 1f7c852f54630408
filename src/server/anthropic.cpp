#include "server/anthropic.h"

#include <set>
#include <tuple>

namespace torchtpu::server {
namespace {

// Anthropic names a field inside arrays as "messages.1.content.0".
std::string at(const std::string& param, size_t i) { return param + "." + std::to_string(i); }

std::optional<double> number(const ojson& body, const char* name, double lo, double hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (x < lo || x > hi) {
    throw invalid(name, "must be between " + ojson(lo).dump() + " and " + ojson(hi).dump() +
                            ", got " + v->dump());
  }
  return x;
}

// Text blocks ({"type":"text","text"}) or a string, as system prompts and tool results hold.
std::string text_of(const ojson& content, const std::string& param) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(param, "a string or an array of text blocks", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const ojson& block = content[i];
    const std::string p = at(param, i);
    if (!block.is_object()) throw wrong_type(p, "an object", block);
    const std::string& type = required_string(block, "type", p);
    if (type != "text") {
      throw unsupported(p + ".type",
                        "must be \"text\": this field holds text only (images and audio go in a "
                        "user message's own content), got \"" +
                            type + "\"");
    }
    text += required_string(block, "text", p);
  }
  return text;
}

// An image block's source ({"type":"base64","media_type","data"} or {"type":"url","url"}) as
// chat's image_url URL, with the fields that name its data and media type.
std::string image_url(const ojson& block, const std::string& b,
                      std::vector<std::pair<std::string, std::string>>& media_params) {
  const ojson* source = field(block, "source");
  if (!source) throw missing(b + ".source");
  if (!source->is_object()) throw wrong_type(b + ".source", "an object", *source);
  const std::string& type = required_string(*source, "type", b + ".source");
  std::string url;
  if (type == "base64") {
    const std::string& media_type = required_string(*source, "media_type", b + ".source");
    if (media_type.empty()) throw invalid(b + ".source.media_type", "is empty");
    url = "data:" + media_type + ";base64," + required_string(*source, "data", b + ".source");
    image_from_url(url, b + ".source.data", 0);
    media_params.emplace_back(b + ".source.data", b + ".source.media_type");
  } else if (type == "url") {
    url = required_string(*source, "url", b + ".source");
    image_from_url(url, b + ".source.url", 0);
    media_params.emplace_back(b + ".source.url", b + ".source.url");
  } else {
    throw unsupported(
        b + ".source.type",
        "must be \"base64\" or \"url\": this server stores no files, got \"" + type + "\"");
  }
  return url;
}

// Anthropic's messages as chat messages: tool_use blocks become an assistant's tool_calls,
// thinking blocks its reasoning_content, tool_result blocks tool messages, image blocks chat's
// image_url parts (their fields appended to `media_params`, in order).
ojson chat_messages(const ojson& messages,
                    std::vector<std::pair<std::string, std::string>>& media_params) {
  if (!messages.is_array()) throw wrong_type("messages", "an array", messages);
  if (messages.empty()) throw invalid("messages", "must hold at least one message");
  ojson out = ojson::array();
  std::set<std::string> tool_use_ids;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string p = at("messages", i);
    if (!m.is_object()) throw wrong_type(p, "an object", m);
    const std::string& role = required_string(m, "role", p);
    if (role != "user" && role != "assistant" && role != "system") {
      throw invalid(p + ".role",
                    "must be \"user\", \"assistant\" or \"system\", got \"" + role + "\"");
    }
    const ojson* content = field(m, "content");
    if (!content) throw missing(p + ".content");
    // A system message among the others (Claude Code sends one) holds from its place on: the
    // template renders a system turn there.
    if (role == "system") {
      out.push_back({{"role", "system"}, {"content", text_of(*content, p + ".content")}});
      continue;
    }
    if (content->is_string()) {
      out.push_back({{"role", role}, {"content", *content}});
      continue;
    }
    if (!content->is_array()) {
      throw wrong_type(p + ".content", "a string or an array of content blocks", *content);
    }
    if (content->empty()) throw invalid(p + ".content", "must hold at least one content block");
    ojson turn = {{"role", role}, {"content", ""}};
    ojson parts = ojson::array();
    bool has_text = false;
    bool has_media = false;
    for (size_t j = 0; j < content->size(); ++j) {
      const ojson& block = (*content)[j];
      const std::string b = at(p + ".content", j);
      if (!block.is_object()) throw wrong_type(b, "an object", block);
      const std::string& type = required_string(block, "type", b);
      const auto add_text = [&](const std::string& text) {
        turn["content"] = turn["content"].get<std::string>() + text;
        parts.push_back({{"type", "text"}, {"text", text}});
        has_text = true;
      };
      if (type == "text") {
        add_text(required_string(block, "text", b));
      } else if (type == "document" && role == "user") {
        // A plain-text document is read as its text, after its title; a PDF or a URL needs a
        // reader this server does not have.
        const ojson* source = field(block, "source");
        if (!source) throw missing(b + ".source");
        if (!source->is_object()) throw wrong_type(b + ".source", "an object", *source);
        const std::string& kind = required_string(*source, "type", b + ".source");
        if (kind != "text") {
          throw unsupported(
              b + ".source.type",
              "must be \"text\": this server reads plain-text documents only, got \"" + kind +
                  "\"");
        }
        const ojson* title = field(block, "title");
        if (title && !title->is_string()) throw wrong_type(b + ".title", "a string", *title);
        add_text((title ? title->get<std::string>() + "\n\n" : "") +
                 required_string(*source, "data", b + ".source"));
      } else if (type == "image" && role == "user") {
        parts.push_back(
            {{"type", "image_url"}, {"image_url", {{"url", image_url(block, b, media_params)}}}});
        has_media = true;
      } else if (type == "tool_use" && role == "assistant") {
        const std::string& id = required_string(block, "id", b);
        const std::string& name = required_string(block, "name", b);
        const ojson* input = field(block, "input");
        if (!input) throw missing(b + ".input");
        if (!input->is_object()) throw wrong_type(b + ".input", "an object", *input);
        if (!turn.contains("tool_calls")) turn["tool_calls"] = ojson::array();
        turn["tool_calls"].push_back({{"id", id},
                                      {"type", "function"},
                                      {"function", {{"name", name}, {"arguments", *input}}}});
        tool_use_ids.insert(id);
      } else if (type == "thinking" && role == "assistant") {
        turn["reasoning_content"] =
            turn.value("reasoning_content", "") + required_string(block, "thinking", b);
      } else if (type == "redacted_thinking" && role == "assistant") {
        // A thought Anthropic's API returned encrypted: nothing this model can read, so it is
        // dropped, as a thinking block's signature is (a conversation begun there goes on here).
        required_string(block, "data", b);
      } else if (type == "tool_result" && role == "user") {
        const std::string& id = required_string(block, "tool_use_id", b);
        if (!tool_use_ids.count(id)) {
          throw invalid(b + ".tool_use_id", "names no earlier tool_use block: \"" + id + "\"");
        }
        std::string text;
        if (const ojson* result = field(block, "content")) text = text_of(*result, b + ".content");
        const ojson* is_error = field(block, "is_error");
        if (is_error && !is_error->is_boolean()) {
          throw wrong_type(b + ".is_error", "a boolean", *is_error);
        }
        // The template has no error flag: the model reads it in the result's text.
        if (is_error && *is_error == true) text = "Error: " + text;
        out.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(text)}});
      } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking" ||
                 type == "tool_result" || type == "image" || type == "document") {
        const bool users = type == "tool_result" || type == "image" || type == "document";
        throw invalid(b + ".type", "\"" + type + "\" blocks belong to " +
                                       (users ? "user" : "assistant") + " messages, not " + role +
                                       " ones");
      } else {
        throw unsupported(b + ".type",
                          "must be \"text\", \"image\", \"document\", \"tool_use\", "
                          "\"tool_result\", \"thinking\" or \"redacted_thinking\", got \"" +
                              type + "\"");
      }
    }
    // A user message of tool results only is the tool messages above, with no turn of its own.
    if (has_media) turn["content"] = std::move(parts);
    if (role == "assistant" || has_text || has_media) {
      if (role == "assistant" && !has_text) turn["content"] = nullptr;
      out.push_back(std::move(turn));
    }
  }
  if (messages.back()["role"] == "assistant") {
    throw unsupported(at("messages", messages.size() - 1),
                      "is an assistant message: continuing a partial assistant turn (prefill) is "
                      "not supported; end with a user message");
  }
  return out;
}

ojson chat_tools(const ojson& tools) {
  if (!tools.is_array()) throw wrong_type("tools", "an array", tools);
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& tool = tools[i];
    const std::string p = at("tools", i);
    if (!tool.is_object()) throw wrong_type(p, "an object", tool);
    if (const ojson* type = field(tool, "type"); type && *type != "custom") {
      throw unsupported(p + ".type",
                        "must be \"custom\" (or absent): this server runs no "
                        "server tools, got " +
                            type->dump());
    }
    ojson function = {{"name", required_string(tool, "name", p)}};
    if (const ojson* description = field(tool, "description")) {
      if (!description->is_string()) {
        throw wrong_type(p + ".description", "a string", *description);
      }
      function["description"] = *description;
    }
    const ojson* schema = field(tool, "input_schema");
    if (!schema) throw missing(p + ".input_schema");
    if (!schema->is_object()) throw wrong_type(p + ".input_schema", "an object", *schema);
    function["parameters"] = *schema;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

// Anthropic's tool_choice in chat's shape: auto, any (= required), tool (= a named function),
// none.
ojson chat_tool_choice(const ojson& choice, const ojson& tools, bool& one_call) {
  if (!choice.is_object()) throw wrong_type("tool_choice", "an object", choice);
  const std::string& type = required_string(choice, "type", "tool_choice");
  if (const ojson* d = field(choice, "disable_parallel_tool_use")) {
    if (!d->is_boolean())
      throw wrong_type("tool_choice.disable_parallel_tool_use", "a boolean", *d);
    one_call = d->get<bool>();
  }
  if (type == "auto" || type == "none") return type;
  if (type == "any") return "required";
  if (type == "tool") {
    const std::string& name = required_string(choice, "name", "tool_choice");
    if (!declares_function(tools, name)) {
      throw invalid("tool_choice.name", "names the tool '" + name + "', which is not in 'tools'");
    }
    return {{"type", "function"}, {"function", {{"name", name}}}};
  }
  throw invalid("tool_choice.type",
                "must be \"auto\", \"any\", \"tool\" or \"none\", got \"" + type + "\"");
}

}  // namespace

MessagesRequest parse_messages_request(const ojson& body, bool for_count) {
  MessagesRequest out;
  ojson chat = {{"messages", ojson::array()}};
  if (const ojson* system = field(body, "system")) {
    chat["messages"].push_back({{"role", "system"}, {"content", text_of(*system, "system")}});
  }
  const ojson* messages = field(body, "messages");
  if (!messages) throw missing("messages");
  std::vector<std::pair<std::string, std::string>> media_params;
  for (auto& m : chat_messages(*messages, media_params)) chat["messages"].push_back(std::move(m));

  const ojson* max_tokens = field(body, "max_tokens");
  if (!max_tokens && !for_count) throw missing("max_tokens");
  if (max_tokens) {
    if (!max_tokens->is_number_integer()) throw wrong_type("max_tokens", "an integer", *max_tokens);
    if (*max_tokens < 1)
      throw invalid("max_tokens", "must be at least 1, got " + max_tokens->dump());
    chat["max_completion_tokens"] = *max_tokens;
  }
  ojson tools = ojson::array();
  if (const ojson* t = field(body, "tools")) tools = chat_tools(*t);
  if (!tools.empty()) chat["tools"] = tools;
  if (const ojson* choice = field(body, "tool_choice")) {
    chat["tool_choice"] = chat_tool_choice(*choice, tools, out.one_call);
    if (chat["tool_choice"] != "auto" && chat["tool_choice"] != "none" && tools.empty()) {
      throw invalid("tool_choice", "of type \"" + (*choice)["type"].get<std::string>() +
                                       "\" needs a non-empty 'tools' list");
    }
  }
  if (const ojson* thinking = field(body, "thinking")) {
    if (!thinking->is_object()) throw wrong_type("thinking", "an object", *thinking);
    const std::string& type = required_string(*thinking, "type", "thinking");
    if (type == "enabled") {
      const ojson* budget = field(*thinking, "budget_tokens");
      if (!budget) throw missing("thinking.budget_tokens");
      if (!budget->is_number_integer()) {
        throw wrong_type("thinking.budget_tokens", "an integer", *budget);
      }
      // Anthropic's own limits. The budget counts against max_tokens like any output, and the
      // thinking block is closed for the model once it is spent.
      if (*budget < 1024) {
        throw invalid("thinking.budget_tokens", "must be at least 1024, got " + budget->dump());
      }
      if (max_tokens && *budget >= *max_tokens) {
        throw invalid(
            "thinking.budget_tokens",
            "must be less than max_tokens (" + max_tokens->dump() + "), got " + budget->dump());
      }
      chat["thinking_token_budget"] = *budget;
    } else if (type != "disabled" && type != "adaptive") {
      throw invalid("thinking.type",
                    "must be \"enabled\", \"adaptive\" or \"disabled\", got \"" + type + "\"");
    }
    // adaptive: the model decides when and how much to think, which Gemma does once thinking is on.
    const bool on = type != "disabled";
    if (const ojson* display = field(*thinking, "display"); display && on) {
      if (*display != "summarized" && *display != "omitted") {
        throw invalid("thinking.display",
                      "must be \"summarized\" or \"omitted\", got " + display->dump());
      }
      out.omit_thinking = *display == "omitted";
    }
    // As Anthropic: a forced tool call's prompt opens the call, which leaves no room to think.
    if (on && chat.contains("tool_choice") && chat["tool_choice"] != "auto" &&
        chat["tool_choice"] != "none") {
      throw invalid("thinking", "cannot be enabled when tool_choice forces a tool call (type \"" +
                                    (*field(body, "tool_choice"))["type"].get<std::string>() +
                                    "\"); use tool_choice auto");
    }
    chat["chat_template_kwargs"] = {{"enable_thinking", on}};
  }
  for (const char* name : {"model", "stream", "cache_salt", "id_slot", "lora"}) {
    if (const ojson* v = field(body, name)) chat[name] = *v;
  }
  // Anthropic's ranges, narrower than OpenAI's: checked here so the error says which applies.
  if (auto t = number(body, "temperature", 0, 1)) chat["temperature"] = *t;
  if (auto p = number(body, "top_p", 0, 1)) chat["top_p"] = *p;
  if (const ojson* k = field(body, "top_k")) {
    if (!k->is_number_integer()) throw wrong_type("top_k", "an integer", *k);
    if (*k < 0) throw invalid("top_k", "must be at least 0, got " + k->dump());
    chat["top_k"] = *k;
  }
  std::vector<std::string> stops;
  if (const ojson* s = field(body, "stop_sequences")) {
    if (!s->is_array()) throw wrong_type("stop_sequences", "an array of strings", *s);
    stops = nonempty_strings(*s, [](size_t i) { return at("stop_sequences", i); });
  }
  if (const ojson* metadata = field(body, "metadata"); metadata && !metadata->is_object()) {
    throw wrong_type("metadata", "an object", *metadata);
  }
  if (const ojson* config = field(body, "output_config")) {
    if (!config->is_object()) throw wrong_type("output_config", "an object", *config);
    // Claude Code sends an effort with every request. This model has no such setting (thinking
    // on or off is its one knob, which `thinking` sets): accepted, and it changes nothing.
    if (const ojson* effort = field(*config, "effort"); effort && !effort->is_string()) {
      throw wrong_type("output_config.effort", "a string", *effort);
    }
    if (const ojson* format = field(*config, "format")) {
      if (!format->is_object()) throw wrong_type("output_config.format", "an object", *format);
      const std::string& type = required_string(*format, "type", "output_config.format");
      if (type != "json_schema") {
        throw invalid("output_config.format.type", "must be \"json_schema\", got \"" + type + "\"");
      }
      const ojson* schema = field(*format, "schema");
      if (!schema) throw missing("output_config.format.schema");
      // Chat's response_format, whose parser and grammar enforce it.
      chat["response_format"] = {{"type", "json_schema"},
                                 {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
    }
  }
  try {
    out.generation = parse_chat_request(chat);
  } catch (const ApiError& e) {
    throw as_messages_error(e);
  }
  // Chat named the images by their place in its messages; name them by the request's fields.
  for (size_t i = 0; i < media_params.size(); ++i) {
    std::tie(out.generation.media[i].param, out.generation.media[i].mime_param) = media_params[i];
  }
  out.generation.stop = std::move(stops);
  // A forced call with parallel use disabled is exactly one call in the grammar, not just in the
  // answer: otherwise the model may go on calling until max_tokens.
  out.generation.parallel_tool_calls = !out.one_call;
  return out;
}

ApiError as_messages_error(const ApiError& error) {
  // A tool's schema, chat's tools[N].function.parameters, is Messages' tools.N.input_schema
  // (chat_tools keeps every tool in its place).
  const std::string& param = error.param;
  const size_t close = param.find(']');
  const std::string schema = ".function.parameters";
  if (param.starts_with("tools[") && close != std::string::npos &&
      param.compare(close + 1, schema.size(), schema) == 0) {
    return renamed(error, {{param.substr(0, close + 1 + schema.size()),
                            "tools." + param.substr(6, close - 6) + ".input_schema"}});
  }
  return renamed(error, {{"response_format.json_schema", "output_config.format"},
                         {"response_format", "output_config.format"}});
}

ojson anthropic_error_body(const ApiError& error) {
  const char* type = "api_error";
  switch (error.status) {
    case 400:
    case 405:
    case 408:
    case 414:
    case 415:
    case 431: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503: type = "overloaded_error"; break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", error.what()}}}};
}

MessagesRenderer::MessagesRenderer(std::string model, int64_t prompt_tokens,
                                   const MessagesRequest& request)
    : omit_thinking_(request.omit_thinking) {
  message_ = {{"id", new_completion_id("msg_")},
              {"type", "message"},
              {"role", "assistant"},
              {"model", std::move(model)},
              {"content", ojson::array()},
              {"stop_reason", nullptr},
              {"stop_sequence", nullptr},
              {"usage",
               {{"input_tokens", prompt_tokens},
                {"cache_creation_input_tokens", 0},
                {"cache_read_input_tokens", 0},
                {"output_tokens", 0},
                // Fields the SDK's Usage type holds (nullable): no cache writes are billed here
                // and no server tools run; every request is served at the one tier there is.
                {"cache_creation", nullptr},
                {"server_tool_use", nullptr},
                {"service_tier", "standard"}}}};
}

std::string MessagesRenderer::start() {
  return sse_event("message_start", {{"type", "message_start"}, {"message", message_}}) +
         sse_event("ping", {{"type", "ping"}});
}

std::string MessagesRenderer::open(Open kind) {
  if (open_ == kind) return "";
  std::string out = close();
  open_ = kind;
  const ojson block = kind == Open::kThinking
                          ? ojson{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                          : ojson{{"type", "text"}, {"text", ""}};
  return out + sse_event("content_block_start", {{"type", "content_block_start"},
                                                 {"index", message_["content"].size()},
                                                 {"content_block", block}});
}

std::string MessagesRenderer::close() {
  if (open_ == Open::kNone) return "";
  const size_t index = message_["content"].size();
  // Anthropic ends a thinking block with its signature, which clients keep to send the block
  // back; this server signs nothing, so it is empty, as in the whole answer.
  std::string out;
  if (open_ == Open::kThinking) {
    out = sse_event("content_block_delta",
                    {{"type", "content_block_delta"},
                     {"index", index},
                     {"delta", {{"type", "signature_delta"}, {"signature", ""}}}});
  }
  message_["content"].push_back(
      open_ == Open::kThinking ? ojson{{"type", "thinking"}, {"thinking", text_}, {"signature", ""}}
                               : ojson{{"type", "text"}, {"text", text_}});
  open_ = Open::kNone;
  text_.clear();
  return out + sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
}

std::string MessagesRenderer::add(const OutputDelta& delta) {
  std::string out;
  auto block_delta = [&](ojson d) {
    out += sse_event("content_block_delta", {{"type", "content_block_delta"},
                                             {"index", message_["content"].size()},
                                             {"delta", std::move(d)}});
  };
  if (!delta.reasoning.empty()) {
    out += open(Open::kThinking);
    // display "omitted": the block is there, its text is not.
    if (!omit_thinking_) {
      text_ += delta.reasoning;
      block_delta({{"type", "thinking_delta"}, {"thinking", delta.reasoning}});
    }
  }
  if (!delta.content.empty()) {
    out += open(Open::kText);
    text_ += delta.content;
    block_delta({{"type", "text_delta"}, {"text", delta.content}});
  }
  for (const auto& call : delta.tool_calls) {
    out += close();
    const size_t index = message_["content"].size();
    ojson block = {{"type", "tool_use"},
                   {"id", new_completion_id("toolu_")},
                   {"name", call.name},
                   {"input", ojson::object()}};
    out += sse_event("content_block_start",
                     {{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    block_delta({{"type", "input_json_delta"}, {"partial_json", call.arguments.dump()}});
    out += sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index}});
    block["input"] = ojson(call.arguments);
    message_["content"].push_back(std::move(block));
  }
  return out;
}

std::string MessagesRenderer::finish(const GenerationOutcome& outcome) {
  std::string out = close();
  std::string reason = "end_turn";
  if (outcome.finish == "length") {
    reason = outcome.context_full ? "model_context_window_exceeded" : "max_tokens";
  }
  if (outcome.finish == "tool_calls") reason = "tool_use";
  if (!outcome.stop_sequence.empty()) reason = "stop_sequence";
  message_["stop_reason"] = reason;
  message_["stop_sequence"] =
      outcome.stop_sequence.empty() ? ojson(nullptr) : ojson(outcome.stop_sequence);
  // Anthropic counts cache reads apart from input_tokens: the prompt is their sum. The stream's
  // message_start said all of it was input, before the cache was looked up; message_delta's
  // usage corrects that, as Anthropic's cumulative usage fields do.
  auto& usage = message_["usage"];
  usage["input_tokens"] = outcome.prompt_tokens - outcome.cached_tokens;
  usage["cache_read_input_tokens"] = outcome.cached_tokens;
  usage["output_tokens"] = outcome.completion_tokens;
  out += sse_event(
      "message_delta",
      {{"type", "message_delta"},
       {"delta",
        {{"stop_reason", message_["stop_reason"]}, {"stop_sequence", message_["stop_sequence"]}}},
       {"usage", usage}});
  return out + sse_event("message_stop", {{"type", "message_stop"}});
}

std::string MessagesRenderer::error(const ApiError& error) {
  return sse_event("error", anthropic_error_body(error));
}

}  // namespace torchtpu::server
