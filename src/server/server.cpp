#include "server/server.h"

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include "build_info.h"
#include "common/error_message.h"
#include "common/errors.h"
#include "common/fnv1a.h"
#include "common/json_type.h"
#include "common/utf8.h"
#include "engine/logprobs.h"
#include "engine/report.h"
#include "engine/scheduler.h"
#include "grammar/constraint.h"
#include "io/config.h"
#include "server/anthropic.h"
#include "server/auth.h"
#include "server/connection.h"
#include "server/demo.h"
#include "server/mcp.h"
#include "server/media_load.h"
#include "server/metrics.h"
#include "server/ollama.h"
#include "server/openai.h"
#include "server/responses.h"
#include "server/stop_strings.h"
#include "server/structured.h"
#include "server/transcription.h"
#include "server/web/web.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/output_parser.h"
#include "text/tokenizer.h"

namespace torchtpu::server {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kEngineThreadName = "torchtpu-engine";  // at most 15 characters

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A 500 for an exception nothing expected: its message without c10's backtrace, which names the
// process's load addresses and paths; the whole what() goes to the log for whoever runs it.
ApiError internal_error(const std::string& context, const std::exception& e,
                        const std::string& code = "") {
  std::cerr << "torchtpu-cpp serve: " << context << e.what() << "\n";
  return ApiError(500, context + error_message(e), "server_error", "", code);
}

// A prompt past the context: the 400 context_length_exceeded of the OpenAI routes (which LiteLLM
// and LangChain key on), with the counts for a route that words it its own way.
struct PromptTooLong : ApiError {
  PromptTooLong(const std::string& message, const std::string& param, int64_t tokens,
                int64_t context)
      : ApiError(400, message, "invalid_request_error", param, "context_length_exceeded"),
        tokens(tokens),
        context(context) {}
  int64_t tokens;
  int64_t context;
};

// Where a chat prompt's turns begin that other prompts part from, for the prefix cache: the
// second turn, after the system prompt and tools that every conversation of a client starts with,
// and the last turn the client sent, which an edit or another question replaces. The generation
// prompt's own turn ends the prompt, where a state is saved anyway.
std::vector<int64_t> turn_reuse_points(const std::vector<int64_t>& prompt, int64_t turn_open) {
  std::vector<int64_t> starts;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] == turn_open) starts.push_back(static_cast<int64_t>(i));
  }
  if (!starts.empty()) starts.pop_back();
  std::vector<int64_t> points;
  if (starts.size() >= 2) points.push_back(starts[1]);
  if (starts.size() >= 3) points.push_back(starts.back());
  return points;
}

// Every route of a fixed path and the methods it answers: a request's metrics label, and the 405
// (with Allow) of another method on it.
const std::map<std::string, std::string> kRoutes = {{"/", "GET"},
                                                    {"/health", "GET"},
                                                    {"/livez", "GET"},
                                                    {"/ping", "GET, POST"},
                                                    {"/version", "GET"},
                                                    {"/metrics", "GET"},
                                                    {"/v1/models", "GET"},
                                                    {"/v1/engine", "GET"},
                                                    {"/props", "GET"},
                                                    {"/slots", "GET"},
                                                    {"/lora-adapters", "GET, POST"},
                                                    {"/v1/load_lora_adapter", "POST"},
                                                    {"/v1/unload_lora_adapter", "POST"},
                                                    {"/v1/chat/completions", "POST"},
                                                    {"/v1/completions", "POST"},
                                                    {"/tokenize", "POST"},
                                                    {"/detokenize", "POST"},
                                                    {"/apply-template", "POST"},
                                                    {"/v1/responses", "POST"},
                                                    {"/v1/responses/input_tokens", "POST"},
                                                    {"/v1/messages", "POST"},
                                                    {"/v1/messages/count_tokens", "POST"},
                                                    {"/v1/audio/transcriptions", "POST"},
                                                    {"/v1/audio/translations", "POST"},
                                                    {"/api/chat", "POST"},
                                                    {"/api/generate", "POST"},
                                                    {"/api/tags", "GET"},
                                                    {"/api/show", "POST"},
                                                    {"/api/ps", "GET"},
                                                    {"/api/version", "GET"},
                                                    {"/api/embed", "POST"},
                                                    {"/api/embeddings", "POST"},
                                                    {"/api/pull", "POST"},
                                                    {"/api/create", "POST"},
                                                    {"/api/copy", "POST"},
                                                    {"/api/delete", "DELETE"},
                                                    {"/api/push", "POST"},
                                                    {"/mcp", "POST"},
                                                    {"/sleep", "POST"},
                                                    {"/wake_up", "POST"},
                                                    {"/is_sleeping", "GET"}};

// A slot file's name as a client gives it: a plain name inside --slot-save-path (no folder, no
// hidden file, nothing a shell or another system reads differently). 400 otherwise.
void check_slot_filename(const std::string& name) {
  const auto bad = [&](const std::string& why) {
    throw ApiError(400, "invalid slot filename \"" + name + "\": " + why, "invalid_request_error",
                   "filename");
  };
  if (name.empty()) bad("it is empty");
  if (name.size() > 255) bad("it is longer than 255 bytes");
  if (name.front() == '.') bad("it starts with a dot");
  if (name.back() == '.' || name.back() == ' ') bad("it ends with a dot or a space");
  for (const unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) bad("it holds a control character");
    if (std::string_view("/\\:*?\"<>|").find(static_cast<char>(c)) != std::string_view::npos) {
      bad(std::string("it holds '") + static_cast<char>(c) + "'");
    }
  }
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The one process-wide resource: a pipe that request_stop() writes a byte into. Signal handlers may
// only make async-signal-safe calls, and write() is one; run() waits on the read end. It is created
// before main() so request_stop() never has to create it.
struct StopPipe {
  int read_fd = -1;
  int write_fd = -1;
  StopPipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
      read_fd = fds[0];
      write_fd = fds[1];
    }
  }
};
const StopPipe stop_pipe;

void on_stop_signal(int) { request_stop(); }

// Restores the previous SIGINT/SIGTERM/SIGPIPE actions when run() returns.
class SignalHandlers {
 public:
  explicit SignalHandlers(bool install) : installed_(install) {
    if (!install) return;
    struct sigaction stop {};
    stop.sa_handler = on_stop_signal;
    sigemptyset(&stop.sa_mask);
    sigaction(SIGINT, &stop, &old_int_);
    sigaction(SIGTERM, &stop, &old_term_);
    // A client that goes away must not kill the server.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &old_pipe_);
  }
  ~SignalHandlers() {
    if (!installed_) return;
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGPIPE, &old_pipe_, nullptr);
  }
  SignalHandlers(const SignalHandlers&) = delete;
  SignalHandlers& operator=(const SignalHandlers&) = delete;

 private:
  bool installed_;
  struct sigaction old_int_ {
  }, old_term_{}, old_pipe_{};
};

// What the engine thread hands the HTTP thread: text parts, the logprobs of the tokens they came
// from, and a warning for output the parser could not read (returned as content).
struct Piece : OutputDelta {
  std::vector<TokenLogprob> logprobs;
  // The prompt's tokens after its first, scored (Job::prompt_top()), with the first tokens' piece.
  std::vector<TokenLogprob> prompt_logprobs;
  std::string warning;
  bool empty() const {
    return content.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty() &&
           prompt_logprobs.empty() && warning.empty();
  }
};

void append(OutputDelta& into, OutputDelta&& more) {
  into.content += more.content;
  into.reasoning += more.reasoning;
  for (auto& call : more.tool_calls) into.tool_calls.push_back(std::move(call));
}

void append(Piece& into, Piece&& more) {
  append(static_cast<OutputDelta&>(into), std::move(more));
  for (auto& lp : more.logprobs) into.logprobs.push_back(std::move(lp));
  for (auto& lp : more.prompt_logprobs) into.prompt_logprobs.push_back(std::move(lp));
  if (!more.warning.empty()) into.warning += (into.warning.empty() ? "" : " ") + more.warning;
}

// TORCHTPU_TEST_FORCED_OUTPUT=FILE, a test hook: FILE holds a JSON array of
// {"prompt_contains": TEXT, "output": TEXT}; a request whose rendered prompt contains the first
// matching TEXT gets the tokens of that output instead of the model's, counted and given logprobs
// (under the model's real logits) like sampled ones, ending with finish "stop".
struct ForcedOutput {
  std::string prompt_contains;
  std::string output;
};

