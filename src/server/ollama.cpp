#include "server/ollama.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "common/ascii.h"
#include "common/base64.h"
#include "media/kinds.h"

namespace torchtpu::server {
namespace {

// Ollama's model field (`key`) is required; its own wording when it is missing.
std::string model_of(const ojson& body, const char* key = "model") {
  const ojson* model = field(body, key);
  if (model && !model->is_string()) throw wrong_type(key, "a string", *model);
  if (!model || model->get<std::string>().empty()) {
    throw ApiError(400, "model is required", "invalid_request_error", "model",
                   "missing_required_parameter");
  }
  return model->get<std::string>();
}

std::string optional_string(const ojson& object, const char* name, const std::string& param) {
  const ojson* v = field(object, name);
  if (!v) return "";
  if (!v->is_string()) throw wrong_type(param, "a string", *v);
  return v->get<std::string>();
}

// Base64 images (Ollama sends no media type) as chat's image_url parts, the type read from the
// image's first bytes.
ojson image_parts(const ojson& images, const std::string& param,
                  std::vector<std::string>& image_params) {
  if (!images.is_array()) throw wrong_type(param, "an array of base64 strings", images);
  ojson parts = ojson::array();
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string p = at_index(param, i);
    if (!images[i].is_string()) throw wrong_type(p, "a base64 string", images[i]);
    const std::string& data = images[i].get_ref<const std::string&>();
    const auto head = decode_base64(data.substr(0, 16));
    const std::string_view type =
        head ? sniff_media_type(MediaKind::kImage, *head) : std::string_view();
    if (type.empty()) {
      throw invalid(p, "is not a base64 PNG, JPEG or WebP image, the formats this server reads");
    }
    parts.push_back({{"type", "image_url"},
                     {"image_url", {{"url", "data:" + std::string(type) + ";base64," + data}}}});
    image_params.push_back(p);
  }
  return parts;
}

// A message's text with its images (`images`, named `param`), the images first as Ollama's
// templates place them.
ojson content_with_images(const ojson* images, const std::string& param, const std::string& text,
                          std::vector<std::string>& image_params) {
  if (!images || images->empty()) return text;
  ojson parts = image_parts(*images, param, image_params);
  if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// An assistant's tool_calls ({"id"?, "function": {"name", "arguments": {...}}}) in chat's shape;
// calls without an id get one, so tool messages can name them.
ojson chat_tool_calls(const ojson& calls, const std::string& param, size_t message) {
  if (!calls.is_array()) throw wrong_type(param, "an array", calls);
  ojson out = ojson::array();
  for (size_t j = 0; j < calls.size(); ++j) {
    const ojson& call = calls[j];
    const std::string p = at_index(param, j);
    if (!call.is_object()) throw wrong_type(p, "an object", call);
    const ojson* function = field(call, "function");
    if (!function) throw missing(p + ".function");
    if (!function->is_object()) throw wrong_type(p + ".function", "an object", *function);
    const std::string& name = required_string(*function, "name", p + ".function");
    ojson arguments = ojson::object();
    if (const ojson* a = field(*function, "arguments")) {
      if (!a->is_object() && !a->is_string()) {
        throw wrong_type(p + ".function.arguments", "an object", *a);
      }
      arguments = *a;
    }
    std::string id = optional_string(call, "id", p + ".id");
    if (id.empty()) id = "call_" + std::to_string(message) + "_" + std::to_string(j);
    out.push_back({{"id", id},
                   {"type", "function"},
                   {"function", {{"name", name}, {"arguments", std::move(arguments)}}}});
  }
  return out;
}

// Ollama's messages as chat messages: images become image_url parts, thinking an assistant's
// reasoning_content, tool_calls chat's, and a tool message names its call by tool_call_id, by
// tool_name, or else by its place among the tool messages after the calls.
ojson chat_messages(const ojson& messages, std::vector<std::string>& image_params) {
  if (!messages.is_array()) throw wrong_type("messages", "an array", messages);
  ojson out = ojson::array();
  ojson calls = ojson::array();  // of the last assistant message
  size_t answered = 0;           // tool messages since it
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string p = at_index("messages", i);
    if (!m.is_object()) throw wrong_type(p, "an object", m);
    // Ollama reads roles in any case.
    const std::string role = ascii_lower(required_string(m, "role", p));
    const std::string text = optional_string(m, "content", p + ".content");
    // Ollama takes images on any message; Gemma 4 reads them in user turns only, as chat does.
    if (const ojson* images = field(m, "images");
        images && role != "user" && !(images->is_array() && images->empty())) {
      throw invalid(p + ".images", "belong to user messages, not " + role + " ones");
    }
    ojson turn = {{"role", role}};
    if (role == "assistant") {
      turn["content"] = text;
      if (const ojson* thinking = field(m, "thinking")) {
        if (!thinking->is_string()) throw wrong_type(p + ".thinking", "a string", *thinking);
        if (!thinking->get_ref<const std::string&>().empty()) {
          turn["reasoning_content"] = *thinking;
        }
      }
      calls = ojson::array();
      answered = 0;
      if (const ojson* c = field(m, "tool_calls"); c && !c->empty()) {
        calls = chat_tool_calls(*c, p + ".tool_calls", i);
        turn["tool_calls"] = calls;
        if (text.empty()) turn["content"] = nullptr;
      }
    } else {
      for (const char* name : {"thinking", "tool_calls"}) {
        if (field(m, name)) {
          throw invalid(p + "." + name, "belongs to assistant messages, not " + role + " ones");
        }
      }
      turn["content"] = content_with_images(field(m, "images"), p + ".images", text, image_params);
    }
    if (role == "tool") {
      std::string id = optional_string(m, "tool_call_id", p + ".tool_call_id");
      const std::string name = optional_string(m, "tool_name", p + ".tool_name");
      if (id.empty() && name.empty() && answered < calls.size()) id = calls[answered]["id"];
      if (!id.empty()) turn["tool_call_id"] = id;
      if (!name.empty()) turn["name"] = name;
      ++answered;
    }
    out.push_back(std::move(turn));
  }
  return out;
}

// A number field of `options`, an integer when `integer` (Ollama's int options take whole
// numbers, as JSON writes them either way).
const ojson* option(const ojson& options, const char* name, bool integer) {
  const ojson* v = field(options, name);
  if (!v) return nullptr;
  const std::string p = std::string("options.") + name;
  if (!v->is_number()) throw wrong_type(p, integer ? "an integer" : "a number", *v);
  const double x = v->get<double>();
  if (integer && x != std::floor(x)) throw wrong_type(p, "an integer", *v);
  // Read as int64 later: a larger value would not convert.
  if (integer && std::abs(x) > 1e15) {
    throw invalid(p, "must be an integer of at most 15 digits, got " + v->dump());
  }
  return v;
}

// Ollama's options (its Modelfile parameters) into the chat body's sampling fields.
void apply_options(const ojson& options, ojson& chat) {
  if (!options.is_object()) throw wrong_type("options", "an object", options);
  // Ollama's runner settings (memory, threads, batching, the context: this server's --context
  // holds for every request) and the deprecated penalize_newline. Checked as Ollama checks their
  // types, with no effect, as Ollama accepts them for any model.
  static const std::set<std::string> runner_ints = {"num_ctx",  "num_batch",  "num_gpu",
                                                    "main_gpu", "num_thread", "num_keep"};
  static const std::set<std::string> runner_bools = {
      "numa",     "low_vram",  "f16_kv",         "logits_all",      "vocab_only",
      "use_mmap", "use_mlock", "embedding_only", "penalize_newline"};
  static const std::set<std::string> sampling = {
      "seed",         "num_predict",  "top_k",          "top_p",          "min_p",
      "temperature",  "stop",         "repeat_penalty", "presence_penalty", "frequency_penalty",
      "typical_p",    "tfs_z",        "repeat_last_n",  "mirostat",       "mirostat_tau",
      "mirostat_eta"};
  for (const auto& [key, value] : options.items()) {
    if (runner_ints.count(key)) {
      option(options, key.c_str(), true);
    } else if (runner_bools.count(key)) {
      if (!value.is_boolean()) throw wrong_type("options." + key, "a boolean", value);
    } else if (!sampling.count(key)) {
      throw invalid("options." + key,
                    "is not an Ollama option (the sampling ones: temperature, top_k, top_p, "
                    "min_p, seed, num_predict, stop, repeat_penalty, presence_penalty, "
                    "frequency_penalty)");
    }
  }
  for (const char* name : {"temperature", "top_p", "min_p", "presence_penalty",
                           "frequency_penalty"}) {
    if (const ojson* v = option(options, name, false)) chat[name] = *v;
  }
  if (const ojson* v = option(options, "repeat_penalty", false)) chat["repetition_penalty"] = *v;
  if (const ojson* v = option(options, "top_k", true)) {
    chat["top_k"] = v->get<double>() <= 0 ? 0 : v->get<int64_t>();  // Ollama: 0 or less is off
  }
  // Ollama's default seed is -1: a random one.
  if (const ojson* v = option(options, "seed", true); v && v->get<double>() >= 0) {
    chat["seed"] = v->get<int64_t>();
  }
  // -1 (Ollama's default), -2 (fill the context) and 0: until a stop or the end of the context.
  if (const ojson* v = option(options, "num_predict", true); v && v->get<double>() > 0) {
    chat["max_completion_tokens"] = v->get<int64_t>();
  }
  if (const ojson* stop = field(options, "stop")) {
    if (!stop->is_array()) throw wrong_type("options.stop", "an array of strings", *stop);
    chat["stop"] = *stop;
  }
  // Samplers this server does not have are refused unless they are set to do nothing.
  auto refuse_unless = [&](const char* name, double neutral, const std::string& why) {
    const ojson* v = option(options, name, false);
    if (v && v->get<double>() != neutral) {
      throw unsupported(std::string("options.") + name, why + ", got " + v->dump());
    }
  };
  refuse_unless("mirostat", 0, "must be 0: Mirostat sampling is not implemented here");
  refuse_unless("typical_p", 1, "must be 1: locally typical sampling is not implemented here");
  refuse_unless("tfs_z", 1, "must be 1: tail-free sampling is not implemented here");
  for (const char* name : {"mirostat_tau", "mirostat_eta"}) option(options, name, false);
  // The repetition penalty here counts every token of the prompt and the reply (transformers'
  // rule): Ollama's window of the last N tokens only matters once a penalty is asked for.
  const ojson* last_n = option(options, "repeat_last_n", true);
  const ojson* penalty = field(options, "repeat_penalty");
  if (last_n && *last_n != -1 && penalty && *penalty != 1) {
    throw unsupported("options.repeat_last_n",
                      "must be -1 (the whole context) when repeat_penalty is set: the penalty "
                      "here counts every token of the prompt and the reply, got " +
                          last_n->dump());
  }
}

// "format": "json", a JSON schema, or "" / null for text.
void apply_format(const ojson& body, ojson& chat) {
  const ojson* format = field(body, "format");
  if (!format || *format == "") return;
  if (*format == "json") {
    chat["response_format"] = {{"type", "json_object"}};
  } else if (format->is_object()) {
    chat["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "output"}, {"schema", *format}}}};
  } else {
    throw invalid("format", "must be \"json\" or a JSON schema object, got " + format->dump());
  }
}

// "think": a boolean, or one of Ollama's levels, which all turn Gemma 4's one switch on.
void apply_think(const ojson& body, ojson& chat) {
  const ojson* think = field(body, "think");
  if (!think) return;
  static const std::set<std::string> levels = {"high", "medium", "low", "max"};
  if (!think->is_boolean() && !(think->is_string() && levels.count(think->get<std::string>()))) {
    throw invalid("think", "must be true, false, \"high\", \"medium\", \"low\" or \"max\", got " +
                               think->dump());
  }
  chat["chat_template_kwargs"] = {{"enable_thinking", !(*think == false)}};
}

// Seconds in a Go duration ("5m", "1h30m", "-1s", "0"), or nullopt when it is not one.
std::optional<double> go_duration(std::string_view s) {
  // Each unit before the one-letter units it starts with, so "ms" is not read as "m".
  static const std::pair<std::string_view, double> units[] = {
      {"ns", 1e-9}, {"us", 1e-6}, {"\u00b5s", 1e-6}, {"ms", 1e-3}, {"s", 1}, {"m", 60},
      {"h", 3600}};
  double sign = 1;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    sign = s[0] == '-' ? -1 : 1;
    s.remove_prefix(1);
  }
  if (s == "0") return 0.0;
  if (s.empty()) return std::nullopt;
  double total = 0;
  while (!s.empty()) {
    size_t digits = 0;
    while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) ||
                                 s[digits] == '.')) {
      ++digits;
    }
    const std::string number(s.substr(0, digits));
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (digits == 0 || end != number.c_str() + number.size()) return std::nullopt;
    s.remove_prefix(digits);
    const auto* unit = std::find_if(std::begin(units), std::end(units),
                                    [&](const auto& u) { return s.starts_with(u.first); });
    if (unit == std::end(units)) return std::nullopt;
    total += value * unit->second;
    s.remove_prefix(unit->first.size());
  }
  return sign * total;
}

