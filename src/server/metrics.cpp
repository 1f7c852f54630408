#include "server/metrics.h"

#include <charconv>
#include <chrono>

#include "common/errors.h"

namespace torchtpu::server {
namespace {

// The shortest text that reads back as `v` (0.025, not 0.025000000000000001).
std::string number(double v) {
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), v).ptr;
  return std::string(buffer, end);
}

// A label value in the text format's escaping: backslash, double quote and newline.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

// Bounds for the phases of a request, from a short answer on an accelerator to a long one on a
// CPU (vLLM's request latency buckets, with finer ones below its 0.3 s).
std::vector<double> request_bounds() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30,
          40, 50, 60, 120, 240, 480, 960, 1920, 7680};
}

}  // namespace

MetricsCompat parse_metrics_compat(const std::string& name) {
  if (name == "none") return MetricsCompat::kNone;
  if (name == "vllm") return MetricsCompat::kVllm;
  throw ValueError("--metrics-compat must be none or vllm, got '" + name + "'");
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& labels) const {
  std::string out;
  const std::string before_le = labels.empty() ? "" : labels + ",";
  const std::string own = labels.empty() ? "" : "{" + labels + "}";
  int64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + before_le + "le=\"" + le + "\"} " + std::to_string(cumulative) +
           "\n";
  }
  out += name + "_sum" + own + " " + number(sum_) + "\n";
  out += name + "_count" + own + " " + std::to_string(count_) + "\n";
  return out;
}


Metrics::Metrics(MetricsCompat compat, std::string model_name)
    : compat_(compat),
      model_name_(std::move(model_name)),
      ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      decode_rate_({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}),
      queue_(request_bounds()),
      prefill_(request_bounds()),
      decode_(request_bounds()),
      e2e_(request_bounds()),
      // vLLM's inter-token buckets, with finer ones below 10 ms for accelerators.
      inter_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                    0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::count_drafts(int64_t drafted, int64_t accepted) {
  std::lock_guard lock(mutex_);
  drafted_tokens_ += drafted;
  accepted_tokens_ += accepted;
}

void Metrics::count_cancelled() {
  std::lock_guard lock(mutex_);
  ++cancelled_;
}

void Metrics::observe_request(const RequestTimes& times) {
  std::lock_guard lock(mutex_);
  ttft_.observe(times.queue_s + times.prefill_s);
  if (times.tokens > 1 && times.decode_s > 0) {
    decode_rate_.observe(static_cast<double>(times.tokens - 1) / times.decode_s);
  }
  queue_.observe(times.queue_s);
  prefill_.observe(times.prefill_s);
  decode_.observe(times.decode_s);
  e2e_.observe(times.e2e_s);
}

void Metrics::observe_inter_token_latency(double seconds) {
  std::lock_guard lock(mutex_);
  inter_token_.observe(seconds);
}

