// The OpenAI wire format as far as the server speaks it: request bodies parsed and validated into
// plain structs, error objects, and the pieces of chat / text completion responses. No HTTP and no
// engine here, so every rule is testable on its own (tests/cpp/server_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/json_depth.h"
#include "common/json_type.h"
#include "grammar/grammar.h"
#include "server/media_parts.h"

namespace torchtpu::server {

using ojson = nlohmann::ordered_json;

// A request answered with an OpenAI error object and an HTTP status.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "");
  int status;
  std::string type;   // invalid_request_error | authentication_error |
                      // rate_limit_error | ...
  std::string param;  // the offending field ("messages[0].content"), empty for none
  std::string code;   // short machine-readable reason, empty for none
};

// {"error":{"message","type","param","code"}} with null for an empty param or code.
ojson error_body(const ApiError& error);

// Thrown by parse_json for JSON nested deeper than kMaxJsonDepth.
struct JsonTooDeep : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ojson::parse (keys in the client's order), refusing nesting deeper than kMaxJsonDepth with
// JsonTooDeep while parsing, before anything recursive sees it. Inline so that the MCP tools and
// their fuzzer use it without linking this file.
inline ojson parse_json(const std::string& text) {
  return parse_json_within_depth<ojson>(text, [] {
    throw JsonTooDeep("arrays and objects nest deeper than " + std::to_string(kMaxJsonDepth) +
                      " levels");
  });
}

// JSON as the server writes it: compact, with bytes that are no UTF-8 (a token's half of a
// character, a client's stray bytes echoed back) replaced rather than thrown. Inline for the same
// reason as parse_json.
inline std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The helpers every parser of a request body names its errors with (the type as
// common/json_type.h's json_type_name names it): 400 "'PARAM' must be EXPECTED, got TYPE"
// (invalid_type); 400 "'PARAM' is required".
ApiError wrong_type(const std::string& param, const std::string& expected, const ojson& got);
ApiError missing(const std::string& param);
// 400 "'PARAM' WHY" with code unsupported_value (a value this server does not implement) or
// invalid_value (a value outside the field's rules).
ApiError unsupported(const std::string& param, const std::string& why);
ApiError invalid(const std::string& param, const std::string& why);
// 400 naming `param` unless `value` is one of the strings `allowed`: "'PARAM' must be "a", "b"
// or "c", got VALUE".
void check_one_of(const ojson& value, const std::string& param,
                  std::initializer_list<const char*> allowed);
// 400 naming `param` unless `effort` is one of OpenAI's reasoning efforts ("none", "minimal",
// "low", "medium", "high", "xhigh"): a typo of "none" must not turn thinking on.
void check_reasoning_effort(const ojson& effort, const std::string& param);
// "param[i]": how OpenAI's formats (and Ollama's) name an array's element in errors.
inline std::string at_index(const std::string& param, size_t i) {
  return param + "[" + std::to_string(i) + "]";
}
// The strings of `list`, each one non-empty (stop sequences): 400 naming element i as
// `element(i)` for one that is not a string ("... must be a string") or is empty ("... is
// empty").
std::vector<std::string> nonempty_strings(const ojson& list,
                                          const std::function<std::string(size_t)>& element);
// Whether `tools`, in chat's shape ({"type": "function", "function": {"name", ...}}), declares the
// function `name`.
bool declares_function(const ojson& tools, const std::string& name);
// The member `name` of the object `body` if present and not null, else nullptr.
const ojson* field(const ojson& body, const char* name);
// The string member `name` of `object`, named "PARENT.NAME" in the error when it is missing or
// not a string.
const std::string& required_string(const ojson& object, const char* name,
                                   const std::string& parent);

// The body as a JSON object, keys in the client's order (templates may print them). ApiError 400 if
// it is not JSON, nests deeper than kMaxJsonDepth, or is not an object.
ojson parse_body(const std::string& text);
// The same for a body of any JSON value (POST /lora-adapters takes an array).
ojson parse_body_value(const std::string& text);
// llama-server's LoRA list, [{"id": int >= 0, "scale": number}, ...] (a request's `lora`, the body
// of POST /lora-adapters) -> id -> scale; ApiError 400 naming `name`[i] for a malformed entry or
// an id given twice.
std::map<int64_t, double> parse_lora_scales(const ojson& list, const std::string& name);

// The sampling fields a request set; unset ones take the checkpoint's generation_config.json
// defaults (temperature, top_k, top_p, min_p, repetition_penalty), then the engine's (greedy).
// Ranges beyond the OpenAI ones checked here are the engine's (SamplingParams::validate).
struct SamplingRequest {
  std::optional<double> temperature, top_p, min_p;
  std::optional<double> presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;
  std::map<int64_t, double> logit_bias;  // token id -> bias in [-100, 100]
};

// What /v1/chat/completions and /v1/completions ask of the engine.
// The most choices one request may ask for (`n`), as OpenAI's API allows.
constexpr int64_t kMaxChoices = 128;

// One prompt of a completions request: text, or token ids when the client sent ids.
struct CompletionPrompt {
  std::string text;
  std::optional<std::vector<int64_t>> ids;
};

struct GenerationRequest {
  std::string model;  // empty when the client sent none
  // chat: messages as sent (content strings or arrays of parts), tools or null, and extra
  // template variables (chat_template_kwargs, e.g. enable_thinking).
  // Image and audio parts are {"type":"image"} / {"type":"audio"} in `messages`, their sources in
  // `media` in the same order (server/media_parts.h).
  ojson messages;
  std::vector<MediaSource> media;
  ojson tools;
  ojson template_kwargs = ojson::object();
  // completions: the prompt as text, or as token ids when the client sent ids.
  std::string prompt;
  std::optional<std::vector<int64_t>> prompt_ids;
  // completions: the prompts after the first when `prompt` lists several (OpenAI's batch form);
  // each gets `n` choices, in the order of the prompts.
  std::vector<CompletionPrompt> more_prompts;
  // Choices to generate for each prompt (1 to kMaxChoices, and at most that many for all the
  // prompts together), each a sequence of its own.
  int64_t n = 1;
  // none: until a stop or the end of the context; 0 (completions with echo): the prompt alone.
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;      // stop strings, cut from the output
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // llama.cpp / vLLM extension: decode through end-of-turn tokens
  // Tokens a thinking block may hold before it is closed for the model (vLLM's
  // thinking_token_budget, llama.cpp's reasoning_budget_tokens); -1: no limit; none: the
  // server's --reasoning-budget.
  std::optional<int64_t> thinking_budget;
  // Draft tokens a step at most for this request (llama-server's speculative.n_max): 0 turns
  // speculative decoding off, more turns it on with the server's n-gram settings; none: the
  // server's --draft-max.
  std::optional<int64_t> draft_max;
  // The prefix cache shares states only between requests of the same salt (vLLM's cache_salt);
  // "": those without one.
  std::string cache_salt;
  // The slot (row) the request runs in, once free (llama-server's id_slot: a client that saves
  // or restores a slot's state names the one its conversation used); -1: any free one.
  int64_t id_slot = -1;
  // LoRA adapters for this request, id (the order of --lora) -> scale, the rest at 0
  // (llama-server's `lora`); none: the adapter `model` names, or the server's scales.
  std::optional<std::map<int64_t, double>> lora;
  SamplingRequest sampling;
  // logprobs of the returned tokens, and how many alternatives per position (0-20). Chat:
  // logprobs=true plus top_logprobs; completions: logprobs=N sets both.
  bool logprobs = false;
  int64_t top_logprobs = 0;
  // completions: the answer's text (and with logprobs, its logprobs) starts with the prompt's.
  bool echo = false;
  // vLLM's prompt_logprobs: each prompt token's logprob and rank, with this many alternatives
  // (0-20); not with stream. none: not asked.
  std::optional<int64_t> prompt_logprobs;
  // chat: "auto" (also when absent), "none", "required", or "function" with the one function
  // allowed in tool_choice_function.
  std::string tool_choice = "auto";
  std::string tool_choice_function;
  // The functions a tool call may name: every one of `tools`, the one a named tool_choice names,
  // or those allowed_tools lists (none for "none"). A call to any other is handed back as text.
  std::set<std::string> callable;
  // false (parallel_tool_calls; Messages' disable_parallel_tool_use): a forced call is exactly
  // one call, and an answer keeps only its first call.
  bool parallel_tool_calls = true;
  // response_format json_object or json_schema: the grammar the output must follow
  // (server/structured.h); none for text.
  std::optional<Grammar> response_format;
  // Responses' truncation "auto": a chat prompt that leaves no room for max_tokens (or for one
  // token) in the context loses its oldest turns, whole, until it does.
  bool drop_old_turns = false;
};

// The server's id for a model name a client sends: without a trailing ":latest", the tag Ollama
// gives an untagged name, which Ollama's clients send on every route (its own /v1 included).
std::string server_model_name(const std::string& name);

// ApiError 400 naming the field for anything malformed. Chat: a role other than system,
// developer, user, assistant or tool is malformed, and so is a tool without a string
// function.name; reasoning_effort other than "none" sets template_kwargs.enable_thinking unless
// chat_template_kwargs sets it; tool_choice "none" drops tools, a named function and
// allowed_tools keep them all and make the functions they name `callable` (allowed_tools' mode
// becoming tool_choice).
GenerationRequest parse_chat_request(const ojson& body);
GenerationRequest parse_completion_request(const ojson& body);

// llama.cpp's /tokenize {"content", "add_special"=false, "with_pieces"=false}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false;
  bool with_pieces = false;
};
TokenizeRequest parse_tokenize_request(const ojson& body);
// llama.cpp's /detokenize {"tokens": [ids]}.
std::vector<int64_t> parse_detokenize_request(const ojson& body);

// Response ids: "chatcmpl-" / "cmpl-" followed by 24 random hex digits.
std::string new_completion_id(const std::string& prefix);

// `cached_tokens` of the prompt came from the prefix cache (prompt_tokens_details).
ojson usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);

}  // namespace torchtpu::server