std::vector<ForcedOutput> read_forced_outputs() {
  const char* path = std::getenv("TORCHTPU_TEST_FORCED_OUTPUT");
  if (!path || !*path) return {};
  std::ifstream file(path);
  if (!file) throw NotFoundError(std::string("TORCHTPU_TEST_FORCED_OUTPUT: cannot read ") + path);
  std::vector<ForcedOutput> rules;
  try {
    for (const auto& rule : nlohmann::json::parse(file)) {
      rules.push_back(
          {rule.at("prompt_contains").get<std::string>(), rule.at("output").get<std::string>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(std::string("TORCHTPU_TEST_FORCED_OUTPUT ") + path +
                      ": expected [{\"prompt_contains\", \"output\"}, ...]: " + json_error_text(e));
  }
  std::cerr << "torchtpu-cpp serve: TEST HOOK: outputs forced from " << path << "\n";
  return rules;
}

// generation_config.json's sampling fields: a request's defaults. do_sample false means greedy.
SamplingRequest read_generation_defaults(const std::string& model_dir) {
  SamplingRequest d;
  const auto path = std::filesystem::path(model_dir) / "generation_config.json";
  std::ifstream file(path);
  if (!file) return d;
  nlohmann::json g;
  try {
    g = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number beyond double's range (1e999) is out_of_range.
    throw FormatError(path.string() + " is not valid JSON: " + json_error_text(e));
  }
  auto number = [&](const char* key) -> std::optional<double> {
    if (g.contains(key) && g[key].is_number()) return g[key].get<double>();
    return std::nullopt;
  };
  d.temperature = number("temperature");
  d.top_p = number("top_p");
  d.min_p = number("min_p");
  d.repetition_penalty = number("repetition_penalty");
  if (g.contains("top_k") && g["top_k"].is_number_integer()) d.top_k = g["top_k"].get<int64_t>();
  if (g.contains("do_sample") && g["do_sample"] == false) d.temperature = 0.0;
  return d;
}

// Where the engine thread leaves a request's output for its HTTP thread: one per request, shared
// by its choices' jobs, so that thread can wait for whichever choice has something.
struct Mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<bool> cancel_counted{false};  // the request's cancel is in the metrics
};

// One sequence of a generation request (one of its `n` choices), shared by the HTTP thread that
// answers it and the engine thread.
struct Job {
  // Set before the job is queued, read-only afterwards.
  std::vector<int64_t> prompt;  // placeholders expanded: one id per soft token of each medium
  std::vector<Media> media;     // in the order of their soft tokens in the prompt
  DecodeOptions decode;
  std::vector<std::string> stop;
  bool parse_output = false;  // chat: split reasoning and tool calls out of the content
  // Text already in the prompt that the output continues (tool_choice "required" or a named
  // function prefill the call's opening), fed to the parser first.
  std::string parser_prefix;
  std::set<std::string> callable;  // GenerationRequest's
  bool one_call = false;  // parallel_tool_calls false: the first call is kept, later ones dropped
  int64_t top_logprobs = -1;                   // -1: no logprobs
  // Completions' echo: the prompt's text, which the answer's text starts with.
  std::optional<std::string> echo;
  // false (max_tokens 0 with echo): the one token the engine decodes is dropped, so the answer is
  // the prompt alone, ending for its "length".
  bool generates = true;
  int64_t prompt_logprobs = -1;  // vLLM's prompt_logprobs: alternatives per token; -1: none
  // A later choice of an answer whose prompt is scored: choice 0 scores it and this one shows its
  // entries (answer_whole; streamed, stream_response holds this choice's chunks until choice 0's
  // first has gone), reading the prompt as any sequence does.
  bool shares_prompt_scores = false;
  std::optional<std::vector<int64_t>> forced;  // the test hook's tokens
  int fd = -1;                                 // the client's connection, watched for disconnects
  int64_t choice = 0;  // its index among its prompt's choices (completions may list prompts)
  Clock::time_point queued_at = Clock::now();
  int64_t ticket = -1;  // the scheduler's, set once submitted

  std::atomic<bool> cancelled{false};  // the client went away

  std::shared_ptr<Mailbox> box = std::make_shared<Mailbox>();  // guards what follows
  Piece pending;  // produced and not yet taken by the HTTP thread
  bool done = false;
  bool reported = false;  // the HTTP thread took its end (take)
  std::string finish;         // stop | length | tool_calls | cancelled
  std::string stop_sequence;  // the stop sequence that ended it, "" for none
  DecodeResult result;
  double queue_s = 0;
  std::optional<ApiError> error;

  // Alternatives scored per prompt token (for echo's logprobs and prompt_logprobs, the larger);
  // -1: the prompt is not scored.
  int64_t prompt_top() const {
    return std::max(echo && top_logprobs >= 0 ? top_logprobs : int64_t{-1}, prompt_logprobs);
  }

  bool client_gone() {
    if (!cancelled && peer_closed(fd)) cancelled = true;
    return cancelled;
  }

  // Choice `index` of the same request: the same prompt and settings and the same mailbox, and
  // with a seed, the seed plus `index`, so each choice draws its own tokens and a choice can be
  // reproduced alone. A constraint steps through one sequence, so the sibling takes a fresh one
  // of the same grammar (none when this job has none).
  std::shared_ptr<Job> sibling(int64_t index, std::shared_ptr<Constraint> constraint) const {
    auto job = std::make_shared<Job>();
    job->prompt = prompt;
    job->media = media;
    job->decode = decode;
    job->decode.constraint = std::move(constraint);
    if (decode.sampling.seed) job->decode.sampling.seed = *decode.sampling.seed + index;
    job->stop = stop;
    job->parse_output = parse_output;
    job->parser_prefix = parser_prefix;
    job->callable = callable;
    job->one_call = one_call;
    job->top_logprobs = top_logprobs;
    job->echo = echo;
    job->generates = generates;
    job->prompt_logprobs = prompt_logprobs;
    job->forced = forced;
    job->fd = fd;
    job->choice = index;
    job->box = box;
    return job;
  }
};

// A request's jobs, choice 0 first.
using Choices = std::vector<std::shared_ptr<Job>>;

// A job's output as the engine thread produces it: raw model text -> stop sequences cut ->
// (chat) reasoning and tool calls split out. Only the engine thread touches it.
class JobOutput {
 public:
  JobOutput(const Tokenizer& tokenizer, const Job& job)
      : detokenizer(tokenizer, /*show_special_tokens=*/true), stops(job.stop) {
    if (!job.parser_prefix.empty()) parser_.push(job.parser_prefix);
  }

  // The piece `kept`, text the stop sequences let through, adds to the answer; `last` after the
  // final text.
  Piece route(const Job& job, std::string kept, bool last, std::vector<TokenLogprob>&& logprobs) {
    if (last && !stops.stopped()) kept += stops.finish();
    Piece delta;
    delta.logprobs = std::move(logprobs);
    if (!job.parse_output) {
      delta.content = std::move(kept);
      return delta;
    }
    OutputDelta parsed = parser_.push(kept);
    if (last || stops.stopped()) append(parsed, parser_.finish());
    delta.content = std::move(parsed.content);
    delta.reasoning = std::move(parsed.reasoning);
    for (auto& call : parsed.tool_calls) {
      const bool allowed = job.callable.count(call.name) > 0;
      if (allowed && job.one_call && called) continue;
      if (allowed) {
        delta.tool_calls.push_back(std::move(call));
        called = true;
        continue;
      }
      refuse(delta, call.text,
             "the model called '" + call.name +
                 "', which is not among the functions this request lets it call (its tools, "
                 "as tool_choice allows them); the call is returned as text.");
    }
    const std::string unparsed = parser_.raw_unparsed();
    if (unparsed.size() > unparsed_seen_) {
      refuse(delta, unparsed.substr(unparsed_seen_),
             parser_.cut_off_call() && last
                 ? "the output ended inside a tool call; its text is returned as content."
                 : "the model's tool call could not be parsed; its text is returned as content.");
      unparsed_seen_ = unparsed.size();
    }
    return delta;
  }

  Detokenizer detokenizer;
  StopStrings stops;
  bool started = false;  // the job got a row
  bool called = false;   // a tool call was handed to the client
  // `text` of the output as the stop sequences let it through: never matched inside a tool call.
  std::string through_stops(std::string_view text) { return stops.push(text, in_call); }
  bool in_call = false;  // the output is inside <|tool_call> ... <tool_call|>
  // log_softmax rows of steps whose token has not reached the host yet, oldest first.
  std::deque<at::Tensor> logprob_rows;
  std::vector<TokenLogprob> prompt_logprobs;  // scored, not yet handed over
  size_t position = 0;  // tokens returned so far
  std::optional<Clock::time_point> last_tokens_at;  // when the engine last handed tokens over

 private:
  // A call the client cannot take is handed back as the text it was, with a warning.
  static void refuse(Piece& delta, const std::string& text, const std::string& why) {
    delta.content += text;
    delta.warning += (delta.warning.empty() ? "" : " ") + why;
  }

  OutputParser parser_;
  size_t unparsed_seen_ = 0;
};

struct Taken {
  size_t choice = 0;  // which of the request's jobs
  Piece delta;
  bool done = false;
};

// Counts one generation request as active for as long as it lives.
class Active {
 public:
  Active(std::mutex& mutex, std::condition_variable& changed, int64_t& count)
      : mutex_(mutex), changed_(changed), count_(count) {
    std::lock_guard lock(mutex_);
    ++count_;
  }
  ~Active() {
    {
      std::lock_guard lock(mutex_);
      --count_;
    }
    changed_.notify_all();
  }
  Active(const Active&) = delete;
  Active& operator=(const Active&) = delete;

 private:
  std::mutex& mutex_;
  std::condition_variable& changed_;
  int64_t& count_;
};

// Idle keep-alive connections hold shutdown back for at most this long.
constexpr int kKeepAliveSeconds = 2;

// Which API's error object a route answers with.
enum class ErrorShape { kOpenAI, kAnthropic, kOllama };

// The names the model is served under: the id (--model-id, else the first --served-model-name,
// else the demo's id or the checkpoint directory's name), then the other aliases, each once.
SchedulerOptions scheduler_options(const ServeOptions& options) {
  SchedulerOptions o;
  o.batch.rows = options.parallel;
  o.batch.cache_bytes = options.cache_mb << 20;
  o.batch.step_tokens = options.step_tokens;
  o.batch.pass_rows = options.pass_rows;
  o.max_queue = options.max_queue;
  o.read_every = options.read_every;
  o.sleep_idle_s = options.sleep_idle_s;
  o.sleep_preserve_cache = options.sleep_preserve_cache;
  return o;
}

std::vector<std::string> model_names(const ServeOptions& options) {
  std::vector<std::string> names;
  if (!options.model_id.empty()) names.push_back(options.model_id);
  for (const auto& name : options.served_model_names) {
    if (name.empty()) throw ValueError("--served-model-name must not be empty");
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  if (names.empty()) {
    if (options.model_dir.empty()) {
      names.push_back(kDemoModelId);
    } else if (hub::looks_like_repo_id(options.model_dir)) {
      names.push_back(options.model_dir.substr(0, options.model_dir.find('@')));  // vLLM's name
    } else {
      auto path = std::filesystem::path(options.model_dir).lexically_normal();
      if (!path.has_filename()) path = path.parent_path();
      names.push_back(path.filename().string());
    }
  }
  return names;
}

// httplib's thread pool, counting the connections it holds, queued or being served. httplib's
// stop() closes a connection whose request it has not started to read, and the client, whose
// request was accepted, sees a reset; shutdown waits for this count to reach 0 first.
class CountingPool : public httplib::TaskQueue {
 public:
  CountingPool(size_t threads, std::atomic<int64_t>& open) : pool_(threads), open_(open) {}

  void enqueue(std::function<void()> fn) override {
    ++open_;
    pool_.enqueue([this, fn = std::move(fn)] {
      struct Closed {
        std::atomic<int64_t>& open;
        ~Closed() { --open; }
      } closed{open_};
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
  std::atomic<int64_t>& open_;
};

class Server {
 public:
  Server(const ServeOptions& options, EngineFactory make_engine)
      : options_(options),
        make_engine_(std::move(make_engine)),
        engine_options_(options.engine.options("")),
        model_names_(model_names(options)),
        model_id_(model_names_.front()),
        metrics_(parse_metrics_compat(options.metrics_compat), model_id_),
        scheduler_(scheduler_options(options)),
        mcp_files_(mcp_files(options)) {
    demo_ = options.model_dir.empty();
    fingerprint_ = std::string("fp_torchtpu_cpp_") + TORCHTPU_GIT_REVISION;
    for (const auto& spec : engine_options_.lora) lora_ids_.push_back(spec.name);
  }

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

void Server::load() {
  const auto start = Clock::now();
  EngineOptions engine_options = engine_options_;
  engine_options.model_dir = demo_ ? ensure_demo_checkpoint() : options_.model_dir;
  // Downloads here, while /health says the model is loading (llama-server's -hf).
  engine_options = resolve_hub_ids(std::move(engine_options), hub::Options::from_env());
  model_dir_ = engine_options.model_dir;
  engine_ = make_engine_ ? make_engine_(engine_options) : std::make_unique<Engine>(engine_options);
  if (!engine_) throw std::runtime_error("the engine factory returned no engine");
  tokenizer_ = model_tokenizer((std::filesystem::path(model_dir_) / "tokenizer.json").string(),
                               engine_->config().vocab_size);
  try {
    template_ = ChatTemplate::from_dir(model_dir_);
  } catch (const NotFoundError&) {
    std::cerr << "torchtpu-cpp serve: " << model_dir_
              << " has no chat template; using Gemma 4's (google/gemma-4-E2B-it)\n";
    template_ = ChatTemplate::from_string(gemma4_chat_template());
  }
  template_caps_ = template_->caps();
  const int64_t vocab = tokenizer_->vocab_size();
  special_.assign(vocab, false);
  for (int64_t id = 0; id < vocab; ++id) special_[id] = tokenizer_->is_special(id);
  for (const char* marker :
       {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>"}) {
    if (auto id = tokenizer_->token_to_id(marker)) parser_markers_.insert(*id);
  }
  {
    reply_end_ids_ = grammar_end_ids(*tokenizer_, engine_->config().eos_token_ids);
    const auto open = tokenizer_->token_to_id("<|tool_call>");
    const auto close = tokenizer_->token_to_id("<tool_call|>");
    const auto quote = tokenizer_->token_to_id("<|\"|>");
    if (open && close && quote) tool_call_tokens_ = ToolCallTokens{*open, *close, *quote};
    turn_open_ = tokenizer_->token_to_id("<|turn>");
    thinking_markers_ = thinking_markers(*tokenizer_);
    reasoning_budget_message_ = tokenizer_->encode(options_.reasoning_budget_message);
    for (const int64_t id : reasoning_budget_message_) {
      if (thinking_markers_ && (id == thinking_markers_->open || id == thinking_markers_->close)) {
        throw ValueError("--reasoning-budget-message must not hold the thinking block's " +
                         tokenizer_->decode({id}) + " marker");
      }
    }
  }
  modalities_ = {engine_->has_vision(), engine_->has_audio(),
                 engine_->config().vision && !engine_->has_vision(),
                 engine_->config().audio && !engine_->has_audio()};
  // The demo's random weights decode greedily unless asked, so its answers are reproducible.
  if (!demo_) generation_defaults_ = read_generation_defaults(model_dir_);
  forced_outputs_ = read_forced_outputs();
  load_s_ = seconds_between(start, Clock::now());
}

void Server::worker_main() {
  pthread_setname_np(pthread_self(), kEngineThreadName);
  try {
    load();
    // The rows the scheduler makes once the warm-up's ring is gone, refused before the warm-up
    // touches any memory (read_every > 1 runs one sequence, which --parallel 1 then is).
    engine_->check_rings_fit(options_.parallel);
    state_ = State::kWarmingUp;
    const auto start = Clock::now();
    DecodeOptions warm;
    warm.max_new = 4;
    warm.read_every = options_.read_every;
    warm.ignore_eos = true;
    engine_->decode(tokenizer_->encode("Hello", /*add_special_tokens=*/true), warm);
    warmup_s_ = seconds_between(start, Clock::now());
    State loading = State::kWarmingUp;
    state_.compare_exchange_strong(loading, State::kReady);
    scheduler_.run(*engine_);
  } catch (...) {
    // A failed load or warm-up, or a scheduler that could not go on (its batch's rows no longer
    // fitting the memory taken meanwhile): the server ends with the error.
    engine_error_ = std::current_exception();
    state_ = State::kFailed;
    request_stop();
  }
  // The engine ends on the thread that owns it.
  engine_.reset();
}

void Server::deliver(Job& job, Piece&& delta) {
  if (delta.empty()) return;
  {
    std::lock_guard lock(job.box->mutex);
    append(job.pending, std::move(delta));
  }
  job.box->changed.notify_all();
}

void Server::finish_job(Job& job, const std::string& finish, std::optional<ApiError> error) {
  if (finish == "cancelled" && !job.box->cancel_counted.exchange(true)) {
    metrics_.count_cancelled();  // once a request
  }
  {
    std::lock_guard lock(job.box->mutex);
    job.finish = finish;
    job.error = std::move(error);
    job.done = true;
  }
  job.box->changed.notify_all();
  std::lock_guard lock(live_mutex_);
  live_.erase(&job);
}

// One request's place in Server's LoRA counts: waiting from its submission, running from its
// row, counted out when it ends (before its caller hears, as the load gauges drop it), or when
// the scheduler lets its callbacks go without an end (a refused submission).
class Server::LoraUse {
 public:
  LoraUse(Server& server, const std::optional<std::map<std::string, double>>& scales)
      : server_(server) {
    if (scales) {
      for (const auto& [name, scale] : *scales) {
        if (scale != 0) adapters_.push_back(name);
      }
    } else {
      for (const auto& a : server.adapters()) {
        if (a.spec.scale != 0) adapters_.push_back(a.spec.name);
      }
    }
    count(server_.lora_waiting_, +1);
  }
  ~LoraUse() { end(); }
  LoraUse(const LoraUse&) = delete;
  LoraUse& operator=(const LoraUse&) = delete;
  void start() {
    count(server_.lora_waiting_, -1);
    count(server_.lora_running_, +1);
    started_ = true;
  }
  void end() {
    if (std::exchange(ended_, true)) return;
    count(started_ ? server_.lora_running_ : server_.lora_waiting_, -1);
  }

 private:
  void count(std::map<std::string, int64_t>& counts, int64_t step) {
    if (adapters_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(server_.lora_mutex_);
      for (const auto& name : adapters_) {
        if ((counts[name] += step) == 0) counts.erase(name);
      }
    }
    server_.lora_changed_.notify_all();
  }

  Server& server_;
  std::vector<std::string> adapters_;
  bool started_ = false, ended_ = false;
};

Submission Server::submission(const std::shared_ptr<Job>& job) {
  auto out = std::make_shared<JobOutput>(*tokenizer_, *job);
  Submission submission;
  submission.prompt = job->prompt;
  submission.media = job->media;
  submission.options = job->decode;
  auto lora = std::make_shared<LoraUse>(*this, job->decode.lora);
  submission.on_start = [job, out, lora] {
    out->started = true;
    lora->start();
    job->queue_s = seconds_between(job->queued_at, Clock::now());
  };
  if (job->top_logprobs >= 0) {
    submission.on_logits = [out](const at::Tensor& logits) {
      out->logprob_rows.push_back(at::log_softmax(logits.to(at::kFloat), 0));
    };
  }
  if (const int64_t top = job->prompt_top(); top >= 0 && !job->shares_prompt_scores) {
    submission.options.prompt_logits = [job, out, top](const at::Tensor& logits, int64_t first) {
      append_prompt_logprobs(logits, first, job->prompt, top, out->prompt_logprobs);
    };
  }
  submission.on_tokens = [this, job, out](const std::vector<int64_t>& batch) {
    const auto now = Clock::now();
    if (out->last_tokens_at) {
      metrics_.observe_inter_token_latency(seconds_between(*out->last_tokens_at, now));
    }
    out->last_tokens_at = now;
    std::string text;
    std::vector<TokenLogprob> logprobs;
    for (int64_t id : batch) {
      // A batch (read_every above 1, accepted drafts) may go on past a stop string's end: the
      // answer, its logprobs and its usage end there.
      if (!job->generates || out->stops.stopped()) break;
      if (job->forced) id = (*job->forced)[out->position];
      ++out->position;
      // Stop sequences match the answer's text, never inside a marker ("call" in <|tool_call>)
      // or a tool call: either would hand the client half of the markup as content.
      if (!special_[id]) {
        text += out->through_stops(out->detokenizer.push(id));
      } else if (job->parse_output && parser_markers_.count(id) > 0) {
        std::string piece = out->detokenizer.push(id);
        const std::string& marker = tokenizer_->id_to_token(id);
        const size_t before = piece.size() - std::min(piece.size(), marker.size());
        text += out->through_stops(std::string_view(piece).substr(0, before));
        text += out->stops.push(std::string_view(piece).substr(before), /*opaque=*/true);
        if (tool_call_tokens_ && id == tool_call_tokens_->open) out->in_call = true;
        if (tool_call_tokens_ && id == tool_call_tokens_->close) out->in_call = false;
      }
      if (job->top_logprobs < 0) continue;
      const at::Tensor row = std::move(out->logprob_rows.front());
      out->logprob_rows.pop_front();
      logprobs.push_back(token_logprob(row, id, job->top_logprobs, false));
    }
    Piece piece = out->route(*job, text, false, std::move(logprobs));
    piece.prompt_logprobs = std::move(out->prompt_logprobs);
    out->prompt_logprobs.clear();
    deliver(*job, std::move(piece));
    if (out->stops.stopped()) return false;
    return !job->client_gone();
  };
  submission.on_done = [this, job, out, lora](DecodeResult result, std::exception_ptr error) {
    lora->end();
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const ValueError& e) {
        finish_job(*job, "error", ApiError(400, e.what()));
      } catch (const std::exception& e) {
        finish_job(*job, "error", internal_error("the engine failed: ", e, "engine_error"));
      }
      return;
    }
    if (!out->started) {  // cancelled while it waited
      finish_job(*job, "cancelled");
      return;
    }
    auto& r = job->result = std::move(result);
    if (out->stops.stopped()) r.tokens.resize(std::min(r.tokens.size(), out->position));
    if (!job->generates) {
      r.tokens.clear();
      r.finish = "length";
    }
    if (job->forced) {
      const bool all = r.finish == "length" && r.tokens.size() == job->forced->size();
      r.tokens.assign(job->forced->begin(), job->forced->begin() + r.tokens.size());
      if (all) r.finish = "stop";
    }
    metrics_.count_tokens(r.prompt_tokens, static_cast<int64_t>(r.tokens.size()));
    metrics_.count_drafts(r.drafted, r.accepted);
    metrics_.observe_request({.queue_s = job->queue_s,
                              .prefill_s = r.read_s,
                              .decode_s = r.decode_s,
                              .e2e_s = seconds_between(job->queued_at, Clock::now()),
                              .tokens = static_cast<int64_t>(r.tokens.size())});
    std::string finish = r.finish;
    if (finish == "cancelled" && out->stops.stopped()) finish = "stop";
    job->stop_sequence = out->stops.matched();
    if (finish != "cancelled") {
      if (!out->stops.stopped()) {
        deliver(*job, out->route(*job, out->through_stops(out->detokenizer.finish()), true, {}));
      }
      if (finish == "stop" && out->called) finish = "tool_calls";
    }
    finish_job(*job, finish);
  };
  return submission;
}
void Server::enqueue(const Choices& jobs) {
  std::vector<Submission> submissions;
  for (const auto& job : jobs) {
    job->queued_at = Clock::now();
    submissions.push_back(submission(job));
  }
  // Known before they are submitted: one may end before submit() returns.
  {
    std::lock_guard lock(live_mutex_);
    for (const auto& job : jobs) live_[job.get()] = job;
  }
  try {
    const auto tickets = scheduler_.submit(std::move(submissions));
    for (size_t i = 0; i < jobs.size(); ++i) jobs[i]->ticket = tickets[i];
  } catch (const QueueFull& e) {
    std::lock_guard lock(live_mutex_);
    for (const auto& job : jobs) live_.erase(job.get());
    throw ApiError(429,
                   std::string("the server is busy: ") + e.what() + "; retry later (--max-queue)",
                   "rate_limit_error", "", "queue_full");
  }
}

void Server::abandon(const Choices& jobs) {
  for (const auto& job : jobs) {
    {
      std::lock_guard lock(job->box->mutex);
      if (job->done) continue;
    }
    job->cancelled = true;
    scheduler_.cancel(job->ticket);
  }
}

void Server::abandon_all() {
  abandoned_all_ = true;
  Choices jobs;
  {
    std::lock_guard lock(live_mutex_);
    for (const auto& [key, job] : live_) {
      if (auto held = job.lock()) jobs.push_back(std::move(held));
    }
  }
  abandon(jobs);
}

void Server::throw_cancelled() const {
  if (abandoned_all_) {
    throw ApiError(503,
                   "the server is stopping: a second stop cancelled the requests still being "
                   "answered",
                   "server_error", "", "shutting_down");
  }
  throw ApiError(499,
                 "the client closed the connection before its answer was complete (one that "
                 "only shuts down its sending side is taken as gone too)",
                 "invalid_request_error", "", "client_closed_request");
}

void Server::wait_done(Job& job) {
  std::unique_lock lock(job.box->mutex);
  job.box->changed.wait(lock, [&] { return job.done; });
}

Taken Server::take(const Choices& jobs, size_t from, const std::function<bool(size_t)>& held) {
  Mailbox& box = *jobs.front()->box;
  std::unique_lock lock(box.mutex);
  std::optional<size_t> ready;
  auto find = [&] {
    for (size_t k = 0; k < jobs.size() && !ready; ++k) {
      const size_t i = (from + k) % jobs.size();
      if (held && held(i)) continue;
      const Job& job = *jobs[i];
      if (!job.pending.empty() || (job.done && !job.reported)) ready = i;
    }
    return ready.has_value();
  };
  while (!box.changed.wait_for(lock, std::chrono::milliseconds(50), find)) {
    const Job& first = *jobs.front();
    if (!first.cancelled && peer_closed(first.fd)) {
      lock.unlock();
      abandon(jobs);
      lock.lock();
    }
  }
  Job& job = *jobs[*ready];
  Taken taken{*ready, std::exchange(job.pending, {}), job.done};
  job.reported = job.done;
  return taken;
}

ojson Server::timings_json(const Job& job) const {
  const auto& r = job.result;
  ojson t = {{"queue_s", job.queue_s}, {"read_s", r.read_s}, {"decode_s", r.decode_s}};
  t["decode_tokens_per_second"] = r.tokens.size() > 1 && r.decode_s > 0
                                      ? ojson(static_cast<double>(r.tokens.size() - 1) / r.decode_s)
                                      : ojson(nullptr);
  // llama-server's names for the draft tokens checked and kept.
  if (job.decode.draft.tokens > 0) {
    t["draft_n"] = r.drafted;
    t["draft_n_accepted"] = r.accepted;
  }
  return t;
}

// The token's text, where bytes that are not whole UTF-8 characters show as U+FFFD as in
// OpenAI's answers, and its exact bytes (a byte token's own byte), which joined rebuild the text.
ojson token_entry(const Tokenizer& tokenizer, int64_t id, double logprob) {
  const std::string bytes = tokenizer.token_bytes(id);
  return {{"token", tokenizer.decode({id})},
          {"logprob", logprob},
          {"bytes", std::vector<uint8_t>(bytes.begin(), bytes.end())}};
}

ojson Server::chat_logprobs_json(const std::vector<TokenLogprob>& entries) const {
  ojson content = ojson::array();
  for (const auto& e : entries) {
    ojson entry = token_entry(*tokenizer_, e.id, e.logprob);
    entry["top_logprobs"] = ojson::array();
    for (const auto& [id, logprob] : e.top) {
      entry["top_logprobs"].push_back(token_entry(*tokenizer_, id, logprob));
    }
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

ojson Server::completion_logprobs_json(const Job& job, const Piece& piece, bool echo,
                                       size_t& offset) const {
  ojson out = {{"tokens", ojson::array()},
               {"token_logprobs", ojson::array()},
               {"top_logprobs", ojson::array()},
               {"text_offset", ojson::array()}};
  // `e` null: the prompt's first token.
  auto add = [&](int64_t token, const TokenLogprob* e) {
    const std::string text = tokenizer_->decode({token});
    out["tokens"].push_back(text);
    // In characters of `text`, as OpenAI and vLLM count them.
    out["text_offset"].push_back(offset);
    offset += special_[token] ? 0 : utf8_characters(tokenizer_->token_bytes(token));
    if (!e) {
      out["token_logprobs"].push_back(nullptr);
      out["top_logprobs"].push_back(nullptr);
      return;
    }
    out["token_logprobs"].push_back(e->logprob);
    ojson top = ojson::object();
    // A prompt token's alternatives may be more, for prompt_logprobs: the request's are the best.
    const auto shown = std::min<size_t>(e->top.size(), job.top_logprobs);
    for (size_t i = 0; i < shown; ++i) {
      top[tokenizer_->decode({e->top[i].first})] = e->top[i].second;
    }
    out["top_logprobs"].push_back(std::move(top));
  };
  if (echo) {
    add(job.prompt.front(), nullptr);
    for (const auto& e : piece.prompt_logprobs) add(e.id, &e);
  }
  for (const auto& e : piece.logprobs) add(e.id, &e);
  return out;
}

ojson Server::prompt_logprobs_json(const Job& job, const std::vector<TokenLogprob>& entries) const {
  auto entry = [&](int64_t id, double logprob, int64_t rank) {
    return ojson{{"logprob", logprob}, {"rank", rank}, {"decoded_token", tokenizer_->decode({id})}};
  };
  ojson out = ojson::array({nullptr});
  for (const auto& e : entries) {
    ojson tokens = ojson::object();
    tokens[std::to_string(e.id)] = entry(e.id, e.logprob, e.rank);
    const auto shown = std::min<size_t>(e.top.size(), job.prompt_logprobs);
    for (size_t i = 0; i < shown; ++i) {
      const auto& [id, logprob] = e.top[i];
      tokens[std::to_string(id)] = entry(id, logprob, static_cast<int64_t>(i) + 1);
    }
    out.push_back(std::move(tokens));
  }
  return out;
}

ojson Server::completion_json(const std::string& id, const char* object, int64_t created,
                              ojson choices) const {
  return {{"id", id},
          {"object", object},
          {"created", created},
          {"model", model_id_},
          {"system_fingerprint", fingerprint_},
          {"choices", std::move(choices)}};
}

ojson tool_calls_json(const std::vector<ToolCall>& calls, size_t first_index) {
  ojson out = ojson::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    out.push_back(
        {{"index", first_index + i},
         {"id", new_completion_id("call_")},
         {"type", "function"},
         {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments.dump()}}}});
  }
  return out;
}

// The usage of a request's choices: each prompt once (as its first choice found it in the prefix
// cache), the tokens of every choice.
ojson choices_usage(const Choices& jobs) {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const auto& job : jobs) {
    completion += static_cast<int64_t>(job->result.tokens.size());
    if (job->choice > 0) continue;
    prompt += job->result.prompt_tokens;
    cached += job->result.cached_tokens;
  }
  return usage_json(prompt, completion, cached);
}

void Server::answer_whole(httplib::Response& res, const Choices& jobs, bool chat) {
  std::vector<Piece> all(jobs.size());
  for (size_t left = jobs.size(); left > 0;) {
    Taken taken = take(jobs);
    append(all[taken.choice], std::move(taken.delta));
    if (taken.done) --left;
  }
  for (const auto& job : jobs) {
    if (job->error) throw *job->error;
  }
  for (const auto& job : jobs) {
    if (job->finish == "cancelled") throw_cancelled();
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i]->shares_prompt_scores) {
      all[i].prompt_logprobs = all[i - jobs[i]->choice].prompt_logprobs;
    }
  }
  ojson choices = ojson::array();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = *jobs[i];
    const Piece& piece = all[i];
    ojson choice = {{"index", i}};
    if (chat) {
      ojson message = {{"role", "assistant"}};
      message["content"] = piece.content.empty() && !piece.tool_calls.empty()
                               ? ojson(nullptr)
                               : ojson(piece.content);
      if (!piece.reasoning.empty()) message["reasoning_content"] = piece.reasoning;
      if (!piece.tool_calls.empty()) message["tool_calls"] = tool_calls_json(piece.tool_calls, 0);
      choice["message"] = std::move(message);
      choice["logprobs"] =
          job.top_logprobs >= 0 ? chat_logprobs_json(piece.logprobs) : ojson(nullptr);
    } else {
      size_t offset = 0;
      choice["text"] = job.echo.value_or("") + piece.content;
      choice["logprobs"] = job.top_logprobs >= 0
                               ? completion_logprobs_json(job, piece, job.echo.has_value(), offset)
                               : ojson(nullptr);
      if (job.prompt_logprobs >= 0) {
        choice["prompt_logprobs"] = prompt_logprobs_json(job, piece.prompt_logprobs);
      }
    }
    choice["finish_reason"] = job.finish;
    if (!piece.warning.empty()) choice["warning"] = piece.warning;
    choices.push_back(std::move(choice));
  }
  ojson body = completion_json(new_completion_id(chat ? "chatcmpl-" : "cmpl-"),
                               chat ? "chat.completion" : "text_completion", unix_seconds(),
                               std::move(choices));
  // vLLM puts chat's prompt_logprobs beside the choices, since they share the prompt.
  if (chat && jobs.front()->prompt_logprobs >= 0) {
    body["prompt_logprobs"] = prompt_logprobs_json(*jobs.front(), all.front().prompt_logprobs);
  }
  body["usage"] = choices_usage(jobs);
  body["timings"] = timings_json(*jobs.front());
  res.set_content(dump(body), "application/json");
}

void Server::stream_response(httplib::Response& res, Choices jobs, bool chat, bool include_usage,
                             std::shared_ptr<Active> active) {
  struct Choice {
    size_t tool_calls = 0;
    size_t text_offset = 0;  // completions' logprobs
    bool echoed = false;     // completions' echo: the prompt went out
  };
  struct Stream {
    std::string id;
    int64_t created;
    bool started = false;
    std::vector<Choice> choices;
    size_t ended = 0;  // choices whose last chunk went out
    size_t next = 0;   // the choice take() looks at first, so no choice starves the others
    // Choice 0's prompt entries, once its first piece is taken, for the choices that share them.
    std::optional<std::vector<TokenLogprob>> prompt_scores;
  };
  auto s = std::make_shared<Stream>(Stream{new_completion_id(chat ? "chatcmpl-" : "cmpl-"),
                                           unix_seconds(), false,
                                           std::vector<Choice>(jobs.size())});
  // Every chunk of one completion carries the same id, created, model and fingerprint.
  auto chunk = [this, s, chat, include_usage](ojson choice) {
    ojson c = completion_json(s->id, chat ? "chat.completion.chunk" : "text_completion", s->created,
                              ojson::array({std::move(choice)}));
    if (include_usage) c["usage"] = nullptr;
    return c;
  };
  auto choice = [chat](size_t index, ojson delta_or_text, const ojson& finish) {
    ojson c = {{"index", index}};
    if (chat) {
      c["delta"] = std::move(delta_or_text);
    } else {
      c["text"] = std::move(delta_or_text);
    }
    c["logprobs"] = nullptr;
    c["finish_reason"] = finish;
    return c;
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, jobs, s, chat, include_usage, chunk, choice](size_t, httplib::DataSink& sink) {
        std::string out;
        auto event = [&](const ojson& j) { out += "data: " + dump(j) + "\n\n"; };
        if (!s->started) {
          s->started = true;
          for (size_t i = 0; chat && i < jobs.size(); ++i) {
            event(chunk(choice(i, {{"role", "assistant"}, {"content", ""}}, nullptr)));
          }
        }
        Taken taken = take(jobs, s->next, [&](size_t i) {
          return jobs[i]->shares_prompt_scores && !s->prompt_scores;
        });
        s->next = (taken.choice + 1) % jobs.size();
        const size_t i = taken.choice;
        const Job& job = *jobs[i];
        Choice& state = s->choices[i];
        // Choice 0's first piece holds its prompt's entries: it is taken after the whole prompt
        // was read.
        if (i == 0 && !s->prompt_scores) s->prompt_scores = taken.delta.prompt_logprobs;
        if (job.shares_prompt_scores && !state.echoed) {
          taken.delta.prompt_logprobs = *s->prompt_scores;
        }
        const Piece& d = taken.delta;
        // A choice's first chunk echoes the prompt (completions asked to), before its text.
        const bool echo = job.echo && !std::exchange(state.echoed, true);
        // The logprobs of this piece's tokens ride on its first chunk (on a chunk of their own when
        // the text is still held back by the parser or the stop strings), the warning likewise.
        ojson logprobs = nullptr;
        if (job.top_logprobs >= 0 && (!d.logprobs.empty() || echo)) {
          logprobs = chat ? chat_logprobs_json(d.logprobs)
                          : completion_logprobs_json(job, d, echo, state.text_offset);
        }
        auto send = [&](ojson delta_or_text) {
          ojson c = choice(i, std::move(delta_or_text), nullptr);
          c["logprobs"] = std::move(logprobs);
          logprobs = nullptr;
          if (!d.warning.empty() && d.content.size() > 0 &&
              (chat ? c["delta"].contains("content") : true)) {
            c["warning"] = d.warning;
          }
          event(chunk(std::move(c)));
        };
        if (chat) {
          if (!d.reasoning.empty()) send({{"reasoning_content", d.reasoning}});
          if (!d.content.empty()) send({{"content", d.content}});
          if (!d.tool_calls.empty()) {
            send({{"tool_calls", tool_calls_json(d.tool_calls, state.tool_calls)}});
            state.tool_calls += d.tool_calls.size();
          }
          if (!logprobs.is_null()) send(ojson::object());
        } else if (const std::string text = (echo ? *job.echo : "") + d.content;
                   !text.empty() || !logprobs.is_null()) {
          send(text);
        }
        bool over = false;
        if (taken.done) {
          if (job.finish == "cancelled") {
            abandon(jobs);
            return false;
          }
          if (job.error) {
            // One choice failing ends the response: the stream has no error of a single choice.
            abandon(jobs);
            event(error_body(*job.error));
            over = true;
          } else {
            ojson last = chunk(choice(i, chat ? ojson::object() : ojson(""), job.finish));
            last["timings"] = timings_json(job);
            event(last);
            over = ++s->ended == jobs.size();
            if (over && include_usage) {
              ojson usage = chunk(nullptr);
              usage["choices"] = ojson::array();
              usage["usage"] = choices_usage(jobs);
              event(usage);
            }
          }
          if (over) out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          abandon(jobs);
          return false;
        }
        if (over) sink.done();
        return true;
      },
      // Runs when the response ends, written or not: the engine must be done with the jobs (and
      // their socket) before the connection closes.
      [this, jobs, active](bool) {
        abandon(jobs);
        for (const auto& job : jobs) wait_done(*job);
      });
}

