#include "server/openai.h"

#include <algorithm>
#include <random>
#include <set>

#include "common/json_type.h"
#include "server/media_parts.h"
#include "server/structured.h"

namespace torchtpu::server {

ApiError wrong_type(const std::string& param, const std::string& expected, const ojson& got) {
  return ApiError(400, "'" + param + "' must be " + expected + ", got " + json_type_name(got),
                  "invalid_request_error", param, "invalid_type");
}

ApiError missing(const std::string& param) {
  return ApiError(400, "'" + param + "' is required", "invalid_request_error", param,
                  "missing_required_parameter");
}

ApiError unsupported(const std::string& param, const std::string& why) {
  return ApiError(400, "'" + param + "' " + why, "invalid_request_error", param,
                  "unsupported_value");
}

ApiError invalid(const std::string& param, const std::string& why) {
  return ApiError(400, "'" + param + "' " + why, "invalid_request_error", param, "invalid_value");
}

void check_one_of(const ojson& value, const std::string& param,
                  std::initializer_list<const char*> allowed) {
  std::string names;
  size_t i = 0;
  for (const char* name : allowed) {
    if (value.is_string() && value == name) return;
    names += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ");
    names += "\"" + std::string(name) + "\"";
    ++i;
  }
  throw invalid(param, "must be " + names + ", got " + value.dump());
}

void check_reasoning_effort(const ojson& effort, const std::string& param) {
  check_one_of(effort, param, {"none", "minimal", "low", "medium", "high", "xhigh"});
}

std::vector<std::string> nonempty_strings(const ojson& list,
                                          const std::function<std::string(size_t)>& element) {
  std::vector<std::string> out;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) throw wrong_type(element(i), "a string", list[i]);
    if (list[i].get_ref<const std::string&>().empty()) throw invalid(element(i), "is empty");
    out.push_back(list[i].get<std::string>());
  }
  return out;
}

