// Counters and histograms of the server, rendered in the Prometheus text format (version 0.0.4) at
// /metrics. Every method is safe to call from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace torchtpu::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // The _bucket (cumulative, with le="+Inf"), _sum and _count lines of metric `name`.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  void count_request(const std::string& endpoint, int status);
  void count_tokens(int64_t prompt, int64_t generated);
  void count_cancelled();
  void observe_time_to_first_token(double seconds);
  void observe_decode_rate(double tokens_per_second);
  void add_busy_seconds(double seconds);

  std::string render(int64_t queue_depth) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  int64_t cancelled_ = 0;
  double busy_seconds_ = 0;
  Histogram ttft_;
  Histogram decode_rate_;
};

}  // namespace torchtpu::server