// The request's sampling fields over the checkpoint's defaults over the engine's (greedy), checked
// by the engine's own rules so a bad value is a 400 naming it (its messages start with the name).
SamplingParams sampling_params(const SamplingRequest& r, const SamplingRequest& defaults,
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

std::shared_ptr<Active> Server::admit() {
  auto active = std::make_shared<Active>(active_mutex_, active_changed_, active_);
  // Counted before this check, so shutdown either sees this request or it sees the shutdown.
  if (!takes_requests(state_)) {
    throw ApiError(503, "the server is shutting down", "server_error", "", "shutting_down");
  }
  return active;
}

std::string Server::render_chat(const GenerationRequest& r, std::string& parser_prefix) const {
  std::string prompt =
      template_->render(r.messages, r.tools, /*add_generation_prompt=*/true, r.template_kwargs);
  // After a tool response with thinking on, the template opens the reply's thinking channel
  // itself: the model continues inside it, so its output is parsed from the opening on. The
  // opening is the prompt's end (`<|channel>thought\n`); one in a message's text has the turn's
  // markup after it (`<turn|>`, `<tool_response|>`, every Gemma 4 marker holds "<|" or "|>").
  const size_t open = prompt.rfind(kChannelOpen);
  const bool thinking_open =
      open != std::string::npos &&
      prompt.find("<|", open + kChannelOpen.size()) == std::string::npos &&
      prompt.find("|>", open + kChannelOpen.size()) == std::string::npos;
  parser_prefix = thinking_open ? prompt.substr(open) : "";
  // "required" and a named function are honoured by writing the call's opening into the
  // prompt: the model can only continue it (thinking is skipped then, an open channel closed).
  std::string call;
  if (r.tool_choice == "required") call = "<|tool_call>call:";
  if (r.tool_choice == "function") call = "<|tool_call>call:" + r.tool_choice_function + "{";
  if (!call.empty()) {
    if (thinking_open) call = std::string(kChannelClose) + call;
    prompt += call;
    parser_prefix += call;
  }
  return prompt;
}

std::shared_ptr<Constraint> Server::constraint_for(const GenerationRequest& r, bool chat,
                                                   const std::string& parser_prefix) const {
  std::optional<Grammar> grammar;
  std::string param;
  const bool forced_call = r.tool_choice == "required" || r.tool_choice == "function";
  // allowed_tools (like a named function) leaves every tool in the prompt, so that a
  // conversation whose allowed set changes keeps its prefix cache, and holds the calls to the
  // ones it allows.
  const bool narrowed =
      r.tools.is_array() && !std::all_of(r.tools.begin(), r.tools.end(), [&](const ojson& tool) {
        return r.callable.contains(tool.at("function").at("name").get<std::string>());
      });
  if (chat && forced_call && tool_call_tokens_) {
    grammar = Grammar{GrammarKind::kLark,
                      tool_call_grammar(r.tools, r.callable, *tool_call_tokens_,
                                        r.tool_choice == "function" ? CallStart::kInsideArguments
                                                                    : CallStart::kAfterCallPrefix,
                                        !r.parallel_tool_calls)};
    param = "tools";
  } else if (r.response_format) {
    grammar = r.response_format;
    param = grammar->kind == GrammarKind::kJsonSchema ? "response_format.json_schema.schema"
                                                      : "response_format";
  } else if (chat && (options_.constrain_tools || narrowed) && r.tool_choice == "auto" &&
             !r.callable.empty() && tool_call_tokens_) {
    grammar = Grammar{GrammarKind::kLark, tool_call_grammar(r.tools, r.callable, *tool_call_tokens_,
                                                            CallStart::kReply)};
    param = "tools";
  }
  if (!grammar) return nullptr;
  if (r.ignore_eos) {
    throw ApiError(400,
                   "'ignore_eos' cannot be combined with '" + param +
                       "': the grammar decides where the output ends",
                   "invalid_request_error", "ignore_eos", "invalid_value");
  }
  // The reply may think first when thinking is on; a forced call's prompt skips thinking.
  std::optional<ThinkingMarkers> thinking;
  const auto enable = r.template_kwargs.find("enable_thinking");
  if (chat && !forced_call && enable != r.template_kwargs.end() && *enable == true) {
    thinking = thinking_markers_;
  }
  try {
    std::call_once(grammar_vocabulary_once_, [&] {
      grammar_vocabulary_ = std::make_shared<const GrammarVocabulary>(*tokenizer_, reply_end_ids_);
    });
    return std::make_shared<Constraint>(grammar_vocabulary_, *grammar, thinking,
                                        parser_prefix.starts_with(kChannelOpen));
  } catch (const ValueError& e) {
    throw ApiError(400, "'" + param + "' cannot be enforced: " + e.what(), "invalid_request_error",
                   param, "unsupported_schema");
  }
}

void Server::handle_generation(const httplib::Request& req, httplib::Response& res, bool chat) {
  auto active = admit();
  const ojson body = parse_body(req.body);
  GenerationRequest r = chat ? parse_chat_request(body) : parse_completion_request(body);
  Choices jobs = chat ? start_jobs(r, true, "messages") : start_completions(r);
  if (r.stream) {
    stream_response(res, std::move(jobs), chat, r.include_usage, std::move(active));
  } else {
    answer_whole(res, jobs, chat);
  }
}

std::vector<Media> Server::read_media(const std::vector<MediaSource>& sources) const {
  std::vector<Media> media;
  const auto image_options = [this](int64_t tokens) { return engine_->image_options(tokens); };
  const auto gone = [fd = connection_socket()] { return peer_closed(fd); };
  for (const MediaPart& part : load_media(sources, options_.media, modalities_, image_options,
                                          engine_->audio_options(), image_decode_budget(), gone)) {
    media.push_back(part.kind == MediaKind::kImage ? image_media(part.patches)
                                                   : audio_media(part.audio));
  }
  return media;
}

std::vector<int64_t> Server::with_media(std::vector<int64_t> ids,
                                        const std::vector<Media>& media) const {
  const ModelConfig& config = engine_->config();
  for (const auto& [kind, token] : {std::pair{MediaKind::kImage, config.image_token_id},
                                    std::pair{MediaKind::kAudio, config.audio_token_id}}) {
    if (token < 0) continue;
    const auto markers = std::count(ids.begin(), ids.end(), token);
    const auto parts = std::count_if(media.begin(), media.end(),
                                     [kind = kind](const Media& m) { return m.kind == kind; });
    if (markers > parts) {
      const std::string marker = tokenizer_->id_to_token(token);
      const char* part = kind == MediaKind::kImage ? "image" : "audio";
      throw ValueError("the text holds " + marker + ", which marks an " + part + " part; " +
                       "a message cannot write it as text (" + std::to_string(markers) +
                       " in the prompt, " + std::to_string(parts) + " " + part + " parts)");
    }
  }
  return media.empty() ? ids : expand_media_placeholders(ids, media, config);
}

Server::ChatPrompt Server::chat_prompt(const GenerationRequest& r,
                                       std::vector<Media>& media) const {
  const auto encode = [&](const GenerationRequest& g, const std::vector<Media>& m) {
    ChatPrompt p;
    p.text = render_chat(g, p.parser_prefix);
    p.ids = with_media(tokenizer_->encode(p.text, /*add_special_tokens=*/false), m);
    return p;
  };
  ChatPrompt whole = encode(r, media);
  const int64_t room = std::max<int64_t>(r.max_tokens.value_or(1), 1);
  const auto fits = [&](const ChatPrompt& p) {
    return static_cast<int64_t>(p.ids.size()) + room <= options_.engine.context;
  };
  if (!r.drop_old_turns || fits(whole)) return whole;
  const ojson& messages = r.messages;
  const auto role = [&](size_t i) { return messages[i].value("role", ""); };
  size_t opening = 0;
  while (opening < messages.size() && (role(opening) == "system" || role(opening) == "developer")) {
    ++opening;
  }
  std::vector<size_t> cuts;  // the user turns a prompt may start at, leaving one turn out or more
  for (size_t i = opening + 1; i < messages.size(); ++i) {
    if (role(i) == "user") cuts.push_back(i);
  }
  if (cuts.empty()) return whole;
  // The media parts of messages [from, to), in the order `media` holds them.
  const auto media_in = [&](size_t from, size_t to) {
    int64_t n = 0;
    for (size_t i = from; i < to; ++i) {
      const ojson& content = messages[i].contains("content") ? messages[i]["content"] : ojson();
      if (!content.is_array()) continue;
      for (const auto& part : content) {
        n += part.is_object() &&
             (part.value("type", "") == "image" || part.value("type", "") == "audio");
      }
    }
    return n;
  };
  GenerationRequest g = r;
  g.media.clear();
  const int64_t first_dropped = media_in(0, opening);
  const auto cut_at = [&](size_t cut, std::vector<Media>& kept) {
    g.messages = ojson::array();
    for (size_t i = 0; i < messages.size(); ++i) {
      if (i < opening || i >= cut) g.messages.push_back(messages[i]);
    }
    kept = media;
    kept.erase(kept.begin() + first_dropped, kept.begin() + first_dropped + media_in(opening, cut));
    return encode(g, kept);
  };
  // Fewer turns make a shorter prompt: the earliest cut that fits is a binary search away.
  size_t lo = 0, hi = cuts.size() - 1;
  std::vector<Media> kept;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (fits(cut_at(cuts[mid], kept))) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  ChatPrompt cut = cut_at(cuts[lo], kept);
  media = std::move(kept);
  return cut;
}

void Server::check_room(int64_t sequences, const std::string& param,
                        const std::string& what) const {
  const int64_t room = options_.parallel + options_.max_queue;
  if (sequences > room) {
    throw ApiError(400,
                   what + ", but this server decodes " + std::to_string(options_.parallel) +
                       " sequences at once and queues " + std::to_string(options_.max_queue) +
                       " more (--parallel, --max-queue): at most " + std::to_string(room) +
                       " choices",
                   "invalid_request_error", param, "invalid_value");
  }
}

Choices Server::start_jobs(const GenerationRequest& r, bool chat, const std::string& prompt_param) {
  Choices jobs = prepare_jobs(r, chat, prompt_param);
  enqueue(jobs);
  return jobs;
}

Choices Server::start_completions(const GenerationRequest& r) {
  if (r.more_prompts.empty()) return start_jobs(r, false, "prompt");
  const auto prompts = static_cast<int64_t>(r.more_prompts.size()) + 1;
  check_room(prompts * r.n, "prompt",
             "'prompt' lists " + std::to_string(prompts) + " prompts of " + std::to_string(r.n) +
                 " choices each ('n')");
  GenerationRequest one = r;
  one.more_prompts.clear();
  Choices jobs = prepare_jobs(one, false, at_index("prompt", 0));
  for (size_t i = 0; i < r.more_prompts.size(); ++i) {
    one.prompt = r.more_prompts[i].text;
    one.prompt_ids = r.more_prompts[i].ids;
    for (auto& job : prepare_jobs(one, false, at_index("prompt", i + 1), jobs.front()->box)) {
      jobs.push_back(std::move(job));
    }
  }
  enqueue(jobs);
  return jobs;
}

Choices Server::prepare_jobs(const GenerationRequest& r, bool chat, const std::string& prompt_param,
                             std::shared_ptr<Mailbox> box) {
  check_model(r.model);
  check_room(r.n, "n", "'n' is " + std::to_string(r.n));
  if (r.id_slot >= options_.parallel) {
    throw ApiError(400,
                   "'id_slot' " + std::to_string(r.id_slot) + " does not exist: the slots are 0 "
                       "to " + std::to_string(options_.parallel - 1) + " (--parallel)",
                   "invalid_request_error", "id_slot", "invalid_value");
  }
  if (r.id_slot >= 0 && r.n > 1) {
    throw ApiError(400, "'id_slot' runs one sequence in one slot: 'n' must be 1 with it, got " +
                            std::to_string(r.n),
                   "invalid_request_error", "n", "invalid_value");
  }
  auto job = std::make_shared<Job>();
  if (box) job->box = std::move(box);
  job->media = read_media(r.media);
  std::string rendered = r.prompt;
  try {
    if (chat) {
      ChatPrompt p = chat_prompt(r, job->media);
      rendered = std::move(p.text);
      job->prompt = std::move(p.ids);
      job->parser_prefix = std::move(p.parser_prefix);
    } else if (r.prompt_ids) {
      job->prompt = *r.prompt_ids;
    } else {
      // A prompt already opening with the BOS token (one /apply-template rendered, Ollama's raw
      // prompts) gets no second one: Gemma reads a doubled BOS as text it never saw in training.
      const int64_t bos = engine_->config().bos_token_id;
      const bool has_bos = bos >= 0 && r.prompt.rfind(tokenizer_->decode({bos}), 0) == 0;
      job->prompt = tokenizer_->encode(r.prompt, /*add_special_tokens=*/!has_bos);
    }
    if (!chat) job->prompt = with_media(std::move(job->prompt), job->media);
    engine_->check_prompt(job->prompt, job->media);
  } catch (const ValueError& e) {
    const auto tokens = static_cast<int64_t>(job->prompt.size());
    if (tokens > options_.engine.context) {
      throw PromptTooLong(e.what(), prompt_param, tokens, options_.engine.context);
    }
    throw ApiError(400, e.what(), "invalid_request_error", prompt_param, "invalid_value");
  }
  job->decode.max_new = r.max_tokens.value_or(options_.engine.context);
  if (job->decode.max_new == 0) {
    job->generates = false;
    job->decode.max_new = 1;  // the engine reads a prompt for its next token
  }
  job->decode.read_every = options_.read_every;
  job->decode.draft = options_.draft;
  job->decode.draft.tokens = r.draft_max.value_or(options_.draft.tokens);
  job->decode.cache_salt = r.cache_salt;
  job->decode.row = r.id_slot;
  job->decode.lora = lora_for(r);
  job->decode.ignore_eos = r.ignore_eos;
  job->decode.stop_ids = reply_end_ids_;
  job->decode.constraint = constraint_for(r, chat, job->parser_prefix);
  if (const int64_t thinking = r.thinking_budget.value_or(options_.reasoning_budget);
      thinking >= 0 && thinking_markers_) {
    job->decode.thinking_budget =
        ThinkingBudget{thinking, *thinking_markers_, reasoning_budget_message_};
  }
  job->decode.sampling =
      sampling_params(r.sampling, generation_defaults_, engine_->config().vocab_size);
  if (chat && turn_open_) job->decode.reuse_points = turn_reuse_points(job->prompt, *turn_open_);
  job->stop = r.stop;
  job->parse_output = chat;
  job->callable = r.callable;
  job->one_call = !r.parallel_tool_calls;
  if (r.logprobs) job->top_logprobs = r.top_logprobs;
  if (r.echo) {
    std::vector<int64_t> shown;  // the prompt as completions show text: special tokens left out
    for (const int64_t id : job->prompt) {
      if (!special_[id]) shown.push_back(id);
    }
    job->echo = tokenizer_->decode(shown);
  }
  job->prompt_logprobs = r.prompt_logprobs.value_or(-1);
  for (const auto& rule : forced_outputs_) {
    if (rendered.find(rule.prompt_contains) == std::string::npos) continue;
    job->forced = tokenizer_->encode(rule.output, /*add_special_tokens=*/false);
    if (job->forced->empty()) throw ApiError(500, "TORCHTPU_TEST_FORCED_OUTPUT: empty output");
    job->decode.max_new = std::min<int64_t>(job->decode.max_new, job->forced->size());
    job->decode.ignore_eos = true;
    job->decode.constraint.reset();  // the rule's output replaces whatever the grammar allowed
    break;
  }
  job->fd = connection_socket();
  Choices jobs{job};
  for (int64_t i = 1; i < r.n; ++i) {
    jobs.push_back(job->sibling(
        i, job->decode.constraint ? constraint_for(r, chat, job->parser_prefix) : nullptr));
    jobs.back()->shares_prompt_scores = job->prompt_top() >= 0;
  }
  return jobs;
}

GenerationOutcome Server::outcome(const Choices& jobs, const std::string& reasoning) const {
  const Job& last = *jobs.back();
  GenerationOutcome out{last.finish, last.stop_sequence};
  out.context_full = last.finish == "length" && last.generates &&
                     static_cast<int64_t>(last.result.tokens.size()) < last.decode.max_new;
  for (const auto& job : jobs) {
    out.prompt_tokens += job->result.prompt_tokens;
    out.completion_tokens += static_cast<int64_t>(job->result.tokens.size());
    out.cached_tokens += job->result.cached_tokens;
    out.read_s += job->result.read_s;
    out.decode_s += job->result.decode_s;
  }
  out.reasoning_tokens = static_cast<int64_t>(tokenizer_->encode(reasoning, false).size());
  return out;
}

void Server::pass_logprobs(const Job& job, const Piece& piece, Renderer& renderer) const {
  if (job.top_logprobs >= 0 && !piece.logprobs.empty()) {
    renderer.logprobs(chat_logprobs_json(piece.logprobs)["content"]);
  }
}

void Server::answer_rendered(httplib::Response& res, Choices jobs,
                             std::shared_ptr<Renderer> renderer, bool stream,
                             std::shared_ptr<Active> active) {
  if (!stream) {
    renderer->start();
    std::string reasoning;
    for (const auto& job : jobs) {
      while (true) {
        Taken taken = take({job});
        reasoning += taken.delta.reasoning;
        pass_logprobs(*job, taken.delta, *renderer);
        renderer->add(taken.delta);
        if (taken.done) break;
      }
      if (job->error || job->finish == "cancelled") abandon(jobs);  // the pieces after it
      if (job->error) throw *job->error;
      if (job->finish == "cancelled") throw_cancelled();
    }
    renderer->finish(outcome(jobs, reasoning));
    res.set_content(dump(renderer->body()), "application/json");
    return;
  }
  struct Stream {
    bool started = false;
    size_t at = 0;  // the job being sent
    std::string reasoning;
  };
  auto s = std::make_shared<Stream>();
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      renderer->content_type(),
      [this, jobs, renderer, s](size_t, httplib::DataSink& sink) {
        std::string out;
        bool ended = false;
        // The opening events go out at once, before the first token is decoded.
        if (!s->started) {
          s->started = true;
          out = renderer->start();
        } else {
          const auto& job = jobs[s->at];
          Taken taken = take({job});
          s->reasoning += taken.delta.reasoning;
          pass_logprobs(*job, taken.delta, *renderer);
          out = renderer->add(taken.delta);
          if (taken.done) {
            if (job->finish == "cancelled") return false;
            if (job->error) {
              out += renderer->error(*job->error);
              ended = true;
            } else if (++s->at == jobs.size()) {
              out += renderer->finish(outcome(jobs, s->reasoning));
              ended = true;
            }
          }
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          abandon(jobs);
          return false;
        }
        if (ended) sink.done();
        return true;
      },
      // As stream_response's: the engine must be done with the jobs before the connection
      // closes.
      [this, jobs, active](bool) {
        abandon(jobs);
        for (const auto& job : jobs) wait_done(*job);
      });
}