const ojson* field(const ojson& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool declares_function(const ojson& tools, const std::string& name) {
  return std::any_of(tools.begin(), tools.end(),
                     [&](const ojson& tool) { return tool.at("function").at("name") == name; });
}

const std::string& required_string(const ojson& object, const char* name,
                                   const std::string& parent) {
  const std::string param = parent + "." + name;
  const ojson* v = field(object, name);
  if (!v) throw missing(param);
  if (!v->is_string()) throw wrong_type(param, "a string", *v);
  return v->get_ref<const std::string&>();
}

namespace {

bool get_bool(const ojson& body, const char* name, bool fallback) {
  const ojson* v = field(body, name);
  if (!v) return fallback;
  if (!v->is_boolean()) throw wrong_type(name, "a boolean", *v);
  return v->get<bool>();
}

std::optional<double> get_number(const ojson& body, const char* name, double lo, double hi) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw wrong_type(name, "a number", *v);
  const double x = v->get<double>();
  if (x < lo || x > hi) {
    throw ApiError(400,
                   "'" + std::string(name) + "' must be between " + ojson(lo).dump() + " and " +
                       ojson(hi).dump() + ", got " + v->dump(),
                   "invalid_request_error", name, "invalid_value");
  }
  return x;
}

std::optional<int64_t> get_int(const ojson& body, const char* name) {
  const ojson* v = field(body, name);
  if (!v) return std::nullopt;
  if (const auto overflow = int64_overflow(*v, name); !overflow.empty()) {
    throw ApiError(400, overflow, "invalid_request_error", name, "invalid_value");
  }
  if (!v->is_number_integer()) throw wrong_type(name, "an integer", *v);
  return v->get<int64_t>();
}

// Fields shared by chat and text completions.
void parse_common(const ojson& body, GenerationRequest& r) {
  if (const ojson* model = field(body, "model")) {
    if (!model->is_string()) throw wrong_type("model", "a string", *model);
    r.model = server_model_name(model->get<std::string>());
  }
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (auto n = get_int(body, name)) {
      // 0 scores an echoed prompt without generating (OpenAI's legacy completions, vLLM).
      if (*n < (r.echo ? 0 : 1)) {
        throw ApiError(400,
                       "'" + std::string(name) + "' must be at least " + (r.echo ? "0" : "1") +
                           ", got " + std::to_string(*n),
                       "invalid_request_error", name, "invalid_value");
      }
      if (!r.max_tokens) r.max_tokens = n;
    }
  }
  if (const ojson* stop = field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4) {
        throw ApiError(400, "'stop' holds at most 4 sequences, got " + std::to_string(stop->size()),
                       "invalid_request_error", "stop", "invalid_value");
      }
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          throw wrong_type("stop[" + std::to_string(i) + "]", "a string", (*stop)[i]);
        }
        r.stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      throw wrong_type("stop", "a string or an array of strings", *stop);
    }
    for (const auto& s : r.stop) {
      if (s.empty()) {
        throw ApiError(400, "'stop' sequences must not be empty", "invalid_request_error", "stop",
                       "invalid_value");
      }
    }
  }
  r.stream = get_bool(body, "stream", false);
  if (const ojson* options = field(body, "stream_options")) {
    if (!options->is_object()) throw wrong_type("stream_options", "an object", *options);
    // OpenAI's and vLLM's rule: options of a stream with no stream are a client's mistake.
    if (!r.stream) throw invalid("stream_options", "is only allowed when 'stream' is true");
    if (const ojson* usage = field(*options, "include_usage")) {
      if (!usage->is_boolean()) {
        throw wrong_type("stream_options.include_usage", "a boolean", *usage);
      }
      r.include_usage = usage->get<bool>();
    }
  }
  if (auto n = get_int(body, "n")) {
    if (*n < 1 || *n > kMaxChoices) {
      throw ApiError(400,
                     "'n' must be between 1 and " + std::to_string(kMaxChoices) + ", got " +
                         std::to_string(*n),
                     "invalid_request_error", "n", "invalid_value");
    }
    r.n = *n;
  }
  SamplingRequest& s = r.sampling;
  s.temperature = get_number(body, "temperature", 0, 2);
  s.top_p = get_number(body, "top_p", 0, 1);
  s.min_p = get_number(body, "min_p", 0, 1);
  s.presence_penalty = get_number(body, "presence_penalty", -2, 2);
  s.frequency_penalty = get_number(body, "frequency_penalty", -2, 2);
  s.repetition_penalty = get_number(body, "repetition_penalty", 0, 1e9);
  s.top_k = get_int(body, "top_k");
  // vLLM and llama.cpp spell "no top-k" -1 as well as 0.
  if (s.top_k == -1) s.top_k = 0;
  if (s.top_k && *s.top_k < 0) {
    throw ApiError(400, "'top_k' must be -1, 0 (off) or positive, got " + std::to_string(*s.top_k),
                   "invalid_request_error", "top_k", "invalid_value");
  }
  if (auto seed = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*seed);
  if (const ojson* bias = field(body, "logit_bias")) {
    if (!bias->is_object()) throw wrong_type("logit_bias", "an object", *bias);
    for (const auto& [key, value] : bias->items()) {
      const std::string param = "logit_bias." + key;
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      if (id < 0) {
        throw ApiError(400, "'" + param + "': logit_bias keys must be token ids",
                       "invalid_request_error", param, "invalid_value");
      }
      if (!value.is_number()) throw wrong_type(param, "a number", value);
      const double b = value.get<double>();
      if (b < -100 || b > 100) {
        throw ApiError(400, "'" + param + "' must be between -100 and 100, got " + value.dump(),
                       "invalid_request_error", param, "invalid_value");
      }
      s.logit_bias[id] = b;
    }
  }
  r.ignore_eos = get_bool(body, "ignore_eos", false);
  for (const char* name : {"thinking_token_budget", "reasoning_budget_tokens"}) {
    if (auto n = get_int(body, name)) {
      if (*n < -1) {
        throw ApiError(400,
                       "'" + std::string(name) + "' must be -1 (no limit) or at least 0, got " +
                           std::to_string(*n),
                       "invalid_request_error", name, "invalid_value");
      }
      if (!r.thinking_budget) r.thinking_budget = n;
    }
  }
  if (auto n = get_int(body, "speculative.n_max")) {
    if (*n < 0) {
      throw ApiError(400,
                     "'speculative.n_max' must be 0 (no drafts) or more, got " + std::to_string(*n),
                     "invalid_request_error", "speculative.n_max", "invalid_value");
    }
    r.draft_max = n;
  }
  if (const ojson* salt = field(body, "cache_salt")) {
    if (!salt->is_string()) throw wrong_type("cache_salt", "a string", *salt);
    r.cache_salt = salt->get<std::string>();
    if (r.cache_salt.empty()) {
      throw ApiError(400, "'cache_salt' must not be empty: leave it out for no salt",
                     "invalid_request_error", "cache_salt", "invalid_value");
    }
  }
  if (const ojson* lora = field(body, "lora")) r.lora = parse_lora_scales(*lora, "lora");
  if (auto n = get_int(body, "id_slot")) {
    if (*n < -1) {
      throw ApiError(400, "'id_slot' must be -1 (any free slot) or a slot's id, got " +
                              std::to_string(*n),
                     "invalid_request_error", "id_slot", "invalid_value");
    }
    r.id_slot = *n;
  }
  r.response_format = parse_response_format(body);
  if (auto n = get_int(body, "prompt_logprobs")) {
    if (*n < 0 || *n > 20) {
      throw ApiError(400, "'prompt_logprobs' must be between 0 and 20, got " + std::to_string(*n),
                     "invalid_request_error", "prompt_logprobs", "invalid_value");
    }
    // As vLLM: the prompt's logprobs come with the whole answer, which a stream never sends.
    if (r.stream) {
      throw ApiError(400, "'prompt_logprobs' cannot be combined with 'stream': true",
                     "invalid_request_error", "prompt_logprobs", "invalid_value");
    }
    r.prompt_logprobs = n;
  }
}