// keep_alive: seconds as a number, or a Go duration; none when not given.
std::optional<double> keep_alive_seconds(const ojson& body) {
  const ojson* keep = field(body, "keep_alive");
  if (!keep) return std::nullopt;
  std::optional<double> seconds;
  if (keep->is_number()) seconds = keep->get<double>();
  if (keep->is_string()) seconds = go_duration(keep->get<std::string>());
  if (!seconds) {
    throw invalid("keep_alive", "must be a number of seconds or a duration such as \"5m\", got " +
                                    keep->dump());
  }
  return seconds;
}

bool get_stream(const ojson& body) {
  const ojson* stream = field(body, "stream");
  if (!stream) return true;  // Ollama streams unless told not to
  if (!stream->is_boolean()) throw wrong_type("stream", "a boolean", *stream);
  return stream->get<bool>();
}

// The fields /api/chat and /api/generate share, into `chat` (a chat or completions body).
void apply_common(const ojson& body, ojson& chat) {
  chat["stream"] = get_stream(body);
  if (const ojson* options = field(body, "options")) apply_options(*options, chat);
  apply_format(body, chat);
  // As chat's and completions' fields; Ollama reads top_logprobs only with logprobs.
  if (const ojson* logprobs = field(body, "logprobs")) {
    if (!logprobs->is_boolean()) throw wrong_type("logprobs", "a boolean", *logprobs);
    int64_t top = 0;
    if (const ojson* n = field(body, "top_logprobs")) {
      if (!n->is_number_integer()) throw wrong_type("top_logprobs", "an integer", *n);
      if (*n < 0 || *n > 20) {
        throw invalid("top_logprobs", "must be between 0 and 20, got " + n->dump());
      }
      top = n->get<int64_t>();
    }
    if (*logprobs == true && chat.contains("prompt")) {
      chat["logprobs"] = top;
    } else if (*logprobs == true) {
      chat["logprobs"] = true;
      chat["top_logprobs"] = top;
    }
  }
  for (const char* name : {"truncate", "shift"}) {
    if (const ojson* v = field(body, name); v && !v->is_boolean()) {
      throw wrong_type(name, "a boolean", *v);
    }
  }
}