void Server::handle_responses(const httplib::Request& req, httplib::Response& res) {
  auto active = admit();
  const ResponsesRequest r = parse_responses_request(parse_body(req.body), responses_);
  std::shared_ptr<Job> job;
  try {
    job = start_jobs(r.generation, true, "input").front();
  } catch (const ApiError& e) {
    throw as_responses_error(e);  // a text.format schema the grammar cannot enforce
  }
  answer_rendered(res, {job}, std::make_shared<ResponsesRenderer>(model_id_, r, &responses_),
                  r.generation.stream, std::move(active));
}

void Server::handle_messages(const httplib::Request& req, httplib::Response& res) {
  auto active = admit();
  const MessagesRequest r = parse_messages_request(parse_body(req.body));
  std::shared_ptr<Job> job;
  try {
    job = start_jobs(r.generation, true, "messages").front();
  } catch (const PromptTooLong& e) {
    // Anthropic's words, which Claude Code recognizes to compact the conversation.
    throw ApiError(400,
                   "prompt is too long: " + std::to_string(e.tokens) + " tokens > " +
                       std::to_string(e.context) + " maximum",
                   e.type, e.param, e.code);
  } catch (const ApiError& e) {
    throw as_messages_error(e);  // an output_config.format schema the grammar cannot enforce
  }
  const auto prompt_tokens = static_cast<int64_t>(job->prompt.size());
  answer_rendered(res, {job}, std::make_shared<MessagesRenderer>(model_id_, prompt_tokens, r),
                  r.generation.stream, std::move(active));
}