void parse_chat_logprobs(const ojson& body, GenerationRequest& r) {
  r.logprobs = get_bool(body, "logprobs", false);
  if (auto n = get_int(body, "top_logprobs")) {
    if (*n < 0 || *n > 20) {
      throw ApiError(400, "'top_logprobs' must be between 0 and 20, got " + std::to_string(*n),
                     "invalid_request_error", "top_logprobs", "invalid_value");
    }
    if (!r.logprobs && *n > 0) {
      throw ApiError(400, "'top_logprobs' needs 'logprobs': true", "invalid_request_error",
                     "top_logprobs", "invalid_value");
    }
    r.top_logprobs = *n;
  }
}

// Completions: logprobs=N asks for the chosen token's logprob and N alternatives.
void parse_completion_logprobs(const ojson& body, GenerationRequest& r) {
  const ojson* v = field(body, "logprobs");
  if (!v) return;
  if (v->is_boolean()) {
    r.logprobs = v->get<bool>();
    return;
  }
  if (!v->is_number_integer()) throw wrong_type("logprobs", "an integer", *v);
  const int64_t n = v->get<int64_t>();
  if (n < 0 || n > 20) {
    throw ApiError(400, "'logprobs' must be between 0 and 20, got " + std::to_string(n),
                   "invalid_request_error", "logprobs", "invalid_value");
  }
  r.logprobs = true;
  r.top_logprobs = n;
}

