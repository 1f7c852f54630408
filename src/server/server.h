// The OpenAI-compatible HTTP server. HTTP threads parse and validate requests and submit them to
// the engine's scheduler (engine/scheduler.h): a bounded FIFO queue in front of one engine worker
// thread, which owns the Engine and decodes up to `parallel` requests together.
// Used by `torchtpu-cpp serve` and, with the GIL released, from `python -m torchtpu_cpp.serve`.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "hub/hub.h"
#include "server/media_parts.h"

namespace torchtpu::server {

struct ServeOptions {
  std::string model_dir;  // empty: the built-in demo checkpoint (random weights)
  // How the engine loads and runs it. engine.no_vision / no_audio leave a tower unloaded: image or
  // audio parts are then a 400 naming the flag.
  EngineSettings engine;
  std::string model_id;  // reported by /v1/models; default: the directory's name
  // More names requests may use for the model (aliases, a router's rewrites); /v1/models lists
  // them all after model_id. Without model_id, the first of them is the model's id.
  std::vector<std::string> served_model_names;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;        // non-empty: Bearer auth on everything but the probes and /metrics
  bool metrics_auth = false;  // /metrics needs the API key too
  // GET /slots answers 501 (llama-server's --no-slots): what runs where stays unseen.
  bool no_slots = false;
  // The folder of POST /slots/{id}?action=save|restore's state files (llama-server's
  // --slot-save-path), made at start if missing; empty: those actions, and erase, answer 501.
  std::string slot_save_path;
  // POST /v1/load_lora_adapter and /v1/unload_lora_adapter load and unload LoRA adapters by
  // directory while serving (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING); else they answer 403.
  bool runtime_lora = false;
  // "vllm": the load gauges also under vLLM's names (vllm:num_requests_waiting, ...).
  std::string metrics_compat = "none";
  // After SIGINT/SIGTERM: seconds during which /health answers 503 while requests are still
  // served, so routers take the replica out before it refuses anything.
  double drain_grace_s = 0;
  // Seconds without a request after which the engine frees its weights and caches until the next
  // request reloads them (llama.cpp's --sleep-idle-seconds); -1: never.
  double sleep_idle_s = -1;
  // The prefix cache outlives a sleep (at most --cache-mb stays held), so a conversation taken up
  // again reads only its new turn (llama.cpp's --sleep-preserve-cache).
  bool sleep_preserve_cache = false;
  // Requests decoded together, each in a row of its own (its own KV cache of `context`
  // positions); more wait in the queue.
  int64_t parallel = 4;
  int max_queue = 16;  // waiting requests beyond this get 429
  // The prefix cache's budget in MiB (0: none): a request starting with tokens a finished request
  // held (its prompt and reply: the next chat turn, a shared system prompt) reuses their KV.
  int64_t cache_mb = 1024;
  // The batch's step budget and shared prompt passes (engine/batch.h's step_tokens and
  // pass_rows; 0: their defaults).
  int64_t step_tokens = 0;
  int64_t pass_rows = 0;
  // Decode steps per host read; above 1 needs parallel 1 (a batch reads every step).
  int64_t read_every = 1;
  // Speculative decoding for every request (engine.h, Drafting): by prompt lookup, or from the
  // assistant of --draft-model; rows draft side by side in the batch.
  Drafting draft;
  // tool_choice "auto" with tools: calls the model writes are held to the declared tools and
  // their parameters too (as tool_choice "required" always is), text around them is free.
  bool constrain_tools = false;
  // Tokens a reply may think before its thinking block is closed for it, unless the request
  // names its own budget; -1: no limit.
  int64_t reasoning_budget = -1;
  // Written into the thought when a budget closes it, just before <channel|> (llama.cpp's
  // --reasoning-budget-message); empty: the block is closed straight away.
  std::string reasoning_budget_message;
  std::string hosted_by = "torchtpu-cpp";  // "python" when hosted by torchtpu_cpp.serve
  int64_t max_body_bytes = 8 << 20;        // larger request bodies get 413
  MediaLimits media;                       // images and audio in requests
  // The one directory the MCP tools at /mcp may read `images` and `audio` files from (realpath,
  // inside it only); empty: they read none (docs/API.md, "MCP tools").
  std::string mcp_media_dir;
  // SIGINT/SIGTERM call request_stop(). A host that owns its signals (Python) sets this false and
  // calls request_stop() itself.
  bool install_signal_handlers = true;
  // Called once the port is bound (with its number, useful with port 0), before requests are read.
  std::function<void(int port)> on_listening;
};

// `options` with each Hub id (org/name[@rev]) among its model, int4 tables, draft model and LoRA
// adapters downloaded into the Hub cache (or found there, offline) and replaced by its snapshot
// directory; other paths stay as they are. hub::resolve_model's errors.
EngineOptions resolve_hub_ids(EngineOptions options, const hub::Options& hub);

// Builds the engine on the worker thread (the thread that will own it).
using EngineFactory = std::function<std::unique_ptr<Engine>(const EngineOptions&)>;

// Serves until SIGINT/SIGTERM or request_stop(); returns the process exit code (0 on a clean stop).
// The stop drains: /health turns 503 at once while requests are served for drain_grace_s more
// seconds (a second stop ends that early), then new generation requests get 503, and the server
// returns once every accepted request is answered (docs/RELIABILITY.md, "Lifecycle").
// May be called from any thread; one server runs per process at a time. Port 0 picks a free port.
// Prints one line "serving MODEL on http://HOST:PORT" to stdout once it listens. Throws what
// building the engine threw (after the listener is closed), and std::runtime_error if the
// address cannot be bound.
int run(const ServeOptions& options, EngineFactory make_engine = {});
// Asks a running server to drain, finish in-flight requests and return from run().
// Async-signal-safe. Called before run() starts, it makes the next run() return at once.
void request_stop();

}  // namespace torchtpu::server