void Server::handle_ollama(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto received = Clock::now();
  const ojson body = parse_body(req.body);
  const OllamaRequest r = chat ? parse_ollama_chat(body) : parse_ollama_generate(body);
  check_model(server_model_name(r.model));  // a load request has no generation to name it
  // keep_alive holds from this request on: a load's at once, a generation's once its sequence is
  // queued (whose submission ends the one before), so a limit of 0 sleeps after the answer.
  if (r.load_only) {
    if (r.unload()) {
      scheduler_.sleep_when_idle();
    } else {
      scheduler_.wake_up();
    }
    scheduler_.keep_alive(r.keep_alive);
    res.set_content(dump(ollama_loaded(r)), "application/json");
    return;
  }
  auto active = admit();
  std::shared_ptr<Job> job;
  try {
    job = start_jobs(r.generation, r.templated, chat ? "messages" : "prompt").front();
  } catch (const ApiError& e) {
    throw as_ollama_error(e);  // a format schema the grammar cannot enforce
  }
  scheduler_.keep_alive(r.keep_alive);
  answer_rendered(res, {job}, std::make_shared<OllamaRenderer>(r, received), r.generation.stream,
                  std::move(active));
}

OllamaModel Server::ollama_model(const std::string& id) const {
  OllamaModel m;
  m.id = id;
  m.digest = engine_->weights_id();
  for (const auto& a : adapters()) {
    if (a.spec.name != id) continue;
    m.parent = model_id_;
    // The adapter's own digits after the base model's.
    m.digest += digest_hex(fnv1a(
        kFnvOffset, reinterpret_cast<const uint8_t*>(a.spec.dir.data()), a.spec.dir.size()));
  }
  for (const auto& s : engine_->storage()) {
    m.size += s.bytes;
    if (s.family == "linears") {
      m.quantization = s.format.rfind("int4", 0) == 0 ? "W4A16" : s.format;
      for (char& c : m.quantization) c = static_cast<char>(std::toupper(c));
    }
  }
  if (options_.engine.device != "cpu") m.size_vram = m.size;
  const auto created = std::chrono::system_clock::from_time_t(static_cast<std::time_t>(created_));
  m.modified_at = rfc3339(created);
  const ModelConfig& config = engine_->config();
  m.context_length = options_.engine.context;
  m.embedding_length = config.hidden_size;
  m.block_count = config.num_hidden_layers;
  m.capabilities = {"completion"};
  if (template_caps_.tools) m.capabilities.push_back("tools");
  if (template_->source().find("enable_thinking") != std::string::npos) {
    m.capabilities.push_back("thinking");
  }
  if (modalities_.image) m.capabilities.push_back("vision");
  if (modalities_.audio) m.capabilities.push_back("audio");
  const SamplingParams d = sampling_params({}, generation_defaults_, config.vocab_size);
  std::ostringstream parameters;
  parameters << "temperature " << d.temperature << "\ntop_k " << d.top_k << "\ntop_p " << d.top_p
             << "\nmin_p " << d.min_p << "\nrepeat_penalty " << d.repetition_penalty;
  m.parameters = parameters.str();
  m.chat_template = template_->source();
  // Ollama's keep-alive is this server's sleep when idle (the last Ollama request's keep_alive,
  // else --sleep-idle-seconds); a model kept loaded for good has, as Ollama writes it, an expiry
  // far ahead.
  const auto idle = scheduler_.idle_limit();
  const auto now = std::chrono::system_clock::now();
  m.expires_at = rfc3339(!idle ? now + std::chrono::hours(24 * 365 * 100)
                               : now + std::chrono::milliseconds(std::llround(*idle * 1e3)));
  return m;
}

void Server::add_ollama_info_routes(httplib::Server& http) {
  const auto version = [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"version", kOllamaApiVersion}, {"torchtpu_cpp", TORCHTPU_VERSION}}),
                    "application/json");
  };
  http.Get("/api/version", guarded(version, false, ErrorShape::kOllama));
  http.Get("/api/tags", guarded(
                            [this](const httplib::Request&, httplib::Response& res) {
                              ojson models = ojson::array();
                              for (const auto& name : model_names_) {
                                models.push_back(ollama_tag(ollama_model(name)));
                              }
                              for (const auto& a : adapters()) {
                                models.push_back(ollama_tag(ollama_model(a.spec.name)));
                              }
                              res.set_content(dump({{"models", models}}), "application/json");
                            },
                            true, ErrorShape::kOllama));
  handle_post(http, "/api/show",
              guarded(
                  [this](const httplib::Request& req, httplib::Response& res) {
                    const std::string id =
                        server_model_name(ollama_named_model(parse_body(req.body)));
                    check_model(id);
                    res.set_content(dump(ollama_show(ollama_model(id.empty() ? model_id_ : id))),
                                    "application/json");
                  },
                  true, ErrorShape::kOllama));
  // The models in memory: none while the server sleeps.
  http.Get("/api/ps", guarded(
                          [this](const httplib::Request&, httplib::Response& res) {
                            ojson models = ojson::array();
                            if (!scheduler_.stats().asleep) {
                              models.push_back(ollama_ps(ollama_model(model_id_)));
                            }
                            res.set_content(dump({{"models", models}}), "application/json");
                          },
                          true, ErrorShape::kOllama));
  // A model served here is pulled already: the answer is the line Ollama ends a pull with, so
  // that clients which pull before they chat go on.
  handle_post(http, "/api/pull",
              guarded(
                  [this](const httplib::Request& req, httplib::Response& res) {
                    const auto pull = parse_ollama_pull(parse_body(req.body));
                    check_model(server_model_name(pull.model));
                    const std::string done = dump({{"status", "success"}});
                    if (pull.stream) {
                      res.set_content(done + "\n", "application/x-ndjson");
                    } else {
                      res.set_content(done, "application/json");
                    }
                  },
                  true, ErrorShape::kOllama));
  // Ollama's model store: none here, so nothing to create, copy, delete or push.
  const auto no_store = [](const httplib::Request& req, httplib::Response&) {
    throw ApiError(501,
                   req.path + " is not supported: this server keeps no model store; it serves "
                              "the model it was started with and its LoRA adapters (/api/tags)",
                   "invalid_request_error", "", "not_implemented");
  };
  for (const char* path : {"/api/create", "/api/copy", "/api/push", R"(/api/blobs/([^/]+))"}) {
    handle_post(http, path, guarded(no_store, false, ErrorShape::kOllama));
  }
  http.Get(R"(/api/blobs/([^/]+))", guarded(no_store, false, ErrorShape::kOllama));  // and HEAD
  http.Delete("/api/delete", guarded(no_store, false, ErrorShape::kOllama));
  for (const char* path : {"/api/embed", "/api/embeddings"}) {
    handle_post(http, path,
                guarded(
                    [](const httplib::Request&, httplib::Response&) {
                      throw ApiError(400,
                                     "this model does not make embeddings: Gemma 4 is a "
                                     "generative model",
                                     "invalid_request_error", "model", "not_supported");
                    },
                    false, ErrorShape::kOllama));
  }
}

void Server::add_sleep_routes(httplib::Server& http) {
  handle_post(http, "/sleep",
              guarded(
                  [this](const httplib::Request& req, httplib::Response&) {
                    // vLLM's level 1 keeps the weights in host memory, 2 drops them;
                    // the engine here frees them either way and reads them again.
                    const std::string level = req.get_param_value("level");
                    if (!level.empty() && level != "1" && level != "2") {
                      throw ApiError(400, "'level' must be 1 or 2, got '" + level + "'",
                                     "invalid_request_error", "level", "invalid_value");
                    }
                    scheduler_.sleep_when_idle();
                  },
                  true));
  handle_post(http, "/wake_up",
              guarded(
                  [this](const httplib::Request& req, httplib::Response&) {
                    // vLLM wakes its weights and its KV cache apart; here both come
                    // back together.
                    for (size_t i = 0; i < req.get_param_value_count("tags"); ++i) {
                      const std::string tag = req.get_param_value("tags", i);
                      if (tag != "weights" && tag != "kv_cache") {
                        throw ApiError(400,
                                       "'tags' must be \"weights\" or \"kv_cache\", "
                                       "got '" +
                                           tag + "'",
                                       "invalid_request_error", "tags", "invalid_value");
                      }
                    }
                    scheduler_.wake_up();
                  },
                  true));
  http.Get("/is_sleeping", guarded(
                               [this](const httplib::Request&, httplib::Response& res) {
                                 res.set_content(
                                     dump({{"is_sleeping", scheduler_.stats().asleep}}),
                                     "application/json");
                               },
                               true));
}

void Server::handle_transcription(const httplib::Request& req, httplib::Response& res,
                                  bool translate) {
  if (!req.is_multipart_form_data()) {
    throw ApiError(400, "the body must be multipart/form-data with the clip in 'file', as "
                   "OpenAI's audio API takes it", "invalid_request_error", "file");
  }
  FormParts form;
  for (const auto& [name, part] : req.files) {
    form.emplace(name, FormPart{part.content, part.filename});
  }
  auto active = admit();
  const TranscriptionRequest r = parse_transcription_request(form, translate);
  // The pieces queue together (side by side in the batch); a refusal of one drops those before.
  Choices jobs;
  try {
    for (const auto& piece : r.pieces) jobs.push_back(start_jobs(piece, true, "file").front());
  } catch (const ApiError& e) {
    abandon(jobs);
    throw as_transcription_error(e);
  } catch (...) {
    abandon(jobs);
    throw;
  }
  const bool stream = r.stream;
  answer_rendered(res, jobs, std::make_shared<TranscriptionRenderer>(stream), stream,
                  std::move(active));
  if (r.text && !stream) {
    res.set_content(parse_json(res.body)["text"].get<std::string>(), "text/plain; charset=utf-8");
  }
}

int64_t Server::prompt_tokens(const GenerationRequest& r, const std::string& param) {
  check_model(r.model);
  // Images count as the soft tokens the model reads for them, so they are read and preprocessed
  // as for a generation: the count is the prompt's usage.input_tokens.
  auto media = read_media(r.media);
  try {
    return static_cast<int64_t>(chat_prompt(r, media).ids.size());
  } catch (const ValueError& e) {
    throw ApiError(400, e.what(), "invalid_request_error", param, "invalid_value");
  }
}

void Server::handle_count_tokens(const httplib::Request& req, httplib::Response& res) {
  const MessagesRequest r = parse_messages_request(parse_body(req.body), /*for_count=*/true);
  res.set_content(dump({{"input_tokens", prompt_tokens(r.generation, "messages")}}),
                  "application/json");
}

void Server::handle_input_tokens(const httplib::Request& req, httplib::Response& res) {
  const ResponsesRequest r = parse_responses_request(parse_body(req.body), responses_);
  res.set_content(dump({{"object", "response.input_tokens"},
                        {"input_tokens", prompt_tokens(r.generation, "input")}}),
                  "application/json");
}

