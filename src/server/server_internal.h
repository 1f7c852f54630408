// What server.cpp, generation.cpp and admin.cpp share: the Server class, whose methods they define
// between them, and the helpers more than one of them calls. Nothing outside them includes it.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/error_message.h"
#include "common/errors.h"
#include "engine/logprobs.h"
#include "engine/scheduler.h"
#include "grammar/constraint.h"
#include "server/connection.h"
#include "server/mcp.h"
#include "server/metrics.h"
#include "server/ollama.h"
#include "server/openai.h"
#include "server/responses.h"
#include "server/server.h"
#include "server/structured.h"
#include "server/wire.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace torchtpu::server {

using Clock = std::chrono::steady_clock;
constexpr const char* kEngineThreadName = "torchtpu-engine";  // at most 15 characters

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A 500 for an exception nothing expected: its message without c10's backtrace, which names the
// process's load addresses and paths; the whole what() goes to the log for whoever runs it.
inline ApiError internal_error(const std::string& context, const std::exception& e,
                               const std::string& code = "") {
  std::cerr << "torchtpu-cpp serve: " << context << e.what() << "\n";
  return ApiError(500, context + error_message(e), "server_error", "", code);
}

inline int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Defined in generation.cpp, the one file that reads them: what the engine thread hands a request's
// HTTP thread, the request's mailbox and jobs, a piece taken, and the count of active requests.
struct Piece;
struct Mailbox;
struct Job;
struct Taken;
class Active;

// A request's jobs, choice 0 first.
using Choices = std::vector<std::shared_ptr<Job>>;

// TORCHTPU_TEST_FORCED_OUTPUT=FILE, a test hook: FILE holds a JSON array of
// {"prompt_contains": TEXT, "output": TEXT}; a request whose rendered prompt contains the first
// matching TEXT gets the tokens of that output instead of the model's, counted and given logprobs
// (under the model's real logits) like sampled ones, ending with finish "stop".
struct ForcedOutput {
  std::string prompt_contains;
  std::string output;
};

// Which API's error object a route answers with.
enum class ErrorShape { kOpenAI, kAnthropic, kOllama };

// The request's sampling fields over the checkpoint's defaults over the engine's (greedy), checked
// by the engine's own rules so a bad value is a 400 naming it (its messages start with the name).
inline SamplingParams sampling_params(const SamplingRequest& r, const SamplingRequest& defaults,
                                      int64_t vocab) {
  SamplingParams p;
  auto pick = [](const auto& asked, const auto& fallback, auto& into) {
    if (asked) {
      into = *asked;
    } else if (fallback) {
      into = *fallback;
    }
  };
  pick(r.temperature, defaults.temperature, p.temperature);
  pick(r.top_p, defaults.top_p, p.top_p);
  pick(r.min_p, defaults.min_p, p.min_p);
  pick(r.top_k, defaults.top_k, p.top_k);
  pick(r.repetition_penalty, defaults.repetition_penalty, p.repetition_penalty);
  if (r.presence_penalty) p.presence_penalty = *r.presence_penalty;
  if (r.frequency_penalty) p.frequency_penalty = *r.frequency_penalty;
  p.seed = r.seed;
  p.logit_bias = r.logit_bias;
  try {
    p.validate(vocab);
  } catch (const ValueError& e) {
    // "top_p must be ...": the field named first, quoted as the server's own messages quote it.
    const std::string message = e.what();
    const std::string param = message.substr(0, message.find(' '));
    throw ApiError(400, "'" + param + "'" + message.substr(param.size()), "invalid_request_error",
                   param, "invalid_value");
  }
  return p;
}

class Server {
 public:
  Server(const ServeOptions& options, EngineFactory make_engine);

  int run();