std::string Metrics::render(const EngineLoad& load) const {
  std::lock_guard lock(mutex_);
  std::string out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  // A metric of one unlabelled sample.
  auto single = [&](const char* name, const char* type, const char* help,
                    const std::string& value) {
    header(name, type, help);
    out += std::string(name) + " " + value + "\n";
  };
  header("torchtpu_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_) {
    out += "torchtpu_requests_total{endpoint=\"" + key.first + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(n) + "\n";
  }
  single("torchtpu_prompt_tokens_total", "counter", "Prompt tokens read by the engine.",
         std::to_string(prompt_tokens_));
  single("torchtpu_generated_tokens_total", "counter", "Tokens generated by the engine.",
         std::to_string(generated_tokens_));
  single("torchtpu_draft_tokens_total", "counter",
         "Draft tokens speculative decoding checked (--draft-max).",
         std::to_string(drafted_tokens_));
  single("torchtpu_draft_accepted_tokens_total", "counter",
         "Draft tokens speculative decoding kept.", std::to_string(accepted_tokens_));
  single("torchtpu_requests_cancelled_total", "counter",
         "Requests whose client went away before the answer was complete.",
         std::to_string(cancelled_));
  single("torchtpu_queue_depth", "gauge", "Requests waiting for the engine, not yet decoding.",
         std::to_string(load.waiting));
  single("torchtpu_running_requests", "gauge", "Requests the engine is decoding.",
         std::to_string(load.running));
  single("torchtpu_batch_rows", "gauge", "Requests the engine can decode at once (--parallel).",
         std::to_string(load.rows));
  single("torchtpu_kv_cache_usage_ratio", "gauge",
         "KV cache positions held by running requests over the cache's positions, 0 to 1.",
         number(load.kv_cache_usage));
  const std::string cache_labels = "block_size=\"" + std::to_string(load.block_size) +
                                   "\",num_gpu_blocks=\"" + std::to_string(load.blocks) + "\"";
  header("torchtpu_cache_config_info", "gauge",
         "The KV cache's shape: tokens per block and blocks, in labels; the value is 1.");
  if (load.blocks > 0) out += "torchtpu_cache_config_info{" + cache_labels + "} 1\n";
  // The adapters loaded and those requests apply (vLLM's vllm:lora_requests_info, which the
  // endpoint picker's lora-affinity scorer reads); the value is the sample's time, as vLLM's is
  // the time of its last update, and the picker takes the newest sample.
  const std::string lora_labels = "max_lora=\"" + std::to_string(load.max_lora) +
                                  "\",running_lora_adapters=\"" +
                                  label_value(load.running_lora_adapters) +
                                  "\",waiting_lora_adapters=\"" +
                                  label_value(load.waiting_lora_adapters) + "\"";
  const std::string now = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  header("torchtpu_lora_requests_info", "gauge",
         "LoRA adapters: how many are loaded (max_lora), and those running and waiting requests "
         "apply (comma-separated names); the value is the time of the sample.");
  out += "torchtpu_lora_requests_info{" + lora_labels + "} " + now + "\n";
  // The histograms, with the name vLLM gives the same figure where it has one.
  struct Timing {
    const char* name;
    const char* vllm;
    const char* help;
    const Histogram& histogram;
  };
  const Timing timings[] = {
      {"torchtpu_time_to_first_token_seconds", "vllm:time_to_first_token_seconds",
       "From a request entering the queue to its first token on the host.", ttft_},
      {"torchtpu_decode_tokens_per_second", nullptr,
       "Decode rate of each request after its first token, by the engine's timer.", decode_rate_},
      {"torchtpu_inter_token_latency_seconds", "vllm:inter_token_latency_seconds",
       "Time between two deliveries of a request's new tokens (one a decode step).", inter_token_},
      {"torchtpu_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds",
       "From a request entering the queue to its end.", e2e_},
      {"torchtpu_request_queue_time_seconds", "vllm:request_queue_time_seconds",
       "Time a request waited in the queue for a row.", queue_},
      {"torchtpu_request_prefill_time_seconds", "vllm:request_prefill_time_seconds",
       "From a request taking a row to its first token on the host (reading its prompt).",
       prefill_},
      {"torchtpu_request_decode_time_seconds", "vllm:request_decode_time_seconds",
       "From a request's first token to its end.", decode_},
  };
  for (const auto& t : timings) {
    header(t.name, "histogram", t.help);
    out += t.histogram.render(t.name);
  }
  single("torchtpu_engine_busy_seconds_total", "counter",
         "Seconds the engine thread spent in decode steps (one step serves every running "
         "request).",
         number(load.busy_seconds));
  single("torchtpu_engine_asleep", "gauge",
         "1 while the engine's weights and caches are freed (--sleep-idle-seconds), else 0.",
         load.asleep ? "1" : "0");
  single("torchtpu_engine_sleeps_total", "counter",
         "Times the engine freed its weights after --sleep-idle-seconds without a request.",
         std::to_string(load.sleeps));
  const auto& cache = load.prefix_cache;
  single("torchtpu_prefix_cache_hits_total", "counter",
         "Requests that started from KV the prefix cache held.", std::to_string(cache.hits));
  single("torchtpu_prefix_cache_misses_total", "counter",
         "Requests that found no prefix of theirs in the prefix cache.",
         std::to_string(cache.misses));
  single("torchtpu_prefix_cache_reused_tokens_total", "counter",
         "Prompt tokens taken from the prefix cache instead of being read.",
         std::to_string(cache.reused_tokens));
  single("torchtpu_prefix_cache_evictions_total", "counter",
         "Saved states the prefix cache dropped for its budget (least recently used first).",
         std::to_string(cache.evictions));
  single("torchtpu_prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.",
         std::to_string(cache.bytes));
  single("torchtpu_prefix_cache_budget_bytes", "gauge", "The prefix cache's budget (--cache-mb).",
         std::to_string(load.prefix_cache_budget));
  if (compat_ == MetricsCompat::kVllm) {
    // The same figures under vLLM's names and its model_name label, for router, autoscaler and
    // KServe configurations written for vLLM (docs/SCALING.md).
    const std::string model = "model_name=\"" + label_value(model_name_) + "\"";
    auto sample = [&](const char* name, const std::string& labels, const std::string& value) {
      out += std::string(name) + "{" + labels + "} " + value + "\n";
    };
    header("vllm:num_requests_waiting", "gauge", "Requests waiting to be processed.");
    sample("vllm:num_requests_waiting", model, std::to_string(load.waiting));
    header("vllm:num_requests_running", "gauge", "Requests being decoded.");
    sample("vllm:num_requests_running", model, std::to_string(load.running));
    header("vllm:kv_cache_usage_perc", "gauge", "KV cache usage, 1 means 100 percent usage.");
    sample("vllm:kv_cache_usage_perc", model, number(load.kv_cache_usage));
    header("vllm:gpu_cache_usage_perc", "gauge",
           "KV cache usage, 1 means 100 percent usage (vLLM's name before 0.10).");
    sample("vllm:gpu_cache_usage_perc", model, number(load.kv_cache_usage));
    header("vllm:cache_config_info", "gauge", "Information of the KV cache's configuration.");
    if (load.blocks > 0) sample("vllm:cache_config_info", cache_labels, "1");
    header("vllm:lora_requests_info", "gauge",
           "LoRA adapters: how many are loaded (max_lora), and those running and waiting "
           "requests apply.");
    sample("vllm:lora_requests_info", lora_labels, now);
    header("vllm:prompt_tokens_total", "counter", "Prefill tokens processed.");
    sample("vllm:prompt_tokens_total", model, std::to_string(prompt_tokens_));
    header("vllm:generation_tokens_total", "counter", "Generation tokens processed.");
    sample("vllm:generation_tokens_total", model, std::to_string(generated_tokens_));
    // vLLM counts its prefix cache in tokens: those looked up, those found.
    header("vllm:spec_decode_num_draft_tokens_total", "counter", "Number of draft tokens.");
    sample("vllm:spec_decode_num_draft_tokens_total", model, std::to_string(drafted_tokens_));
    header("vllm:spec_decode_num_accepted_tokens_total", "counter",
           "Number of accepted tokens.");
    sample("vllm:spec_decode_num_accepted_tokens_total", model, std::to_string(accepted_tokens_));
    header("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in tokens.");
    sample("vllm:prefix_cache_queries_total", model, std::to_string(prompt_tokens_));
    header("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.");
    sample("vllm:prefix_cache_hits_total", model, std::to_string(cache.reused_tokens));
    for (const auto& t : timings) {
      if (!t.vllm) continue;
      header(t.vllm, "histogram", t.help);
      out += t.histogram.render(t.vllm, model);
    }
  }
  return out;
}

}  // namespace torchtpu::server