std::vector<LoraReport> Server::adapters() const {
  std::vector<LoraReport> loaded;
  if (!engine_built()) {
    for (const auto& spec : engine_options_.lora) loaded.push_back({spec, {}, {}});
    return loaded;
  }
  loaded = engine_->adapters();
  std::lock_guard<std::mutex> lock(lora_mutex_);
  std::erase_if(loaded, [&](const LoraReport& a) { return lora_unloading_.count(a.spec.name); });
  return loaded;
}

namespace {

bool has_adapter(const std::vector<LoraReport>& adapters, const std::string& name) {
  return std::any_of(adapters.begin(), adapters.end(),
                     [&](const LoraReport& a) { return a.spec.name == name; });
}

}  // namespace

void Server::check_model(const std::string& name) const {
  const auto loaded = adapters();
  if (name.empty() ||
      std::find(model_names_.begin(), model_names_.end(), name) != model_names_.end() ||
      has_adapter(loaded, name)) {
    return;
  }
  std::string served;
  for (const auto& n : model_names_) served += (served.empty() ? "'" : ", '") + n + "'";
  for (const auto& a : loaded) served += ", '" + a.spec.name + "' (LoRA)";
  throw ApiError(404, "the model '" + name + "' does not exist; this server serves " + served,
                 "invalid_request_error", "model", "model_not_found");
}

std::optional<std::map<std::string, double>> Server::lora_for(const GenerationRequest& r) const {
  if (r.lora) return lora_scales_by_id(*r.lora, "lora");
  if (has_adapter(adapters(), r.model)) return std::map<std::string, double>{{r.model, 1.0}};
  return std::nullopt;
}

std::vector<std::pair<int64_t, LoraReport>> Server::adapters_by_id() const {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(lora_mutex_);
    ids = lora_ids_;
  }
  std::vector<std::pair<int64_t, LoraReport>> out;
  for (const auto& a : adapters()) {
    // A name loaded again after an unload has the later id.
    const auto id = std::find(ids.rbegin(), ids.rend(), a.spec.name);
    if (id != ids.rend()) out.emplace_back(ids.rend() - id - 1, a);
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return out;
}

std::map<std::string, double> Server::lora_scales_by_id(const std::map<int64_t, double>& by_id,
                                                        const std::string& param) const {
  const auto loaded = adapters_by_id();
  std::string listed;
  for (const auto& [id, a] : loaded) {
    listed += (listed.empty() ? "" : ", ") + std::to_string(id) + " (" + a.spec.name + ")";
  }
  std::map<std::string, double> scales;  // those at 0 left out, as those not given
  for (const auto& [id, scale] : by_id) {
    const auto found = std::find_if(loaded.begin(), loaded.end(),
                                    [&](const auto& a) { return a.first == id; });
    if (found == loaded.end()) {
      std::string was;
      {
        std::lock_guard<std::mutex> lock(lora_mutex_);
        if (id < static_cast<int64_t>(lora_ids_.size())) was = lora_ids_[id];
      }
      throw ApiError(400,
                     "'" + param + "' names adapter " + std::to_string(id) +
                         (was.empty() ? ", which this server never loaded"
                                      : " ('" + was + "'), which was unloaded") +
                         (listed.empty()
                              ? "; it loads no LoRA adapters now (start it with --lora)"
                              : "; its adapters: " + listed),
                     "invalid_request_error", param, "invalid_value");
    }
    if (scale != 0) scales[found->second.spec.name] = scale;
  }
  return scales;
}

ojson Server::lora_adapters_json() const {
  ojson out = ojson::array();
  for (const auto& [id, a] : adapters_by_id()) {
    out.push_back(
        {{"id", id}, {"name", a.spec.name}, {"path", a.spec.dir}, {"scale", a.spec.scale}});
  }
  return out;
}

void Server::load_lora_adapter(const httplib::Request& req, httplib::Response& res) {
  check_runtime_lora();
  const ojson body = parse_body(req.body);
  const auto field = [&](const char* name) {
    if (!body.is_object() || !body.contains(name) || !body[name].is_string() ||
        body[name].get<std::string>().empty()) {
      throw ApiError(400, "the body must be an object with a non-empty string \"" +
                              std::string(name) + "\" (and \"lora_name\", \"lora_path\")",
                     "invalid_request_error", name);
    }
    return body[name].get<std::string>();
  };
  LoraSpec spec;
  spec.name = field("lora_name");
  spec.dir = field("lora_path");
  // Applied only by the requests that name it, as vLLM applies an adapter (POST /lora-adapters
  // can give it a scale for the rest).
  spec.scale = 0;
  if (std::find(model_names_.begin(), model_names_.end(), spec.name) != model_names_.end()) {
    throw ApiError(400, "'" + spec.name + "' is the base model's name: an adapter needs another",
                   "invalid_request_error", "lora_name");
  }
  if (has_adapter(adapters(), spec.name)) {
    throw ApiError(400, "the LoRA adapter '" + spec.name + "' is loaded already",
                   "invalid_request_error", "lora_name", "lora_already_loaded");
  }
  std::error_code ec;
  if (hub::looks_like_repo_id(spec.dir)) {
    try {
      spec.dir = hub::resolve_model(spec.dir, hub::Options::from_env());  // vLLM downloads too
    } catch (const NotFoundError& e) {
      throw ApiError(404, e.what(), "invalid_request_error", "lora_path", "not_found");
    } catch (const UpstreamError& e) {
      throw ApiError(502, e.what(), "server_error", "lora_path", "upstream_error");
    }
  } else if (!std::filesystem::is_directory(spec.dir, ec)) {
    throw ApiError(404, "no directory " + spec.dir + " on this server for LoRA adapter '" +
                            spec.name + "' (nor a Hub id, org/name[@rev])",
                   "invalid_request_error", "lora_path", "not_found");
  }
  try {
    scheduler_.run_on_owner([&](Engine& engine) {
      engine.load_lora(spec);
      std::lock_guard<std::mutex> lock(lora_mutex_);
      lora_ids_.push_back(spec.name);
    });
  } catch (const FormatError& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "lora_path");
  } catch (const ValueError& e) {
    throw ApiError(400, e.what(), "invalid_request_error", "lora_name");
  }
  res.set_content("Success: LoRA adapter '" + spec.name + "' added successfully.", "text/plain");
}

void Server::unload_lora_adapter(const httplib::Request& req, httplib::Response& res) {
  check_runtime_lora();
  const ojson body = parse_body(req.body);
  if (!body.is_object() || !body.contains("lora_name") || !body["lora_name"].is_string()) {
    throw ApiError(400, "the body must be an object with a string \"lora_name\"",
                   "invalid_request_error", "lora_name");
  }
  const auto name = body["lora_name"].get<std::string>();
  const auto not_found = [&] {
    return ApiError(404, "the LoRA adapter '" + name + "' is not loaded",
                    "invalid_request_error", "lora_name", "not_found");
  };
  if (!has_adapter(adapters(), name)) throw not_found();
  {
    std::unique_lock<std::mutex> lock(lora_mutex_);
    if (!lora_unloading_.insert(name).second) throw not_found();
    // A waiting request resolves its adapters when it takes a row.
    lora_changed_.wait(lock, [&] { return lora_waiting_.count(name) == 0; });
  }
  std::exception_ptr failed;
  try {
    scheduler_.run_on_owner([&](Engine& engine) { engine.unload_lora(name); });
  } catch (...) {
    failed = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(lora_mutex_);
    lora_unloading_.erase(name);
  }
  if (failed) std::rethrow_exception(failed);
  res.set_content("Success: LoRA adapter '" + name + "' removed successfully.", "text/plain");
}

void Server::check_runtime_lora() const {
  if (!options_.runtime_lora) {
    throw ApiError(403, "loading and unloading LoRA adapters while serving is off on this "
                   "server: start it with --runtime-lora", "invalid_request_error", "",
                   "runtime_lora_disabled");
  }
}

ojson Server::model_json(const std::string& name) const {
  // OpenAI's fields and Anthropic's side by side, so that either SDK reads the listing whole.
  ojson out = {{"id", name},
               {"object", "model"},
               {"created", created_},
               {"owned_by", demo_ ? "torchtpu-cpp (demo, random weights)" : "torchtpu-cpp"},
               {"type", "model"},
               {"display_name", name},
               {"created_at", rfc3339(std::chrono::system_clock::from_time_t(created_))}};
  // An adapter is a model of its own to clients (vLLM's listing): root its directory, parent
  // the base model.
  for (const auto& a : adapters()) {
    if (a.spec.name != name) continue;
    out["root"] = a.spec.dir;
    out["parent"] = model_id_;
  }
  // Known once the engine is built (load() writes it before kWarmingUp).
  if (engine_built()) out["modalities"] = modalities_json(modalities_);
  return out;
}

ojson Server::props_json() const {
  const SamplingParams defaults =
      sampling_params({}, generation_defaults_, engine_->config().vocab_size);
  ojson caps = ojson::object();
  for (const auto& [name, value] : template_caps_.named()) caps[name] = value;
  auto token = [&](int64_t id) {
    return id < 0 ? ojson(nullptr) : ojson(tokenizer_->decode({id}));
  };
  const auto& eos = engine_->config().eos_token_ids;
  return {
      {"default_generation_settings",
       {{"n_ctx", options_.engine.context},
        {"params",
         {{"temperature", defaults.temperature},
          {"top_k", defaults.top_k},
          {"top_p", defaults.top_p},
          {"min_p", defaults.min_p},
          {"repeat_penalty", defaults.repetition_penalty},
          {"presence_penalty", defaults.presence_penalty},
          {"frequency_penalty", defaults.frequency_penalty},
          // Without max_tokens a reply may run to the end of the context.
          {"n_predict", -1},
          {"reasoning_budget", options_.reasoning_budget}}}}},
      {"total_slots", options_.parallel},
      // The routes a client may look for next; this server always has them.
      {"endpoint_slots", !options_.no_slots},
      {"endpoint_props", true},
      {"endpoint_metrics", true},
      {"model_alias", model_id_},
      {"model_path", model_dir_},
      {"modalities", {{"vision", modalities_.image}, {"audio", modalities_.audio}}},
      {"chat_template", template_->source()},
      {"chat_template_caps", caps},
      {"bos_token", token(engine_->config().bos_token_id)},
      {"eos_token", token(eos.empty() ? -1 : eos.front())},
      {"build_info", std::string("torchtpu-cpp ") + TORCHTPU_VERSION + " (" +
                         TORCHTPU_GIT_REVISION + ")"},
      {"is_sleeping", scheduler_.stats().asleep}};
}

ojson Server::slots_json() const {
  const SchedulerStats stats = scheduler_.stats();
  ojson out = ojson::array();
  for (size_t i = 0; i < stats.batch.row_stats.size(); ++i) {
    const RowStats& row = stats.batch.row_stats[i];
    const bool busy = row.sequence >= 0;
    out.push_back({{"id", i},
                   {"id_task", row.sequence},
                   {"n_ctx", options_.engine.context},
                   {"speculative", busy && row.drafting},
                   {"is_processing", busy},
                   {"reading_prompt", row.reading},
                   {"n_prompt_tokens", row.prompt_tokens},
                   {"next_token",
                    {{"has_next_token", busy && row.remaining > 0},
                     {"n_remain", busy ? row.remaining : -1},
                     {"n_decoded", row.generated}}}});
  }
  return out;
}

void Server::slot_action(const httplib::Request& req, httplib::Response& res,
                         const std::string& id) {
  if (options_.slot_save_path.empty()) {
    throw ApiError(501, "slot save, restore and erase are off on this server: start it with "
                   "--slot-save-path DIR", "not_supported_error", "", "slot_save_disabled");
  }
  if (scheduler_.cache_budget() == 0) {
    throw ApiError(501, "slots keep no state on this server: its prefix cache is off (--cache-mb "
                   "0, or --read-every above 1)", "not_supported_error", "",
                   "prefix_cache_disabled");
  }
  SlotTask task;
  try {
    size_t end = 0;
    task.row = std::stoll(id, &end);
    if (end != id.size() || task.row < 0) throw std::invalid_argument(id);
  } catch (const std::logic_error&) {
    throw ApiError(400, "the slot id must be a whole number from 0, got \"" + id + "\"");
  }
  static const std::map<std::string, SlotAction> actions = {
      {"save", SlotAction::kSave},
      {"restore", SlotAction::kRestore},
      {"erase", SlotAction::kErase}};
  const std::string action = req.get_param_value("action");
  const auto named = actions.find(action);
  if (named == actions.end()) {
    throw ApiError(400, "action must be save, restore or erase, got \"" + action + "\"",
                   "invalid_request_error", "action");
  }
  task.action = named->second;
  std::string filename;
  if (task.action != SlotAction::kErase) {
    const ojson body = parse_body(req.body);
    if (!body.is_object() || !body.contains("filename") || !body["filename"].is_string()) {
      throw ApiError(400, "the body must be an object with a string \"filename\"",
                     "invalid_request_error", "filename");
    }
    filename = body["filename"].get<std::string>();
    check_slot_filename(filename);
    task.path = (std::filesystem::path(options_.slot_save_path) / filename).string();
  }
  // The server's folder stays out of what the client reads: errors name the file as given.
  const auto as_given = [&](std::string message) {
    if (task.path.empty()) return message;
    for (size_t at = 0; (at = message.find(task.path, at)) != std::string::npos;) {
      message.replace(at, task.path.size(), filename);
      at += filename.size();
    }
    return message;
  };
  SlotOutcome done;
  try {
    done = scheduler_.slot(task);
  } catch (const FormatError& e) {
    throw ApiError(400, as_given(e.what()), "invalid_request_error", "filename");
  } catch (const NotFoundError& e) {
    if (task.action == SlotAction::kSave) throw ApiError(500, as_given(e.what()), "server_error");
    throw ApiError(404, "no slot file \"" + filename + "\" in this server's slot save path",
                   "invalid_request_error", "filename", "not_found");
  } catch (const ValueError& e) {
    throw ApiError(400, as_given(e.what()));
  }
  const double ms = done.seconds * 1e3;
  ojson out = {{"id_slot", task.row}};
  switch (task.action) {
    case SlotAction::kSave:
      out.update({{"filename", filename}, {"n_saved", done.tokens}, {"n_written", done.bytes},
                  {"timings", {{"save_ms", ms}}}});
      break;
    case SlotAction::kRestore:
      out.update({{"filename", filename}, {"n_restored", done.tokens}, {"n_read", done.bytes},
                  {"timings", {{"restore_ms", ms}}}});
      break;
    case SlotAction::kErase: out["n_erased"] = done.tokens; break;
  }
  res.set_content(dump(out), "application/json");
}