 private:
  // kDraining: stopping was asked, /health answers 503 and requests are still served, for the
  // drain grace; kStopping: new generation requests get 503 until the in-flight ones are answered.
  enum class State { kLoading, kWarmingUp, kReady, kDraining, kFailed, kStopping };
  // Generation requests are taken while ready and through the drain's grace.
  static bool takes_requests(State state) {
    return state == State::kReady || state == State::kDraining;
  }
  // Whether engine_ is built and stays so (any thread): from the warm-up until the stop.
  bool engine_built() const {
    const State state = state_;
    return state == State::kWarmingUp || takes_requests(state);
  }

  // Engine thread.
  void worker_main();
  void load();
  // The job as the scheduler runs it: its callbacks turn tokens into the job's pieces (stop
  // sequences cut, reasoning and tool calls parsed out) and its end into its finish.
  Submission submission(const std::shared_ptr<Job>& job);
  void deliver(Job& job, Piece&& delta);
  void finish_job(Job& job, const std::string& finish, std::optional<ApiError> error = {});

  // HTTP threads.
  void set_up_routes(HttpServer& http);
  httplib::Server::Handler guarded(
      const std::function<void(const httplib::Request&, httplib::Response&)>& handler,
      bool needs_engine, ErrorShape shape = ErrorShape::kOpenAI);
  // Throws ApiError 403 for a request browser_refusal refuses (a page of another site, a Host
  // other than localhost's on loopback).
  void check_page(const httplib::Request& req) const;
  // Throws as check_page does, and 401 without the API key.
  void authorize(const httplib::Request& req) const;
  // A browser's CORS preflight: 204 allowing the method and headers it asks for when
  // browser_refusal lets its page call the server (no key: a preflight never carries one), else
  // the 403 that page's request would get.
  void answer_preflight(const httplib::Request& req, httplib::Response& res) const;
  // Throws what a request no handler takes gets: 405 (with Allow) for another method on a route,
  // 404 for an unknown route, either after authorize (a client without the key learns no names).
  void refuse_unrouted(const httplib::Request& req, httplib::Response& res) const;
  // Counts the request as active, or throws 503 once shutdown has begun.
  std::shared_ptr<Active> admit();
  // The chat prompt: the template's rendering, then for tool_choice "required" or a named
  // function the call's opening (parser_prefix), which the model continues.
  std::string render_chat(const GenerationRequest& r, std::string& parser_prefix) const;
  // The grammar a request's output must follow, ready to step: a forced tool call's (tool_choice
  // "required" or a named function), else response_format's; none for free text. ApiError 400
  // naming the field whose grammar cannot be enforced.
  // `parser_prefix` as render_chat set it: whether the prompt opened the thinking channel.
  std::shared_ptr<Constraint> constraint_for(const GenerationRequest& r, bool chat,
                                             const std::string& parser_prefix) const;
  // The request's media read, checked and preprocessed for the engine; ApiError 400 naming the
  // part's field for anything wrong.
  std::vector<Media> read_media(const std::vector<MediaSource>& sources) const;
  // A rendered prompt's ids with each media part's marker expanded into its soft tokens.
  // ValueError when the text holds a marker with no part of its kind to fill it (a message that
  // writes <|image|>), rather than the engine's count of positions.
  std::vector<int64_t> with_media(std::vector<int64_t> ids, const std::vector<Media>& media) const;
  // A chat request's prompt: render_chat's text encoded, with_media's expansion of `media`.
  // With r.drop_old_turns (Responses' truncation "auto") a prompt that leaves no room for
  // max_tokens (or one token) in the context starts at a later user turn instead, after the
  // system and developer messages that open it: the earliest that leaves room, else the last.
  // The media of the turns left out leave `media`.
  struct ChatPrompt {
    std::string text;           // as rendered
    std::vector<int64_t> ids;   // encoded, media expanded
    std::string parser_prefix;  // as render_chat set it
  };
  ChatPrompt chat_prompt(const GenerationRequest& r, std::vector<Media>& media) const;
  // Builds the jobs of a generation request, one per choice of `n` (choice 0 and its siblings),
  // its prompt checked against the context (ApiError naming `prompt_param`), sharing `box` when
  // given (the other prompts' jobs of one request). Called on the thread answering the request:
  // the jobs watch its connection (connection_socket) to end when the client leaves.
  Choices prepare_jobs(const GenerationRequest& r, bool chat, const std::string& prompt_param,
                       std::shared_ptr<Mailbox> box = nullptr);
  // prepare_jobs, then queues all of them or none (429).
  Choices start_jobs(const GenerationRequest& r, bool chat, const std::string& prompt_param);
  // ApiError 400 naming `param`, its message opening with `what`, unless `sequences` fit in the
  // rows and the queue at once: the queue could never take them whole.
  void check_room(int64_t sequences, const std::string& param, const std::string& what) const;
  // A completions request's jobs: each prompt's choices, the prompts in order, queued together.
  Choices start_completions(const GenerationRequest& r);
  void handle_generation(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_responses(const httplib::Request& req, httplib::Response& res);
  void handle_messages(const httplib::Request& req, httplib::Response& res);
  // The tokens of the prompt `r` renders to, media's soft tokens included (a 400 naming `param`
  // for a prompt that cannot be rendered).
  int64_t prompt_tokens(const GenerationRequest& r, const std::string& param);
  // Anthropic's POST /v1/messages/count_tokens and OpenAI's POST /v1/responses/input_tokens.
  void handle_count_tokens(const httplib::Request& req, httplib::Response& res);
  void handle_input_tokens(const httplib::Request& req, httplib::Response& res);
  // Ollama's POST /api/chat (`chat`) and POST /api/generate.
  void handle_ollama(const httplib::Request& req, httplib::Response& res, bool chat);
  // What Ollama's /api/tags, /api/show and /api/ps say of the model or of the adapter `id`.
  OllamaModel ollama_model(const std::string& id) const;
  // Ollama's GET /api/tags, POST /api/show, GET /api/ps, GET /api/version, POST /api/pull, and
  // its model store's routes, which answer 501.
  void add_ollama_info_routes(httplib::Server& http);
  // vLLM's POST /sleep, POST /wake_up and GET /is_sleeping (its sleep mode's routes, which RL
  // trainers call to free a server's memory between rollouts).
  void add_sleep_routes(httplib::Server& http);
  // OpenAI's /v1/audio/transcriptions (`translate`: /v1/audio/translations).
  void handle_transcription(const httplib::Request& req, httplib::Response& res, bool translate);
  // Answers a job in a wire format of its own (wire.h): whole, or as the renderer's events.
  // `jobs` (one, or a clip's pieces) answer one after another as one answer.
  void answer_rendered(httplib::Response& res, Choices jobs, std::shared_ptr<Renderer> renderer,
                       bool stream, std::shared_ptr<Active> active);
  // The piece's logprobs to the renderer, when the job asked for them.
  void pass_logprobs(const Job& job, const Piece& piece, Renderer& renderer) const;
  // The jobs' ending (the last one's) and token counts (their sums).
  GenerationOutcome outcome(const Choices& jobs, const std::string& reasoning) const;
  // What one call of a stream's `next` says of the answer: more to come, ended by the events it
  // gave, or cut (a cancelled job: the connection closes with no ending).
  enum class StreamStep { kMore, kEnd, kCut };
  // Streams an answer as `content_type`: each call of `next` appends the events of what the jobs
  // produced next to its string. The headers every stream carries, a client that left (its jobs
  // abandoned) and the engine done with the jobs before the connection closes are here, for
  // every wire format.
  void stream_events(httplib::Response& res, const std::string& content_type, const Choices& jobs,
                     std::shared_ptr<Active> active, std::function<StreamStep(std::string&)> next);
  void stream_response(httplib::Response& res, Choices jobs, bool chat, bool include_usage,
                       std::shared_ptr<Active> active);
  void answer_whole(httplib::Response& res, const Choices& jobs, bool chat);
  void enqueue(const Choices& jobs);
  // Waits until one of the jobs (of one request) produced something or ended, the first such
  // from `jobs[from]` on, watching the client meanwhile. A job's end is taken once.
  // `held`: choices whose pieces wait, as if none had come.
  Taken take(const Choices& jobs, size_t from = 0,
             const std::function<bool(size_t)>& held = nullptr);
  // The client went away: drop each job that has not ended if it still waits, else let the
  // engine notice.
  void abandon(const Choices& jobs);
  // abandon() for every job submitted and not ended (a stop asked for twice).
  void abandon_all();
  // A cancelled job's answer: 503 shutting_down when abandon_all() cancelled it (a client may
  // retry elsewhere), else 499 client_closed_request, which the logs and /metrics show (its
  // client left, or only shut down its sending side, which is taken as leaving).
  [[noreturn]] void throw_cancelled() const;
  void wait_done(Job& job);
  ojson engine_json() const;
  // llama-server's GET /props: what clients written for it read to find the context, the slots,
  // the modalities and what the chat template supports.
  ojson props_json() const;
  // llama-server's GET /slots: each row of the batch, busy or free, without its prompt.
  ojson slots_json() const;
  // llama-server's POST /slots/{id}?action=save|restore|erase: a row's prefix state to and from
  // a file in --slot-save-path (Scheduler::slot).
  void slot_action(const httplib::Request& req, httplib::Response& res, const std::string& id);
  // The load gauges' figures at this moment.
  EngineLoad engine_load();
  // 404 model_not_found unless `name` is empty, one of the model's names or a LoRA adapter's.
  void check_model(const std::string& name) const;
  ojson model_json(const std::string& name) const;
  // The LoRA adapters loaded now: the engine's, or --lora's before it is built.
  std::vector<LoraReport> adapters() const;
  // DecodeOptions::lora for a request: its `lora` list (400 for an adapter not loaded), else the
  // adapter its `model` names at scale 1 (vLLM's way), else none: each adapter at its scale
  // (POST /lora-adapters) when the request starts.
  std::optional<std::map<std::string, double>> lora_for(const GenerationRequest& r) const;
  // Scales by adapter name for scales by id (the order of GET /lora-adapters), those at 0 left
  // out (as those not given); 400 naming `param` for an id past the adapters loaded.
  std::map<std::string, double> lora_scales_by_id(const std::map<int64_t, double>& by_id,
                                                  const std::string& param) const;
  // llama-server's GET /lora-adapters: [{"id", "path", "scale"}] plus each adapter's name.
  ojson lora_adapters_json() const;
  // The adapters loaded now with their ids (lora_ids_), in the ids' order.
  std::vector<std::pair<int64_t, LoraReport>> adapters_by_id() const;
  // vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (--runtime-lora).
  void load_lora_adapter(const httplib::Request& req, httplib::Response& res);
  void unload_lora_adapter(const httplib::Request& req, httplib::Response& res);
  // 403 naming --runtime-lora unless it was given.
  void check_runtime_lora() const;
  ojson timings_json(const Job& job) const;
  // The envelope every response and stream chunk of one completion shares around its choices.
  ojson completion_json(const std::string& id, const char* object, int64_t created,
                        ojson choices) const;
  ojson chat_logprobs_json(const std::vector<TokenLogprob>& entries) const;
  // Completions' shape for a piece's tokens; `offset` is where the first token's text starts,
  // advanced past the last. `echo` (a choice's first piece, the request echoing): the prompt's
  // tokens first, its first token with null logprobs as nothing scores it.
  ojson completion_logprobs_json(const Job& job, const Piece& piece, bool echo,
                                 size_t& offset) const;
  // vLLM's prompt_logprobs of a job's prompt, scored in `entries`: null for the first token,
  // then for each token {id: {logprob, rank, decoded_token}} of it and its best alternatives.
  ojson prompt_logprobs_json(const Job& job, const std::vector<TokenLogprob>& entries) const;
  std::string endpoint_label(const std::string& path) const;

  // What the MCP tools at /mcp may read for their images and audio: nothing, or the files inside
  // --mcp-media-dir within the media limits. Throws ValueError for a --mcp-media-dir that is no
  // directory.
  static McpFiles mcp_files(const ServeOptions& options) {
    McpFiles files;
    if (!options.mcp_media_dir.empty()) files = mcp_media_directory(options.mcp_media_dir);
    files.max_items = options.media.max_items;
    files.max_image_bytes = options.media.max_image_bytes;
    files.max_audio_bytes = options.media.max_audio_bytes;
    return files;
  }

  ServeOptions options_;
  EngineFactory make_engine_;
  // Parsed as the server is built, so that a bad value is refused before it serves; load() sets
  // the checkpoint directory once the demo checkpoint is written where there is one.
  EngineOptions engine_options_;
  bool demo_ = false;
  std::vector<std::string> model_names_;  // the model's id first, then its aliases
  std::string model_id_;
  std::string fingerprint_;
  int64_t created_ = unix_seconds();
  Metrics metrics_;

  std::atomic<State> state_{State::kLoading};
  // What the checkpoint reads besides text; written by load() before state_ becomes kWarmingUp.
  Modalities modalities_;
  // Why the engine thread ended early: loading or warming up failed, or the scheduler did.
  std::exception_ptr engine_error_;
  // Written by the engine thread before state_ becomes kWarmingUp, read-only afterwards.
  std::unique_ptr<Engine> engine_;
  std::optional<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> template_;
  std::vector<bool> special_;         // hidden from completions
  std::set<int64_t> parser_markers_;  // special tokens the output parser reads
  // Constrained decoding over the tokenizer's vocabulary, built by the first constrained request
  // (about 2 s for 262,144 tokens, which servers that never constrain should not pay at load);
  // and the special tokens of Gemma 4's tool calls and thinking block that its grammars name
  // (none for a tokenizer without them).
  mutable std::once_flag grammar_vocabulary_once_;
  mutable std::shared_ptr<const GrammarVocabulary> grammar_vocabulary_;
  // The tokens that end every reply: the checkpoint's eos ids and Gemma 4's end of turn (first:
  // the token a complete grammar offers), which ends a turn even where the checkpoint's eos
  // list leaves it out.
  std::vector<int64_t> reply_end_ids_;
  std::optional<ToolCallTokens> tool_call_tokens_;
  std::optional<int64_t> turn_open_;  // <|turn>, which opens each turn of a chat prompt
  std::optional<ThinkingMarkers> thinking_markers_;
  ChatTemplate::Caps template_caps_;
  std::vector<int64_t> reasoning_budget_message_;  // options_.reasoning_budget_message's tokens
  SamplingRequest generation_defaults_;
  std::vector<ForcedOutput> forced_outputs_;
  ResponseStore responses_;  // for previous_response_id and GET /v1/responses/{id}
  double load_s_ = 0;
  double warmup_s_ = 0;
  std::string model_dir_;

  // Generation requests not yet fully answered; shutdown waits for none to be left, because
  // httplib's stop() cuts streams that are still being written.
  std::mutex active_mutex_;
  std::condition_variable active_changed_;
  int64_t active_ = 0;
  // Every job submitted and not ended, for abandon_all().
  std::mutex live_mutex_;
  std::map<const Job*, std::weak_ptr<Job>> live_;
  std::atomic<bool> abandoned_all_{false};  // abandon_all() was called

  // Requests in flight that apply each adapter (a nonzero scale), by name, waiting for a row and
  // in one.
  mutable std::mutex lora_mutex_;
  std::condition_variable lora_changed_;
  std::map<std::string, int64_t> lora_waiting_, lora_running_;
  // Adapters being unloaded: requests can no longer name them, and those waiting under them
  // start (taking the adapter with them) before the engine lets them go.
  std::set<std::string> lora_unloading_;
  // The adapters' names in the order they were loaded: an adapter's id (a request's `lora`,
  // /lora-adapters) is its place here, which no unload shifts and no later load reuses.
  std::vector<std::string> lora_ids_;
  class LoraUse;  // held by the scheduler's callbacks: these members are declared before it
  Scheduler scheduler_;
  const McpFiles mcp_files_;

  std::atomic<int64_t> open_connections_{0};  // counted by CountingPool
};

}  // namespace torchtpu::server