// tool_choice's allowed_tools {"mode": "auto" | "required", "tools": [{"type": "function",
// "function": {"name"}}, ...]}: the names, each one of `tools`' functions.
std::set<std::string> allowed_tools(const ojson& choice, const ojson& tools, std::string& mode) {
  const std::string p = "tool_choice.allowed_tools";
  const ojson* allowed = field(choice, "allowed_tools");
  if (!allowed) throw missing(p);
  if (!allowed->is_object()) throw wrong_type(p, "an object", *allowed);
  mode = required_string(*allowed, "mode", p);
  check_one_of(mode, p + ".mode", {"auto", "required"});
  const ojson* list = field(*allowed, "tools");
  if (!list) throw missing(p + ".tools");
  if (!list->is_array() || list->empty()) {
    throw wrong_type(p + ".tools", "a non-empty array", *list);
  }
  std::set<std::string> names;
  for (size_t i = 0; i < list->size(); ++i) {
    const ojson& entry = (*list)[i];
    const std::string q = at_index(p + ".tools", i);
    if (!entry.is_object()) throw wrong_type(q, "an object", entry);
    const std::string& type = required_string(entry, "type", q);
    if (type != "function") {
      throw unsupported(
          q + ".type",
          "must be \"function\" (this server has no custom tools), got \"" + type + "\"");
    }
    const ojson* function = field(entry, "function");
    if (!function) throw missing(q + ".function");
    if (!function->is_object()) throw wrong_type(q + ".function", "an object", *function);
    const std::string& name = required_string(*function, "name", q + ".function");
    if (!declares_function(tools, name)) {
      throw invalid(q + ".function.name",
                    "names the function '" + name + "', which is not in 'tools'");
    }
    names.insert(name);
  }
  return names;
}