// Parses the chat (or completions) body and puts back what the chat parser would have limited:
// Ollama's stop list has no length limit.
GenerationRequest parse_as_chat(ojson chat, bool templated,
                                const std::vector<std::string>& image_params) {
  std::vector<std::string> stops;
  if (const ojson* stop = field(chat, "stop")) {
    stops = nonempty_strings(*stop, [](size_t i) { return at_index("options.stop", i); });
    chat.erase("stop");
  }
  GenerationRequest r;
  try {
    r = templated ? parse_chat_request(chat) : parse_completion_request(chat);
  } catch (const ApiError& e) {
    throw as_ollama_error(e);
  }
  for (size_t i = 0; i < image_params.size(); ++i) {
    r.media[i].param = r.media[i].mime_param = image_params[i];
  }
  r.stop = std::move(stops);
  return r;
}

void set_model(OllamaRequest& out, const ojson& body, ojson& chat) {
  out.model = model_of(body);
  chat["model"] = server_model_name(out.model);
}

}  // namespace

OllamaRequest parse_ollama_chat(const ojson& body) {
  OllamaRequest out;
  ojson chat = ojson::object();
  set_model(out, body, chat);
  std::vector<std::string> image_params;
  const ojson* messages = field(body, "messages");
  out.load_only = !messages || (messages->is_array() && messages->empty());
  out.keep_alive = keep_alive_seconds(body);
  if (out.load_only) return out;
  chat["messages"] = chat_messages(*messages, image_params);
  if (const ojson* tools = field(body, "tools"); tools && !tools->empty()) chat["tools"] = *tools;
  apply_think(body, chat);
  apply_common(body, chat);
  out.generation = parse_as_chat(std::move(chat), true, image_params);
  return out;
}

