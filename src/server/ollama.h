// Ollama's own API, for the clients written against Ollama rather than OpenAI (its official
// libraries, Open WebUI's and VS Code Copilot's Ollama connections): POST /api/chat and
// /api/generate become chat requests (openai.h's GenerationRequest, checked by the chat parser
// itself) and answer in Ollama's newline-delimited JSON; GET /api/tags, POST /api/show, GET /api/ps
// and GET /api/version describe the model, and POST /api/pull of a model served here succeeds with
// nothing to download. Errors have Ollama's shape, {"error": "..."}. No HTTP here, and no
// libtorch: the request fuzz harness compiles the parsers.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/wire.h"

namespace torchtpu::server {

// The Ollama release whose API these routes follow, as GET /api/version reports it: clients gate
// features on it (VS Code Copilot asks for at least 0.6.4).
inline constexpr const char* kOllamaApiVersion = "0.33.0";

struct OllamaRequest {
  GenerationRequest generation;  // its model: the server's name for it (no ":latest")
  std::string model;             // as the client named it, echoed in every answer
  bool chat = true;              // /api/chat; false: /api/generate
  bool templated = true;         // the chat template renders the prompt (not generate's raw)
  // No messages (chat) or no prompt (generate): Ollama's way to load the model, answered once it
  // is loaded with done_reason "load"; with keep_alive 0, to unload it ("unload").
  bool load_only = false;
  // keep_alive in seconds (a number, or a Go duration such as "5m"): how long the model stays
  // loaded after the request while no other comes (below 0: for good); none: the server's
  // --sleep-idle-seconds.
  std::optional<double> keep_alive;
  bool unload() const { return load_only && keep_alive == 0.0; }
};

// ApiError 400 naming the field ("messages[1].images[0]", "options.temperature") for anything
// malformed or not supported; "model is required" as Ollama says it. Options that only tune
// Ollama's runner (num_ctx, num_gpu, num_thread, ...) are accepted and have no effect.
OllamaRequest parse_ollama_chat(const ojson& body);
OllamaRequest parse_ollama_generate(const ojson& body);

// The model /api/show and /api/pull name: "model", or Ollama's older "name"; 400 "model is
// required" without either.
std::string ollama_named_model(const ojson& body);

// POST /api/pull: the model, and whether the answer streams (as Ollama: unless "stream" is
// false). "insecure", a boolean, has no effect: nothing is downloaded.
struct OllamaPull {
  std::string model;
  bool stream = true;
};
OllamaPull parse_ollama_pull(const ojson& body);

// An error about a chat field that an Ollama field became, renamed to that field ("temperature"
// is "options.temperature", "response_format" is "format"); others as they are.
ApiError as_ollama_error(const ApiError& error);

// {"error": message}
ojson ollama_error_body(const ApiError& error);

// A time as Ollama writes it: RFC 3339 in UTC with microseconds ("2026-12-06T02:00:00.123456Z").
std::string rfc3339(std::chrono::system_clock::time_point t);

// The name Ollama shows for one of the server's model ids: with ":latest" when it has no tag.
std::string ollama_name(const std::string& id);

// What /api/tags, /api/show and /api/ps say about the model or one of its LoRA adapters.
struct OllamaModel {
  std::string id;           // the server's name for it
  std::string parent;       // an adapter's base model; "" for the model itself
  std::string digest;       // hex digits naming the weights
  int64_t size = 0;         // bytes of weights held
  int64_t size_vram = 0;    // of them, those in an accelerator's memory
  std::string modified_at;  // rfc3339
  std::string quantization;  // the linears' format: "BF16", "F32", "W4A16"
  int64_t context_length = 0;  // the server's --context
  int64_t embedding_length = 0;
  int64_t block_count = 0;
  std::vector<std::string> capabilities;  // completion, tools, thinking, vision, audio
  std::string parameters;  // the sampling defaults, one "name value" per line
  std::string chat_template;
  std::string expires_at;  // rfc3339: when an idle server sleeps; far ahead when it never does
};
ojson ollama_tag(const OllamaModel& model);   // one of /api/tags' models
ojson ollama_show(const OllamaModel& model);  // /api/show
ojson ollama_ps(const OllamaModel& model);    // one of /api/ps' models

// One answer of /api/chat or /api/generate: each delta one line ({"message": {...}} or
// {"response": "..."}, "done": false, with the "logprobs" of its tokens when asked), then a line
// with "done": true, done_reason and Ollama's counts and durations (nanoseconds since
// `received`). Whole, the same fields in one object.
class OllamaRenderer : public Renderer {
 public:
  OllamaRenderer(const OllamaRequest& request, std::chrono::steady_clock::time_point received);
  std::string content_type() const override { return "application/x-ndjson"; }
  std::string start() override { return ""; }
  void logprobs(const ojson& entries) override;
  std::string add(const OutputDelta& delta) override;
  std::string finish(const GenerationOutcome& outcome) override;
  std::string error(const ApiError& error) override;
  ojson body() const override { return whole_; }

 private:
  ojson line(const OutputDelta& delta);

  ojson logprobs_ = ojson::array();  // of the tokens behind the next line
  std::string model_;
  bool chat_;
  std::chrono::steady_clock::time_point received_;
  int64_t calls_ = 0;
  ojson whole_;  // the answer so far, as the whole answer's object
};

// The answer to a request that only loads or unloads the model (OllamaRequest::load_only).
ojson ollama_loaded(const OllamaRequest& request);

}  // namespace torchtpu::server