void parse_tool_choice(const ojson& body, GenerationRequest& r) {
  const ojson* choice = field(body, "tool_choice");
  if (!choice) return;
  if (choice->is_string()) {
    const auto c = choice->get<std::string>();
    if (c != "auto" && c != "none" && c != "required") {
      throw ApiError(400,
                     "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                     "{\"type\":\"function\",\"function\":{\"name\":...}}, got \"" +
                         c + "\"",
                     "invalid_request_error", "tool_choice", "invalid_value");
    }
    r.tool_choice = c;
  } else if (!choice->is_object()) {
    throw wrong_type("tool_choice", "a string or an object", *choice);
  } else if (const ojson* type = field(*choice, "type"); type && *type == "allowed_tools") {
    if (!r.tools.is_array() || r.tools.empty()) {
      throw invalid("tool_choice", "of type \"allowed_tools\" needs a non-empty 'tools' list");
    }
    // Every function stays in the prompt (so the prefix cache outlives a change of the allowed
    // set, as OpenAI means it to) and only the allowed ones are callable; "required" makes the
    // answer a call to one of them, as tool_choice "required" does for all.
    r.callable = allowed_tools(*choice, r.tools, r.tool_choice);
    return;
  } else if (type && *type != "function") {
    if (!type->is_string()) throw wrong_type("tool_choice.type", "a string", *type);
    throw unsupported("tool_choice.type",
                      "must be \"function\" or \"allowed_tools\" (this server has no custom "
                      "tools), got " +
                          type->dump());
  } else {
    const ojson* function = field(*choice, "function");
    const ojson* name = function && function->is_object() ? field(*function, "name") : nullptr;
    if (!name || !name->is_string()) {
      throw ApiError(400, "'tool_choice.function.name' is required and must be a string",
                     "invalid_request_error", "tool_choice.function.name",
                     "missing_required_parameter");
    }
    r.tool_choice = "function";
    r.tool_choice_function = name->get<std::string>();
  }
  if (r.tool_choice == "none") {
    r.tools = nullptr;
    return;
  }
  if (r.tool_choice != "auto" && (!r.tools.is_array() || r.tools.empty())) {
    throw ApiError(400, "'tool_choice' " + choice->dump() + " needs a non-empty 'tools' list",
                   "invalid_request_error", "tool_choice", "invalid_value");
  }
  if (r.tool_choice == "function") {
    if (!declares_function(r.tools, r.tool_choice_function)) {
      throw ApiError(400,
                     "'tool_choice' names the function '" + r.tool_choice_function +
                         "', which is not in 'tools'",
                     "invalid_request_error", "tool_choice.function.name", "invalid_value");
    }
    // Every tool stays in the prompt, as with allowed_tools (a conversation that forces a call
    // on one turn keeps its prefix cache on the next), and the prompt ends with the opening of
    // this one's call; an error in its parameters names its place in the request.
    r.callable = {r.tool_choice_function};
  }
}

// reasoning_effort: anything but "none" turns thinking on; chat_template_kwargs.enable_thinking,
// when the client sent it, has the last word.
void parse_reasoning(const ojson& body, GenerationRequest& r) {
  const ojson* effort = field(body, "reasoning_effort");
  if (!effort) return;
  check_reasoning_effort(*effort, "reasoning_effort");
  if (r.template_kwargs.contains("enable_thinking")) return;
  r.template_kwargs["enable_thinking"] = *effort != "none";
}

// Text parts stay as they are; image_url and input_audio parts in user messages become
// {"type":"image"} / {"type":"audio"} with their source appended to `media`.
void check_content(ojson& content, const std::string& param, bool null_ok, bool user,
                   std::vector<MediaSource>& media) {
  if (content.is_string() || (content.is_null() && null_ok)) return;
  if (!content.is_array()) {
    throw wrong_type(param, "a string or an array of content parts", content);
  }
  for (size_t i = 0; i < content.size(); ++i) {
    ojson& part = content[i];
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object()) throw wrong_type(p, "an object", part);
    const std::string& type = required_string(part, "type", p);
    if ((type == "image_url" || type == "input_audio") && !user) {
      throw invalid(p + ".type", "is \"" + type +
                                     "\": images and audio belong to user messages (OpenAI's "
                                     "system, assistant and tool messages hold text only)");
    }
    if (type == "text") {
      const ojson* text = field(part, "text");
      if (!text || !text->is_string()) {
        throw wrong_type(p + ".text", "a string", text ? *text : ojson(nullptr));
      }
    } else if (type == "refusal" && !user) {
      // What an OpenAI model said in refusing, stored as its own part beside text: a history
      // replayed as stored reads it as the text it was.
      const ojson* refusal = field(part, "refusal");
      if (!refusal || !refusal->is_string()) {
        throw wrong_type(p + ".refusal", "a string", refusal ? *refusal : ojson(nullptr));
      }
      part = {{"type", "text"}, {"text", *refusal}};
    } else if (type == "image_url") {
      const ojson* image = field(part, "image_url");
      if (!image) throw missing(p + ".image_url");
      if (!image->is_object()) throw wrong_type(p + ".image_url", "an object", *image);
      const std::string& url = required_string(*image, "url", p + ".image_url");
      const int64_t tokens =
          image_tokens_for_detail(field(*image, "detail"), p + ".image_url.detail");
      media.push_back(image_from_url(url, p + ".image_url.url", tokens));
      part = {{"type", "image"}};
    } else if (type == "input_audio") {
      media.push_back(audio_from_input_audio(part, p));
      part = {{"type", "audio"}};
    } else {
      throw unsupported(p + ".type", std::string("must be ") +
                                         (user ? "\"text\", \"image_url\" or \"input_audio\""
                                               : "\"text\" or \"refusal\"") +
                                         ", got \"" + type + "\"");
    }
  }
}

std::vector<int64_t> id_array(const ojson& ids, const std::string& param) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer()) {
      throw wrong_type(at_index(param, i), "an integer token id", ids[i]);
    }
    out.push_back(ids[i].get<int64_t>());
  }
  return out;
}

}  // namespace

ApiError::ApiError(int status, const std::string& message, std::string type, std::string param,
                   std::string code)
    : std::runtime_error(message),
      status(status),
      type(std::move(type)),
      param(std::move(param)),
      code(std::move(code)) {}

