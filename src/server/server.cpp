// The server's life: building it, loading the engine on its own thread, the routes and the guard
// around them (the API key, browser checks, error shapes), serving, and the drain on a stop.
#include "server/server.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "build_info.h"
#include "common/json_type.h"
#include "io/config.h"
#include "server/anthropic.h"
#include "server/auth.h"
#include "server/demo.h"
#include "server/server_internal.h"
#include "server/web/web.h"

namespace torchtpu::server {
namespace {

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

// Idle keep-alive connections hold shutdown back for at most this long.
constexpr int kKeepAliveSeconds = 2;

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

// The names the model is served under: the id (--model-id, else the first --served-model-name,
// else the demo's id or the checkpoint directory's name), then the other aliases, each once.
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

}  // namespace

Server::Server(const ServeOptions& options, EngineFactory make_engine)
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

namespace {

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

}  // namespace

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
  handle_post(http, R"(/v1/responses/([^/]+)/cancel)",
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
