// What the server says of its model and lets an operator change: the model listings, LoRA
// adapters, /props, /slots, /v1/engine, the load gauges, Ollama's model routes and sleep mode.
#include "server/server_internal.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "build_info.h"
#include "common/fnv1a.h"
#include "engine/report.h"
#include "io/config.h"

namespace torchtpu::server {

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

namespace {

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

}  // namespace

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

}  // namespace torchtpu::server