ojson Server::engine_json() const {
  ojson out = {{"model", model_id_},
               {"model_dir", model_dir_},
               {"random_weights", demo_},
               {"modalities", modalities_json(modalities_)},
               {"hosted_by", options_.hosted_by},
               {"build",
                {{"version", TORCHTPU_VERSION},
                 {"git_revision", TORCHTPU_GIT_REVISION},
                 {"torch_version", TORCHTPU_TORCH_VERSION},
                 {"compiler", TORCHTPU_CXX_COMPILER},
                 {"cpp_httplib", CPPHTTPLIB_VERSION}}},
               {"torch_version", TORCHTPU_TORCH_VERSION}};
  // Fresh: the adapters and their storage change with /v1/load_lora_adapter.
  if (engine_built()) {
    const auto report = engine_report(*engine_);
    for (const auto& [key, value] : report.items()) out[key] = value;
  }
  const char* defer = std::getenv("TORCH_TPU_DEFER_AND_FUSE");
  out["torch_tpu_defer_and_fuse"] = defer ? ojson(defer) : ojson(nullptr);
  out["load_seconds"] = load_s_;
  out["warmup_seconds"] = warmup_s_;
  out["engine_thread"] = kEngineThreadName;
  out["engine_class"] = std::string("torchtpu::Engine, owned by thread ") + kEngineThreadName;
  out["context"] = options_.engine.context;
  out["read_every"] = options_.read_every;
  const auto& assistant = options_.engine.draft_model;
  out["draft"] = {{"max", options_.draft.tokens},
                  {"source", assistant.empty() ? "prompt lookup" : "assistant"},
                  {"model", assistant.empty() ? ojson(nullptr) : ojson(assistant)},
                  {"ngram_min", options_.draft.ngram_min},
                  {"ngram_max", options_.draft.ngram_max},
                  {"always", options_.draft.always}};
  out["max_queue"] = options_.max_queue;
  out["parallel"] = options_.parallel;
  out["reasoning_budget"] = options_.reasoning_budget;
  out["reasoning_budget_message"] = options_.reasoning_budget_message;
  const SchedulerStats stats = scheduler_.stats();
  const auto& cache = stats.batch.cache;
  const bool serial = scheduler_.options().serial();
  out["scheduler"] = {{"mode", serial ? "one sequence at a time (read_every > 1)"
                                      : "continuous batching"},
                      {"waiting", stats.waiting},
                      {"running", stats.running},
                      {"rows", stats.batch.rows},
                      {"reading", stats.batch.reading},
                      {"decoding", stats.batch.decoding},
                      {"steps", stats.batch.steps},
                      {"prompt_passes", stats.batch.prompt_passes},
                      {"prompt_tokens", stats.batch.prompt_tokens},
                      {"cache_positions", stats.batch.positions},
                      {"cache_capacity", stats.batch.capacity},
                      {"busy_seconds", stats.busy_s},
                      {"sleep_idle_seconds", options_.sleep_idle_s},
                      {"sleep_preserve_cache", options_.sleep_preserve_cache},
                      {"asleep", stats.asleep},
                      {"sleeps", stats.sleeps},
                      {"last_wake_seconds", stats.last_wake_s}};
  // One sequence at a time there is no batch, so neither its step budget nor its passes.
  if (!serial) {
    out["scheduler"]["step_tokens"] = stats.batch.step_tokens;
    const auto pass_rows = stats.batch.pass_rows;
    out["scheduler"]["pass_rows"] = pass_rows ? ojson(*pass_rows) : ojson(nullptr);
  }
  out["prefix_cache"] = {{"budget_bytes", scheduler_.cache_budget()},
                         {"block", scheduler_.options().batch.cache_block},
                         {"hits", cache.hits},
                         {"misses", cache.misses},
                         {"reused_tokens", cache.reused_tokens},
                         {"saves", cache.saves},
                         {"evictions", cache.evictions},
                         {"states", cache.states},
                         {"bytes", cache.bytes}};
  out["decoding"] =
      "temperature, top_k, top_p, min_p, repetition/presence/frequency penalties, logit_bias and "
      "seed are honoured; fields a request leaves out take generation_config.json's values "
      "(temperature, top_k, top_p, min_p, repetition_penalty; do_sample false = greedy), read "
      "once at load (not for the random-weight demo), then greedy; temperature 0 is greedy. "
      "logprobs are log_softmax of the raw logits, before penalties, temperature and filtering.";
  ojson defaults = ojson::object();
  const auto& d = generation_defaults_;
  if (d.temperature) defaults["temperature"] = *d.temperature;
  if (d.top_k) defaults["top_k"] = *d.top_k;
  if (d.top_p) defaults["top_p"] = *d.top_p;
  if (d.min_p) defaults["min_p"] = *d.min_p;
  if (d.repetition_penalty) defaults["repetition_penalty"] = *d.repetition_penalty;
  out["sampling_defaults"] = defaults;
  return out;
}

EngineLoad Server::engine_load() {
  const SchedulerStats stats = scheduler_.stats();
  EngineLoad load;
  load.waiting = stats.waiting;
  load.running = stats.running;
  load.rows = options_.parallel;
  // A position is the unit the rings hold a sequence's cache in, so a block is one token.
  const int64_t capacity = stats.batch.capacity;
  if (capacity > 0) {
    load.kv_cache_usage = std::clamp(
        static_cast<double>(stats.batch.positions) / static_cast<double>(capacity), 0.0, 1.0);
    load.block_size = 1;
    load.blocks = capacity;
  }
  load.busy_seconds = stats.busy_s;
  load.asleep = stats.asleep;
  load.sleeps = stats.sleeps;
  load.prefix_cache = stats.batch.cache;
  load.prefix_cache_budget = scheduler_.cache_budget();
  // The adapters it can hold: without --runtime-lora, those it loaded at start.
  load.max_lora = options_.runtime_lora ? engine_options_.max_lora
                                        : static_cast<int64_t>(engine_options_.lora.size());
  std::lock_guard<std::mutex> lock(lora_mutex_);
  for (auto [counts, names] : {std::pair{&lora_running_, &load.running_lora_adapters},
                               std::pair{&lora_waiting_, &load.waiting_lora_adapters}}) {
    for (const auto& [name, count] : *counts) *names += (names->empty() ? "" : ",") + name;
  }
  return load;
}

std::string Server::endpoint_label(const std::string& path) const {
  if (kRoutes.count(path)) return path;
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses/{id}";
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/api/blobs/", 0) == 0) return "/api/blobs/{digest}";
  if (path.rfind("/slots/", 0) == 0) return "/slots/{id}";
  if (path.rfind("/web/", 0) == 0) return "/web/{file}";
  return "other";
}

void Server::refuse_unrouted(const httplib::Request& req, httplib::Response& res) const {
  if (req.path != "/health" && req.path != "/livez" && req.path != "/ping") authorize(req);
  auto it = kRoutes.find(req.path);
  if (it == kRoutes.end() && req.path.rfind("/v1/models/", 0) == 0) it = kRoutes.find("/v1/models");
  // /v1/responses/{id}: one more path segment, a response id, no further slash.
  const std::string ids = "/v1/responses/resp_";
  if (it == kRoutes.end() && req.path.rfind(ids, 0) == 0 && req.path.size() > ids.size() &&
      req.path.find('/', ids.size()) == std::string::npos) {
    res.set_header("Allow", "GET, DELETE");
    throw ApiError(405, req.method + " is not allowed on " + req.path + " (use GET or DELETE)",
                   "invalid_request_error", "", "method_not_allowed");
  }
  // A method the route takes reached here with a path it does not ("/v1/models/", an empty id):
  // the path is what is wrong.
  const auto allows = [&](const std::string& methods) {
    const std::string list = ", " + methods + ", ";
    return list.find(", " + req.method + ", ") != std::string::npos;
  };
  if (it != kRoutes.end() && !allows(it->second)) {
    res.set_header("Allow", it->second);
    throw ApiError(405, req.method + " is not allowed on " + req.path + " (use " + it->second + ")",
                   "invalid_request_error", "", "method_not_allowed");
  }
  throw ApiError(404, "unknown route " + req.method + " " + req.path, "invalid_request_error", "",
                 "not_found");
}

void Server::check_page(const httplib::Request& req) const {
  const std::string refusal = browser_refusal(req, is_loopback(options_.host));
  if (!refusal.empty()) throw ApiError(403, refusal, "invalid_request_error", "", "forbidden");
}

void Server::authorize(const httplib::Request& req) const {
  check_page(req);
  if (options_.api_key.empty()) return;
  // Routers and Prometheus scrape without credentials (docs/SCALING.md); --metrics-auth asks for
  // the key here too.
  if (req.path == "/metrics" && !options_.metrics_auth) return;
  // OpenAI clients send the key as a bearer token, Anthropic clients as x-api-key.
  const std::string given = req.get_header_value("Authorization");
  const bool has_x_api_key = req.has_header("x-api-key");
  if (!bearer_matches(given, options_.api_key) &&
      !(has_x_api_key && key_matches(req.get_header_value("x-api-key"), options_.api_key))) {
    throw ApiError(401,
                   given.empty() && !has_x_api_key
                       ? "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                       : "incorrect API key",
                   "authentication_error", "", "invalid_api_key");
  }
}

void send_error(httplib::Response& res, const ApiError& e, ErrorShape shape = ErrorShape::kOpenAI) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(dump(shape == ErrorShape::kAnthropic ? anthropic_error_body(e)
                       : shape == ErrorShape::kOllama  ? ollama_error_body(e)
                                                       : error_body(e)),
                  "application/json");
}

// Anthropic and Ollama clients read errors in their own shape, on every status of their routes.
ErrorShape error_shape(const std::string& path) {
  if (path.rfind("/v1/messages", 0) == 0) return ErrorShape::kAnthropic;
  return path.rfind("/api/", 0) == 0 ? ErrorShape::kOllama : ErrorShape::kOpenAI;
}

void Server::answer_preflight(const httplib::Request& req, httplib::Response& res) const {
  try {
    check_page(req);
  } catch (const ApiError& e) {
    send_error(res, e, error_shape(req.path));
    return;
  }
  allow_preflight(req, res, "GET, POST, DELETE");
}

httplib::Server::Handler Server::guarded(
    const std::function<void(const httplib::Request&, httplib::Response&)>& handler,
    bool needs_engine, ErrorShape shape) {
  return [this, handler, needs_engine, shape](const httplib::Request& req, httplib::Response& res) {
    try {
      authorize(req);
      const State state = state_;
      if (needs_engine && !takes_requests(state)) {
        throw ApiError(503,
                       state == State::kStopping ? "the server is shutting down"
                                                 : "the model is loading; retry when /health "
                                                   "answers 200",
                       "server_error", "", state == State::kStopping ? "shutting_down" : "loading");
      }
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e, shape);
    } catch (const ValueError& e) {
      send_error(res, ApiError(400, e.what()), shape);
    } catch (const c10::ValueError& e) {
      send_error(res, ApiError(400, e.what_without_backtrace()), shape);
    } catch (const NotFoundError& e) {
      send_error(res, ApiError(404, e.what(), "invalid_request_error", "", "not_found"), shape);
    } catch (const std::exception& e) {
      send_error(res, internal_error("", e), shape);
    }
  };
}

