// Counters, histograms and load gauges of the server, rendered in the Prometheus text format
// (version 0.0.4) at /metrics, where routers (the Gateway API Inference Extension's endpoint
// picker, docs/SCALING.md) and autoscalers read them. Every method is safe to call from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/prefix_cache.h"

namespace torchtpu::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // The _bucket (cumulative, with le="+Inf"), _sum and _count lines of metric `name`, each
  // sample carrying `labels` (`name="value"` pairs, already escaped) before le.
  std::string render(const std::string& name, const std::string& labels = "") const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// What the engine holds at the moment of a scrape: the signals a router balances replicas by.
struct EngineLoad {
  int64_t waiting = 0;  // requests queued for the engine, not yet decoding
  int64_t running = 0;  // sequences the engine is decoding
  int64_t rows = 0;     // sequences it can decode at once (--parallel)
  // Cache positions held by running sequences over the positions the cache has, 0..1.
  double kv_cache_usage = 0;
  // The cache's shape in blocks; 0 blocks: not known yet (the engine is loading), and the info
  // gauge is left out.
  int64_t block_size = 0;  // tokens per block
  int64_t blocks = 0;
  double busy_seconds = 0;  // the engine thread's time in decode steps
  bool asleep = false;      // the weights are freed after --sleep-idle-seconds
  int64_t sleeps = 0;
  PrefixCacheStats prefix_cache;
  int64_t prefix_cache_budget = 0;  // bytes; 0: no prefix cache
  // LoRA adapters: how many are loaded, and the names (comma-separated) of those requests apply
  // in a row and of those requests waiting for one apply (vLLM's vllm:lora_requests_info).
  int64_t max_lora = 0;
  std::string running_lora_adapters, waiting_lora_adapters;
};

// Where one sequence's time went, from its entering the queue to its end.
struct RequestTimes {
  double queue_s = 0;    // waiting for a row
  double prefill_s = 0;  // from taking a row to its first token on the host
  double decode_s = 0;   // from its first token to its end
  double e2e_s = 0;      // from entering the queue to its end
  int64_t tokens = 0;    // tokens generated
};

// Which other engine's names the load gauges are also exported under.
enum class MetricsCompat { kNone, kVllm };

// "none" or "vllm"; ValueError naming the flag otherwise.
MetricsCompat parse_metrics_compat(const std::string& name);

class Metrics {
 public:
  // `model_name` labels the vLLM-named series, as vLLM labels them.
  explicit Metrics(MetricsCompat compat = MetricsCompat::kNone, std::string model_name = "");

  void count_request(const std::string& endpoint, int status);
  void count_tokens(int64_t prompt, int64_t generated);
  // Speculative decoding's draft tokens checked and kept (--draft-max).
  void count_drafts(int64_t drafted, int64_t accepted);
  void count_cancelled();
  // A sequence the engine started, once it has ended (finished, stopped or cancelled).
  void observe_request(const RequestTimes& times);
  // The time between two deliveries of a sequence's new tokens: one a decode step, or one every
  // --read-every steps.
  void observe_inter_token_latency(double seconds);

  std::string render(const EngineLoad& load) const;

 private:
  MetricsCompat compat_;
  std::string model_name_;
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  int64_t drafted_tokens_ = 0;
  int64_t accepted_tokens_ = 0;
  int64_t cancelled_ = 0;
  Histogram ttft_;
  Histogram decode_rate_;
  Histogram queue_, prefill_, decode_, e2e_;
  Histogram inter_token_;
};

}  // namespace torchtpu::server