ojson error_body(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type},
            {"param", error.param.empty() ? ojson(nullptr) : ojson(error.param)},
            {"code", error.code.empty() ? ojson(nullptr) : ojson(error.code)}}}};
}

std::map<int64_t, double> parse_lora_scales(const ojson& list, const std::string& name) {
  if (!list.is_array()) throw wrong_type(name, "an array of {\"id\", \"scale\"} objects", list);
  std::map<int64_t, double> scales;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = name + "[" + std::to_string(i) + "]";
    const ojson& entry = list[i];
    if (!entry.is_object()) throw wrong_type(at, "an object {\"id\", \"scale\"}", entry);
    const ojson* id = field(entry, "id");
    const ojson* scale = field(entry, "scale");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0) {
      throw ApiError(400, "'" + at + ".id' must be an adapter's index from 0, got " +
                              (id ? id->dump() : std::string("nothing")),
                     "invalid_request_error", at + ".id", "invalid_value");
    }
    if (!scale || !scale->is_number()) {
      throw ApiError(400, "'" + at + ".scale' must be a number, got " +
                              (scale ? scale->dump() : std::string("nothing")),
                     "invalid_request_error", at + ".scale", "invalid_value");
    }
    if (!scales.emplace(id->get<int64_t>(), scale->get<double>()).second) {
      throw ApiError(400, "'" + name + "' names adapter " + id->dump() + " twice",
                     "invalid_request_error", at + ".id", "invalid_value");
    }
  }
  return scales;
}

ojson parse_body(const std::string& text) {
  ojson body = parse_body_value(text);
  if (!body.is_object()) {
    throw ApiError(
        400, std::string("the request body must be a JSON object, got ") + json_type_name(body),
        "invalid_request_error", "", "invalid_json");
  }
  return body;
}

ojson parse_body_value(const std::string& text) {
  ojson body;
  try {
    body = parse_json(text);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number beyond double's range (1e999) is out_of_range.
    throw ApiError(400, std::string("the request body is not valid JSON: ") + json_error_text(e),
                   "invalid_request_error", "", "invalid_json");
  } catch (const JsonTooDeep& e) {
    throw ApiError(400, std::string("the request body is refused: ") + e.what(),
                   "invalid_request_error", "", "json_too_deep");
  }
  return body;
}

std::string server_model_name(const std::string& name) {
  const std::string latest = ":latest";
  if (name.size() > latest.size() && name.ends_with(latest)) {
    return name.substr(0, name.size() - latest.size());
  }
  return name;
}