void Server::set_up_routes(HttpServer& http) {
  // Readiness: 200 only while the engine takes requests and no stop has been asked, so a
  // router or Kubernetes sends traffic elsewhere from the first moment of a drain.
  // /ping is vLLM's name for the same answer (SageMaker's health check, GET or POST).
  const auto health = [this](const httplib::Request&, httplib::Response& res) {
    const State state = state_;
    const char* status = state == State::kReady       ? "ok"
                         : state == State::kLoading   ? "loading"
                         : state == State::kWarmingUp ? "warming up"
                         : state == State::kDraining  ? "draining"
                         : state == State::kStopping  ? "stopping"
                                                      : "failed";
    res.status = state == State::kReady ? 200 : 503;
    res.set_content(dump({{"status", status}}), "application/json");
  };
  http.Get("/health", health);
  http.Get("/ping", health);
  handle_post(http, "/ping", health);
  http.Get("/version",
           guarded(
               [](const httplib::Request&, httplib::Response& res) {
                 res.set_content(dump({{"version", TORCHTPU_VERSION}}), "application/json");
               },
               false));
  // Liveness: 200 while the process serves HTTP and its engine has not failed, loading and
  // draining included, so a liveness probe restarts neither a slow load nor a drain.
  http.Get("/livez", [this](const httplib::Request&, httplib::Response& res) {
    const bool failed = state_ == State::kFailed;
    res.status = failed ? 503 : 200;
    res.set_content(dump({{"status", failed ? "failed" : "alive"}}), "application/json");
  });
  http.Get("/metrics", guarded(
                           [this](const httplib::Request&, httplib::Response& res) {
                             res.set_content(metrics_.render(engine_load()),
                                             "text/plain; version=0.0.4; charset=utf-8");
                           },
                           false));
  http.Get("/v1/models",
           guarded(
               [this](const httplib::Request&, httplib::Response& res) {
                 ojson data = ojson::array();
                 for (const auto& name : model_names_) {
                   data.push_back(model_json(name));
                 }
                 for (const auto& a : adapters()) data.push_back(model_json(a.spec.name));
                 // Anthropic's page fields beside OpenAI's list: every model on one page.
                 res.set_content(dump({{"object", "list"},
                                       {"data", data},
                                       {"has_more", false},
                                       {"first_id", data.front()["id"]},
                                       {"last_id", data.back()["id"]}}),
                                 "application/json");
               },
               false));
  http.Get(R"(/v1/models/(.+))", guarded(
                                     [this](const httplib::Request& req, httplib::Response& res) {
                                       const std::string name = server_model_name(req.matches[1]);
                                       check_model(name);
                                       res.set_content(dump(model_json(name)), "application/json");
                                     },
                                     false));
  http.Get("/v1/engine", guarded(
                             [this](const httplib::Request&, httplib::Response& res) {
                               res.set_content(dump(engine_json()), "application/json");
                             },
                             true));
  // ?fail_on_no_slot (llama-server's): 503 while every row is busy, for a balancer's probe.
  http.Get("/slots", guarded(
                         [this](const httplib::Request& req, httplib::Response& res) {
                           if (options_.no_slots) {
                             throw ApiError(501, "/slots is off on this server (--no-slots)",
                                            "not_supported_error", "", "slots_disabled");
                           }
                           const ojson slots = slots_json();
                           const bool free = std::any_of(slots.begin(), slots.end(), [](auto& s) {
                             return !s["is_processing"].template get<bool>();
                           });
                           if (req.has_param("fail_on_no_slot") && !free) {
                             throw ApiError(503,
                                            "no slot available: all " +
                                                std::to_string(slots.size()) + " rows are busy",
                                            "unavailable_error", "", "no_slot_available");
                           }
                           res.set_content(dump(slots), "application/json");
                         },
                         true));
  handle_post(http, R"(/slots/([^/]*))",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { slot_action(req, res, req.matches[1]); },
                      true));
  http.Get("/lora-adapters", guarded(
                                 [this](const httplib::Request&, httplib::Response& res) {
                                   res.set_content(dump(lora_adapters_json()), "application/json");
                                 },
                                 false));
  // llama-server's POST /lora-adapters: the scales of requests that name no adapter; an adapter
  // left out of the list goes to 0.
  handle_post(http, "/lora-adapters",
              guarded(
                  [this](const httplib::Request& req, httplib::Response& res) {
                    engine_->set_lora_scales(lora_scales_by_id(
                        parse_lora_scales(parse_body_value(req.body), "body"), "id"));
                    res.set_content(dump(lora_adapters_json()), "application/json");
                  },
                  true));
  handle_post(http, "/v1/load_lora_adapter",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { load_lora_adapter(req, res); },
                      true));
  handle_post(http, "/v1/unload_lora_adapter",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { unload_lora_adapter(req, res); },
                      true));
  http.Get("/props", guarded(
                         [this](const httplib::Request&, httplib::Response& res) {
                           res.set_content(dump(props_json()), "application/json");
                         },
                         true));
  handle_post(http, "/v1/chat/completions",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { handle_generation(req, res, true); },
                      true));
  handle_post(http, "/v1/completions",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { handle_generation(req, res, false); },
                      true));
  handle_post(http, "/v1/responses",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { handle_responses(req, res); },
                      true));
  auto not_stored = [](const std::string& id) {
    return ApiError(404,
                    "response '" + id +
                        "' is not stored on this server (store: false, deleted, evicted, or made "
                        "before a restart)",
                    "invalid_request_error", "", "not_found");
  };
  http.Get(R"(/v1/responses/([^/]+))",
           guarded(
               [this, not_stored](const httplib::Request& req, httplib::Response& res) {
                 auto stored = responses_.get(req.matches[1]);
                 if (!stored) throw not_stored(req.matches[1]);
                 res.set_content(dump(stored->response), "application/json");
               },
               false));
  http.Get(R"(/v1/responses/([^/]+)/input_items)",
           guarded(
               [this, not_stored](const httplib::Request& req, httplib::Response& res) {
                 auto stored = responses_.get(req.matches[1]);
                 if (!stored) throw not_stored(req.matches[1]);
                 res.set_content(dump(input_items_page(stored->input_items, req.params)),
                                 "application/json");
               },
               false));
  // OpenAI cancels only responses made with background: true, which this server refuses: a
  // stored response is answered as OpenAI answers a foreground one, 400.
  http.Post(R"(/v1/responses/([^/]+)/cancel)",
            guarded(
                [this, not_stored](const httplib::Request& req, httplib::Response&) {
                  if (!responses_.get(req.matches[1])) throw not_stored(req.matches[1]);
                  throw ApiError(400,
                                 "response '" + req.matches[1].str() +
                                     "' was not created with background: true; only background "
                                     "responses can be cancelled, and this server runs none",
                                 "invalid_request_error", "", "invalid_value");
                },
                false));
  handle_post(http, "/v1/responses/input_tokens",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { handle_input_tokens(req, res); },
                      false));
  http.Delete(R"(/v1/responses/([^/]+))",
              guarded(
                  [this, not_stored](const httplib::Request& req, httplib::Response& res) {
                    if (!responses_.erase(req.matches[1])) throw not_stored(req.matches[1]);
                    res.set_content(dump({{"id", req.matches[1].str()},
                                          {"object", "response.deleted"},
                                          {"deleted", true}}),
                                    "application/json");
                  },
                  false));
  handle_post(http, "/v1/messages",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { handle_messages(req, res); },
                      true, ErrorShape::kAnthropic));
  for (const bool translate : {false, true}) {
    handle_post(http, translate ? "/v1/audio/translations" : "/v1/audio/transcriptions",
                guarded(
                    [this, translate](const httplib::Request& req, httplib::Response& res) {
                      handle_transcription(req, res, translate);
                    },
                    true));
  }
  handle_post(http, "/v1/messages/count_tokens",
              guarded([this](const httplib::Request& req,
                             httplib::Response& res) { handle_count_tokens(req, res); },
                      true, ErrorShape::kAnthropic));
  for (const bool chat : {true, false}) {
    handle_post(http, chat ? "/api/chat" : "/api/generate",
                guarded([this, chat](const httplib::Request& req,
                                     httplib::Response& res) { handle_ollama(req, res, chat); },
                        true, ErrorShape::kOllama));
  }
  add_ollama_info_routes(http);
  add_sleep_routes(http);
  handle_post(http, "/tokenize",
              guarded(
                  [this](const httplib::Request& req, httplib::Response& res) {
                    const auto r = parse_tokenize_request(parse_body(req.body));
                    const auto ids = tokenizer_->encode(r.content, r.add_special);
                    ojson tokens = ojson::array();
                    for (int64_t id : ids) {
                      if (!r.with_pieces) {
                        tokens.push_back(id);
                        continue;
                      }
                      // llama.cpp: the piece as text, or its bytes when not UTF-8
                      // (a byte token's one byte).
                      const std::string piece = tokenizer_->token_bytes(id);
                      ojson p = is_valid_utf8(piece)
                                    ? ojson(piece)
                                    : ojson(std::vector<uint8_t>(piece.begin(), piece.end()));
                      tokens.push_back({{"id", id}, {"piece", p}});
                    }
                    res.set_content(dump({{"tokens", tokens}}), "application/json");
                  },
                  true));
  // llama-server's POST /apply-template: the prompt a chat request's body renders to, as the
  // model would read it, without running the model.
  handle_post(http, "/apply-template",
              guarded(
                  [this](const httplib::Request& req, httplib::Response& res) {
                    const GenerationRequest r = parse_chat_request(parse_body(req.body));
                    check_model(r.model);
                    std::string parser_prefix;
                    std::string prompt;
                    try {
                      prompt = render_chat(r, parser_prefix);
                    } catch (const ValueError& e) {
                      throw ApiError(400, e.what(), "invalid_request_error", "messages",
                                     "invalid_value");
                    }
                    res.set_content(dump({{"prompt", prompt}}), "application/json");
                  },
                  true));
  handle_post(
      http, "/detokenize",
      guarded(
          [this](const httplib::Request& req, httplib::Response& res) {
            const auto ids = parse_detokenize_request(parse_body(req.body));
            for (size_t i = 0; i < ids.size(); ++i) {
              try {
                tokenizer_->id_to_token(ids[i]);
              } catch (const ValueError&) {
                throw ApiError(400,
                               "'tokens[" + std::to_string(i) + "]' is " + std::to_string(ids[i]) +
                                   ", which is no token of the vocabulary [0, " +
                                   std::to_string(tokenizer_->vocab_size()) + ")",
                               "invalid_request_error", "tokens", "invalid_value");
              }
            }
            res.set_content(dump({{"content", tokenizer_->decode(ids)}}), "application/json");
          },
          true));

  add_web_routes(http);
  add_mcp_routes(
      http, [this](httplib::Server::Handler h) { return guarded(h, false); }, mcp_files_);

  // Another method on a fixed route is refused before anything reads a body: cpp-httplib reads
  // a POST's first (`curl -X POST /v1/models`, with no length, was a 400 "malformed request").
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (is_preflight(req)) {
      answer_preflight(req, res);
      return httplib::Server::HandlerResponse::Handled;
    }
    const auto it = kRoutes.find(req.path);
    if (it == kRoutes.end()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string allowed = ", " + it->second + ", ";
    const std::string method = req.method == "HEAD" ? "GET" : req.method;  // httplib's HEAD
    if (allowed.find(", " + method + ", ") != std::string::npos) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    try {
      refuse_unrouted(req, res);
    } catch (const ApiError& e) {
      send_error(res, e, error_shape(req.path));
    }
    return httplib::Server::HandlerResponse::Handled;
  });

  // Everything that reaches here without a body: unknown routes, wrong methods, bodies too large.
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        try {
          if (const auto refusal = read_refusal()) {
            throw ApiError(refusal->status, refusal->message, "invalid_request_error", "",
                           refusal->code);
          }
          if (res.status == 404) refuse_unrouted(req, res);
          if (res.status == 415) {
            throw ApiError(415, content_coding_refusal(req), "invalid_request_error", "",
                           "unsupported_content_encoding");
          }
          // cpp-httplib 0.11 answers these before any handler and says no more than the status.
          if (res.status == 414) {
            throw ApiError(414,
                           "the request target is longer than " +
                               std::to_string(CPPHTTPLIB_REQUEST_URI_MAX_LENGTH) + " bytes",
                           "invalid_request_error", "", "uri_too_long");
          }
          if (res.status == 400) {
            throw ApiError(400,
                           "malformed HTTP request: a request line or header line that does "
                           "not parse, a body shorter than its Content-Length, or nothing "
                           "received for " +
                               std::to_string(CPPHTTPLIB_READ_TIMEOUT_SECOND) + " seconds",
                           "invalid_request_error", "", "malformed_request");
          }
          throw ApiError(res.status, "HTTP error " + std::to_string(res.status),
                         res.status >= 500 ? "server_error" : "invalid_request_error");
        } catch (const ApiError& e) {
          send_error(res, e, error_shape(req.path));
        }
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr error) {
        ApiError failure(500, "internal error", "server_error");
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          failure = internal_error("", e);
        } catch (...) {
        }
        send_error(res, failure, error_shape(req.path));
      });
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    allow_origin(req, res, is_loopback(options_.host));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(endpoint_label(req.path), res.status);
  });
}

int Server::run() {
  SignalHandlers signals(options_.install_signal_handlers);
  HttpServer http;
  // A thread for every request decoding or waiting, and 64 for the quick routes and connections
  // that send nothing yet: a thread serves one connection at a time, and an idle one (a
  // browser's preconnect, a balancer's pool) holds it until its head comes or times out, while
  // /health must still answer. With 8, 16 idle connections held a probe for 1.5 s, 100 for 11.5.
  const size_t threads =
      static_cast<size_t>(std::max(0, options_.max_queue) + options_.parallel) + 64;
  http.new_task_queue = [this, threads] { return new CountingPool(threads, open_connections_); };
  http.set_tcp_nodelay(true);
  http.set_payload_max_length(static_cast<size_t>(options_.max_body_bytes));
  http.set_keep_alive_timeout(kKeepAliveSeconds);
  set_up_routes(http);

  const int port = bind_listener(http, options_.host, options_.port);
  if (port < 0) {
    throw std::runtime_error("cannot listen on " + options_.host + ":" +
                             std::to_string(options_.port) +
                             " (address in use, not local, or not allowed)");
  }
  std::thread worker([this] { worker_main(); });
  std::atomic<bool> listener_done = false;
  std::thread listener([&] {
    http.listen_after_bind();
    listener_done = true;
  });
  if (options_.on_listening) options_.on_listening(port);
  std::cout << "serving " << model_id_ << " on http://" << options_.host << ":" << port
            << std::endl;

  // Waits up to `timeout_ms` (-1: for ever) for a stop, and takes it.
  auto wait_for_stop = [](int timeout_ms) {
    pollfd wait{stop_pipe.read_fd, POLLIN, 0};
    int ready;
    while ((ready = poll(&wait, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    char taken[64];
    while (read(stop_pipe.read_fd, taken, sizeof(taken)) > 0) {
    }
    return ready > 0;
  };
  wait_for_stop(-1);

  // The drain: /health answers 503 while requests are still served, for as long as routers need
  // to notice (their endpoint lists and health checks lag by seconds); a second stop ends it.
  State ready = State::kReady;
  if (state_.compare_exchange_strong(ready, State::kDraining) && options_.drain_grace_s > 0) {
    std::cerr << "torchtpu-cpp serve: draining: /health answers 503, requests are served for "
              << options_.drain_grace_s << " s more\n";
    wait_for_stop(static_cast<int>(options_.drain_grace_s * 1000));
  }
  // New generation requests get 503 from here on; those already in (queued, decoding or being
  // written) are answered in full before the listener closes.
  State draining = State::kDraining;
  state_.compare_exchange_strong(draining, State::kStopping);
  {
    // One more stop (a second Ctrl-C, as llama-server and uvicorn take it) cancels them: a long
    // reply would otherwise hold the exit for minutes.
    std::unique_lock lock(active_mutex_);
    bool told = false;
    while (!active_changed_.wait_for(lock, std::chrono::milliseconds(200),
                                     [&] { return active_ == 0; })) {
      if (!told) {
        std::cerr << "torchtpu-cpp serve: stopping: " << active_
                  << " request(s) still being answered; stop again (Ctrl-C) to cancel them\n";
        told = true;
      }
      lock.unlock();
      if (wait_for_stop(0)) {
        std::cerr << "torchtpu-cpp serve: cancelling the requests still being answered\n";
        abandon_all();
      }
      lock.lock();
    }
  }
  // Connections accepted but not read yet hold requests too (they get their 503 now). Idle
  // keep-alive connections close within the keep-alive timeout and slow senders within the read
  // timeout; a client connecting after that is refused by the closed listener.
  const auto connections_deadline =
      Clock::now() + std::chrono::seconds(kKeepAliveSeconds + CPPHTTPLIB_READ_TIMEOUT_SECOND);
  while (open_connections_ > 0 && Clock::now() < connections_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // httplib's stop() does nothing until listen_after_bind() has marked the server running, and
  // after that it accepts until stopped: a stop that comes first (a load failure or a signal
  // before the listener thread is scheduled) would be lost and the join below would never return.
  // listen_after_bind() marks the server running as its first step and stays so until it
  // returns, so this wait is as short as a thread start.
  while (!http.is_running() && !listener_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  http.stop();
  listener.join();
  scheduler_.stop();
  worker.join();
  // Stops that came after the wake-up (a signal during shutdown, the engine thread's own stop
  // after a load failure) were for this run, not the next one.
  wait_for_stop(0);
  if (engine_error_) std::rethrow_exception(engine_error_);
  return 0;
}

}  // namespace

EngineOptions resolve_hub_ids(EngineOptions options, const hub::Options& hub) {
  // Anything else goes on to the engine, which names what is wrong with it.
  for (std::string* dir : {&options.model_dir, &options.emb4_dir, &options.draft_model}) {
    *dir = hub::resolve_if_repo_id(*dir, hub);
  }
  for (auto& spec : options.lora) spec.dir = hub::resolve_if_repo_id(spec.dir, hub);
  return options;
}

int run(const ServeOptions& options, EngineFactory make_engine) {
  check_port(options.port);
  // Refused here, before the "serving" line: the engine would refuse it as it loads, and the
  // warm-up's prompt (BOS and "Hello") as it decodes.
  if (options.engine.context < 2) {
    throw ValueError("--context must be at least 2, the warm-up's prompt, got " +
                     std::to_string(options.engine.context));
  }
  check_max_body_bytes(options.max_body_bytes);
  if (options.parallel < 1 || options.parallel > 256) {
    throw ValueError("--parallel must be between 1 and 256, got " +
                     std::to_string(options.parallel));
  }
  if (options.cache_mb < 0 || options.cache_mb > (int64_t{1} << 30)) {
    throw ValueError("--cache-mb must be between 0 and 2^30, got " +
                     std::to_string(options.cache_mb));
  }
  // The batch and the engine would refuse these too, but only once serving (the model loads
  // behind /health's 503), and naming their fields.
  if (options.step_tokens != 0 &&
      (options.step_tokens <= options.parallel || options.step_tokens > (int64_t{1} << 20))) {
    throw ValueError("--step-tokens must exceed --parallel (" + std::to_string(options.parallel) +
                     ") and be at most 2^20, or be 0 for the default, got " +
                     std::to_string(options.step_tokens));
  }
  if (options.pass_rows < 0) {
    throw ValueError("--pass-rows must be at least 0, got " + std::to_string(options.pass_rows));
  }
  if (options.max_queue < 0) {
    throw ValueError("--max-queue must be at least 0, got " + std::to_string(options.max_queue));
  }
  if (options.reasoning_budget < -1) {
    throw ValueError("--reasoning-budget must be -1 (no limit) or at least 0, got " +
                     std::to_string(options.reasoning_budget));
  }
  if (options.engine.int4_activation_bits != 16 && options.engine.int4_activation_bits != 8) {
    throw ValueError("--int4-activation-bits must be 16 or 8, got " +
                     std::to_string(options.engine.int4_activation_bits));
  }
  if (!(options.drain_grace_s >= 0 && options.drain_grace_s <= 3600)) {
    std::ostringstream given;
    given << options.drain_grace_s;
    throw ValueError("--drain-grace must be between 0 and 3600 seconds, got " + given.str());
  }
  if (!(options.sleep_idle_s == -1 || (options.sleep_idle_s >= 0 && options.sleep_idle_s <= 1e6))) {
    std::ostringstream given;
    given << options.sleep_idle_s;
    throw ValueError("--sleep-idle-seconds must be -1 (never) or between 0 and 1e6, got " +
                     given.str());
  }
  check_media_limits(options.media);
  options.draft.validate();
  // A directory that is not there is named now, before the "serving" line; the checkpoints'
  // contents are checked as they load, behind /health's 503.
  for (const std::string* dir :
       {&options.model_dir, &options.engine.emb4_dir, &options.engine.draft_model}) {
    if (!dir->empty() && !hub::looks_like_repo_id(*dir)) check_checkpoint_dir(*dir);
  }
  if (!options.slot_save_path.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.slot_save_path, error);
    if (!std::filesystem::is_directory(options.slot_save_path)) {
      throw ValueError("--slot-save-path " + options.slot_save_path +
                       " is not a folder this server can make" +
                       (error ? ": " + error.message() : std::string()));
    }
  }
  // The scheduler checks max_queue and read_every (with parallel) as it is built.
  Server server(options, std::move(make_engine));
  return server.run();
}

void request_stop() {
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = write(stop_pipe.write_fd, &byte, 1);
}

}  // namespace torchtpu::server