OllamaRequest parse_ollama_generate(const ojson& body) {
  OllamaRequest out;
  out.chat = false;
  ojson chat = ojson::object();
  set_model(out, body, chat);
  const std::string prompt = optional_string(body, "prompt", "prompt");
  const std::string system = optional_string(body, "system", "system");
  if (!optional_string(body, "suffix", "suffix").empty()) {
    throw unsupported("suffix",
                      "is not supported: Gemma 4 has no fill-in-the-middle tokens to place it");
  }
  if (!optional_string(body, "template", "template").empty()) {
    throw unsupported("template",
                      "is not supported: the prompt is rendered with the checkpoint's chat "
                      "template (send raw: true with a prompt already rendered)");
  }
  if (const ojson* context = field(body, "context"); context && !context->empty()) {
    throw unsupported("context",
                      "(deprecated in Ollama) is not supported: send the conversation to /api/chat");
  }
  const ojson* images = field(body, "images");
  const bool has_images = images && !images->empty();
  out.load_only = prompt.empty() && !has_images;
  out.keep_alive = keep_alive_seconds(body);
  if (out.load_only) return out;
  if (const ojson* raw = field(body, "raw")) {
    if (!raw->is_boolean()) throw wrong_type("raw", "a boolean", *raw);
    out.templated = !raw->get<bool>();
  }
  std::vector<std::string> image_params;
  if (out.templated) {
    chat["messages"] = ojson::array();
    if (!system.empty()) chat["messages"].push_back({{"role", "system"}, {"content", system}});
    chat["messages"].push_back(
        {{"role", "user"}, {"content", content_with_images(images, "images", prompt, image_params)}});
    apply_think(body, chat);
  } else {
    // As Ollama: a raw prompt is the whole prompt.
    for (const char* name : {"system", "images", "think"}) {
      if (const ojson* v = field(body, name); v && !v->empty() && *v != "" && *v != false) {
        throw invalid(name, "cannot be given with raw: true (the raw prompt is the whole prompt)");
      }
    }
    chat["prompt"] = prompt;
  }
  apply_common(body, chat);
  out.generation = parse_as_chat(std::move(chat), out.templated, image_params);
  return out;
}