GenerationRequest parse_chat_request(const ojson& body) {
  GenerationRequest r;
  parse_common(body, r);
  parse_chat_logprobs(body, r);
  // Spoken output (OpenAI's audio models) was answered with text alone, and nothing said so.
  if (const ojson* modalities = field(body, "modalities")) {
    if (!modalities->is_array()) throw wrong_type("modalities", "an array", *modalities);
    for (const auto& m : *modalities) {
      if (m != "text") {
        throw unsupported("modalities",
                          "may hold \"text\" alone: this server answers with text "
                          "only, got " +
                              m.dump());
      }
    }
  }
  if (const ojson* audio = field(body, "audio"); audio && !audio->is_null()) {
    throw unsupported("audio", "asks for spoken output: this server answers with text only");
  }
  const ojson* messages = field(body, "messages");
  if (!messages) throw missing("messages");
  if (!messages->is_array()) throw wrong_type("messages", "an array", *messages);
  if (messages->empty()) {
    throw ApiError(400, "'messages' must hold at least one message", "invalid_request_error",
                   "messages", "empty_array");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const ojson& m = (*messages)[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw wrong_type(p, "an object", m);
    const ojson* role = field(m, "role");
    if (!role) throw missing(p + ".role");
    if (!role->is_string()) throw wrong_type(p + ".role", "a string", *role);
    // The template prints any other role as a turn of that name, which the model never saw.
    if (*role != "system" && *role != "developer" && *role != "user" && *role != "assistant" &&
        *role != "tool") {
      throw ApiError(400,
                     "'" + p + ".role' must be \"system\", \"developer\", \"user\", " +
                         "\"assistant\" or \"tool\", got " + role->dump(),
                     "invalid_request_error", p + ".role", "invalid_value");
    }
  }
  r.messages = *messages;
  for (size_t i = 0; i < r.messages.size(); ++i) {
    ojson& m = r.messages[i];
    const std::string p = "messages[" + std::to_string(i) + "]";
    auto content = m.find("content");
    const bool is_assistant = m["role"] == "assistant";
    if (content == m.end()) {
      if (!is_assistant) throw missing(p + ".content");
    } else {
      check_content(*content, p + ".content", is_assistant, m["role"] == "user", r.media);
    }
  }
  // OpenAI clients send a call's arguments as a JSON string; the template reads an object.
  for (size_t i = 0; i < r.messages.size(); ++i) {
    auto calls = r.messages[i].find("tool_calls");
    if (calls == r.messages[i].end() || !calls->is_array()) continue;
    for (size_t j = 0; j < calls->size(); ++j) {
      ojson& call = (*calls)[j];
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
        continue;
      }
      ojson& args = call["function"]["arguments"];
      if (!args.is_string()) continue;
      const std::string p = "messages[" + std::to_string(i) + "].tool_calls[" + std::to_string(j) +
                            "].function.arguments";
      try {
        args = parse_json(args.get<std::string>());
      } catch (const nlohmann::json::exception&) {
        throw ApiError(400, "'" + p + "' is not a JSON object: " + args.dump(),
                       "invalid_request_error", p, "invalid_value");
      } catch (const JsonTooDeep& e) {
        throw ApiError(400, "'" + p + "' is refused: " + e.what(), "invalid_request_error", p,
                       "json_too_deep");
      }
      if (!args.is_object()) throw wrong_type(p, "a JSON object", args);
    }
  }
  if (const ojson* tools = field(body, "tools")) {
    if (!tools->is_array()) throw wrong_type("tools", "an array", *tools);
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& tool = (*tools)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object()) throw wrong_type(p, "an object", tool);
      if (const ojson* type = field(tool, "type")) {
        if (!type->is_string()) throw wrong_type(p + ".type", "a string", *type);
        if (*type != "function") {
          throw unsupported(p + ".type", "is \"" + type->get<std::string>() +
                                             "\": this server calls function tools only");
        }
      }
      const ojson* function = field(tool, "function");
      if (!function) throw missing(p + ".function");
      if (!function->is_object()) throw wrong_type(p + ".function", "an object", *function);
      const ojson* name = field(*function, "name");
      if (!name) throw missing(p + ".function.name");
      if (!name->is_string()) throw wrong_type(p + ".function.name", "a string", *name);
    }
    r.tools = *tools;
  }
  if (const ojson* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kwargs);
    for (const char* key : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (kwargs->contains(key)) {
        throw unsupported(std::string("chat_template_kwargs.") + key,
                          "is the server's to set from the request, not a template kwarg");
      }
    }
    r.template_kwargs = *kwargs;
  }
  // vLLM's prefill: the reply opens with the text of a final assistant message. Here a final
  // assistant message is a closed turn, as the Messages route refuses prefill: refused rather
  // than quietly answered as a new turn.
  const auto refuse_prefill = [&](const char* name, bool prefill_value) {
    const ojson* v = field(body, name);
    if (!v) return;
    if (!v->is_boolean()) throw wrong_type(name, "a boolean", *v);
    if (*v == prefill_value) {
      throw unsupported(name, std::string("may only be ") + (prefill_value ? "false" : "true") +
                                  ": continuing a final assistant message (prefill) is not "
                                  "supported; its turn is closed and the reply is a new one");
    }
  };
  refuse_prefill("continue_final_message", true);
  refuse_prefill("add_generation_prompt", false);
  parse_reasoning(body, r);
  parse_tool_choice(body, r);
  // Unless tool_choice chose the callable functions (a named one, allowed_tools), every function
  // offered is one.
  if (r.callable.empty() && r.tools.is_array()) {
    for (const auto& tool : r.tools) {
      r.callable.insert(tool.at("function").at("name").get<std::string>());
    }
  }
  if (const ojson* p = field(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) throw wrong_type("parallel_tool_calls", "a boolean", *p);
    r.parallel_tool_calls = p->get<bool>();
  }
  return r;
}