std::string ollama_named_model(const ojson& body) {
  // "name" is Ollama's older spelling of "model".
  return model_of(body, !field(body, "model") && field(body, "name") ? "name" : "model");
}

OllamaPull parse_ollama_pull(const ojson& body) {
  OllamaPull out{ollama_named_model(body), get_stream(body)};
  if (const ojson* insecure = field(body, "insecure"); insecure && !insecure->is_boolean()) {
    throw wrong_type("insecure", "a boolean", *insecure);
  }
  return out;
}

ApiError as_ollama_error(const ApiError& error) {
  return renamed(error, {{"response_format.json_schema", "format"},
                         {"response_format", "format"},
                         {"max_completion_tokens", "options.num_predict"},
                         {"repetition_penalty", "options.repeat_penalty"},
                         {"temperature", "options.temperature"},
                         {"top_p", "options.top_p"},
                         {"top_k", "options.top_k"},
                         {"min_p", "options.min_p"},
                         {"presence_penalty", "options.presence_penalty"},
                         {"frequency_penalty", "options.frequency_penalty"},
                         {"seed", "options.seed"}});
}

ojson ollama_error_body(const ApiError& error) { return {{"error", error.what()}}; }

std::string rfc3339(std::chrono::system_clock::time_point t) {
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  const size_t n = std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(text + n, sizeof text - n, ".%06lldZ", static_cast<long long>(micros % 1000000));
  return text;
}

std::string ollama_name(const std::string& id) {
  // A tag follows the last ':' after the last '/' (a namespace may not hold one).
  const size_t slash = id.rfind('/');
  const bool tagged = id.find(':', slash == std::string::npos ? 0 : slash) != std::string::npos;
  return tagged ? id : id + ":latest";
}

namespace {

ojson details(const OllamaModel& m) {
  return {{"parent_model", m.parent.empty() ? "" : ollama_name(m.parent)},
          {"format", "safetensors"},
          {"family", "gemma4"},
          {"families", {"gemma4"}},
          {"parameter_size", ""},
          {"quantization_level", m.quantization},
          {"context_length", m.context_length},
          {"embedding_length", m.embedding_length}};
}

}  // namespace

ojson ollama_tag(const OllamaModel& m) {
  return {{"name", ollama_name(m.id)},       {"model", ollama_name(m.id)},
          {"modified_at", m.modified_at},    {"size", m.size},
          {"digest", m.digest},              {"details", details(m)},
          {"capabilities", m.capabilities}};
}

ojson ollama_show(const OllamaModel& m) {
  return {{"modelfile", "# served by torchtpu-cpp from safetensors; Ollama Modelfiles are not "
                        "read\nFROM " + m.id + "\n"},
          {"parameters", m.parameters},
          {"template", m.chat_template},
          {"details", details(m)},
          {"model_info",
           {{"general.architecture", "gemma4"},
            {"general.basename", m.id},
            {"gemma4.context_length", m.context_length},
            {"gemma4.embedding_length", m.embedding_length},
            {"gemma4.block_count", m.block_count}}},
          {"capabilities", m.capabilities},
          {"modified_at", m.modified_at}};
}