GenerationRequest parse_completion_request(const ojson& body) {
  GenerationRequest r;
  r.echo = get_bool(body, "echo", false);
  parse_common(body, r);
  parse_completion_logprobs(body, r);
  if (auto best_of = get_int(body, "best_of"); best_of && *best_of != 1) {
    throw ApiError(400, "only best_of=1 is supported", "invalid_request_error", "best_of",
                   "unsupported_value");
  }
  // OpenAI's insertion: text to complete before, which the reply would have to end in.
  if (const ojson* suffix = field(body, "suffix"); suffix && !suffix->is_null()) {
    if (!suffix->is_string()) throw wrong_type("suffix", "a string", *suffix);
    if (!suffix->get<std::string>().empty()) {
      throw unsupported("suffix",
                        "is not supported: Gemma 4 has no fill-in-the-middle tokens to place it");
    }
  }
  const ojson* prompt = field(body, "prompt");
  if (!prompt) throw missing("prompt");
  // A string or token ids; or an array of prompts, each a string or an array of token ids.
  std::vector<const ojson*> prompts{prompt};
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number_integer()) {
    prompts.clear();
    for (const auto& one : *prompt) prompts.push_back(&one);
  }
  const auto count = static_cast<int64_t>(prompts.size());
  if (count * r.n > kMaxChoices) {
    throw ApiError(400,
                   "'prompt' lists " + std::to_string(count) + " prompts of " +
                       std::to_string(r.n) + " choices each ('n'): at most " +
                       std::to_string(kMaxChoices) + " choices in all",
                   "invalid_request_error", "prompt", "invalid_value");
  }
  for (int64_t i = 0; i < count; ++i) {
    const ojson& one = *prompts[i];
    const std::string param = count > 1 ? at_index("prompt", i) : "prompt";
    CompletionPrompt parsed;
    if (one.is_string()) {
      parsed.text = one.get<std::string>();
    } else if (one.is_array()) {
      if (!one.empty()) parsed.ids = id_array(one, param);
    } else {
      throw wrong_type(param, "a string or an array of token ids", one);
    }
    if (parsed.text.empty() && (!parsed.ids || parsed.ids->empty())) {
      throw ApiError(400, "'" + param + "' must not be empty", "invalid_request_error", param,
                     "invalid_value");
    }
    if (i == 0) {
      r.prompt = std::move(parsed.text);
      r.prompt_ids = std::move(parsed.ids);
    } else {
      r.more_prompts.push_back(std::move(parsed));
    }
  }
  return r;
}

TokenizeRequest parse_tokenize_request(const ojson& body) {
  TokenizeRequest r;
  const ojson* content = field(body, "content");
  if (!content) throw missing("content");
  if (!content->is_string()) throw wrong_type("content", "a string", *content);
  r.content = content->get<std::string>();
  r.add_special = get_bool(body, "add_special", false);
  r.with_pieces = get_bool(body, "with_pieces", false);
  return r;
}

std::vector<int64_t> parse_detokenize_request(const ojson& body) {
  const ojson* tokens = field(body, "tokens");
  if (!tokens) throw missing("tokens");
  if (!tokens->is_array()) throw wrong_type("tokens", "an array of token ids", *tokens);
  return id_array(*tokens, "tokens");
}

std::string new_completion_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

}  // namespace torchtpu::server