ojson ollama_ps(const OllamaModel& m) {
  return {{"name", ollama_name(m.id)},     {"model", ollama_name(m.id)},
          {"size", m.size},                {"digest", m.digest},
          {"details", details(m)},         {"expires_at", m.expires_at},
          {"size_vram", m.size_vram},                {"context_length", m.context_length}};
}

OllamaRenderer::OllamaRenderer(const OllamaRequest& request,
                               std::chrono::steady_clock::time_point received)
    : model_(request.model), chat_(request.chat), received_(received) {
  whole_ = {{"model", model_}, {"created_at", ""}};
  if (chat_) {
    whole_["message"] = {{"role", "assistant"}, {"content", ""}};
  } else {
    whole_["response"] = "";
  }
}

ojson OllamaRenderer::line(const OutputDelta& delta) {
  ojson out = {{"model", model_}, {"created_at", rfc3339(std::chrono::system_clock::now())}};
  ojson calls = ojson::array();
  for (const auto& call : delta.tool_calls) {
    calls.push_back({{"id", new_completion_id("call_")},
                     {"function",
                      {{"index", calls_++}, {"name", call.name}, {"arguments", call.arguments}}}});
  }
  ojson& whole = chat_ ? whole_["message"] : whole_;
  const char* text = chat_ ? "content" : "response";
  whole[text] = whole[text].get<std::string>() + delta.content;
  if (!delta.reasoning.empty()) {
    whole["thinking"] = whole.value("thinking", "") + delta.reasoning;
  }
  for (const auto& call : calls) whole["tool_calls"].push_back(call);
  ojson part = {{text, delta.content}};
  if (!delta.reasoning.empty()) part["thinking"] = delta.reasoning;
  if (!calls.empty()) part["tool_calls"] = std::move(calls);
  if (chat_) {
    part["role"] = "assistant";
    out["message"] = std::move(part);
  } else {
    for (auto& [key, value] : part.items()) out[key] = value;
  }
  out["done"] = false;
  if (!logprobs_.empty()) {
    if (!whole_.contains("logprobs")) whole_["logprobs"] = ojson::array();
    for (const auto& entry : logprobs_) whole_["logprobs"].push_back(entry);
    out["logprobs"] = std::exchange(logprobs_, ojson::array());
  }
  return out;
}

void OllamaRenderer::logprobs(const ojson& entries) {
  for (const auto& entry : entries) logprobs_.push_back(entry);
}

std::string OllamaRenderer::add(const OutputDelta& delta) {
  if (delta.content.empty() && delta.reasoning.empty() && delta.tool_calls.empty() &&
      logprobs_.empty()) {
    return "";
  }
  return dump(line(delta)) + "\n";
}

std::string OllamaRenderer::finish(const GenerationOutcome& outcome) {
  ojson last = line({});
  auto ns = [](double seconds) { return static_cast<int64_t>(std::llround(seconds * 1e9)); };
  const auto total = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - received_)
                         .count();
  // A tool call ends the turn as a stop does: Ollama has no reason of its own for it.
  const ojson stats = {{"done", true},
                       {"done_reason", outcome.finish == "length" ? "length" : "stop"},
                       {"total_duration", total},
                       {"prompt_eval_count", outcome.prompt_tokens},
                       {"prompt_eval_duration", ns(outcome.read_s)},
                       {"eval_count", outcome.completion_tokens},
                       {"eval_duration", ns(outcome.decode_s)}};
  for (const auto& [key, value] : stats.items()) {
    last[key] = value;
    whole_[key] = value;
  }
  whole_["created_at"] = last["created_at"];
  return dump(last) + "\n";
}

std::string OllamaRenderer::error(const ApiError& error) {
  return dump(ollama_error_body(error)) + "\n";
}

ojson ollama_loaded(const OllamaRequest& request) {
  ojson out = {{"model", request.model},
               {"created_at", rfc3339(std::chrono::system_clock::now())}};
  if (request.chat) {
    out["message"] = {{"role", "assistant"}, {"content", ""}};
  } else {
    out["response"] = "";
  }
  out["done"] = true;
  out["done_reason"] = request.unload() ? "unload" : "load";
  return out;
}

}  // namespace torchtpu::server
