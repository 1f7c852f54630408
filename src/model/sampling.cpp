#include "model/sampling.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/errors.h"

namespace torchtpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void check(bool ok, const std::string& message) {
  if (!ok) throw ValueError(message);
}

}  // namespace

void SamplingParams::validate(int64_t vocab) const {
  check(std::isfinite(temperature) && temperature >= 0,
        "temperature must be >= 0, got " + std::to_string(temperature));
  check(top_k >= 0, "top_k must be >= 0 (0 turns it off), got " + std::to_string(top_k));
  check(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got " + std::to_string(top_p));
  check(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got " + std::to_string(min_p));
  check(repetition_penalty > 0,
        "repetition_penalty must be > 0, got " + std::to_string(repetition_penalty));
  check(presence_penalty >= -2 && presence_penalty <= 2,
        "presence_penalty must be in [-2, 2], got " + std::to_string(presence_penalty));
  check(frequency_penalty >= -2 && frequency_penalty <= 2,
        "frequency_penalty must be in [-2, 2], got " + std::to_string(frequency_penalty));
  for (const auto& [id, bias] : logit_bias) {
    check(id >= 0 && id < vocab, "logit_bias names token " + std::to_string(id) +
                                     ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    check(bias >= -100 && bias <= 100, "logit_bias for token " + std::to_string(id) +
                                           " must be in [-100, 100], got " + std::to_string(bias));
  }
}

Sampler::Sampler(const SamplingParams& params, const at::Tensor& prompt, int64_t vocab,
                 const at::Device& device)
    : params_(params) {
  params_.validate(vocab);
  const auto on = at::TensorOptions().device(device);
  seen_ = at::zeros({vocab}, on.dtype(at::kBool));
  seen_.index_fill_(0, prompt.to(device).view({-1}), true);
  counts_ = at::zeros({vocab}, on.dtype(at::kFloat));
  if (!params_.logit_bias.empty()) {
    std::vector<int64_t> ids;
    std::vector<float> values;
    for (const auto& [id, bias] : params_.logit_bias) {
      ids.push_back(id);
      values.push_back(static_cast<float>(bias));
    }
    bias_ = at::zeros({vocab}, at::kFloat)
                .index_put_({at::tensor(ids, at::kLong)}, at::tensor(values, at::kFloat))
                .to(device);
  }
  const uint64_t seed = params_.seed ? *params_.seed : std::random_device{}();
  generator_ = at::make_generator<at::CPUGeneratorImpl>(seed);
}

at::Tensor Sampler::processed(const at::Tensor& logits) const {
  const auto& p = params_;
  auto x = logits.to(at::kFloat);
  if (bias_.defined()) x = x + bias_;
  if (p.repetition_penalty != 1.0) {
    auto penalised = at::where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty);
    x = at::where(seen_, penalised, x);
  }
  if (p.presence_penalty != 0.0 || p.frequency_penalty != 0.0) {
    x = x - p.frequency_penalty * counts_ - p.presence_penalty * (counts_ > 0).to(at::kFloat);
  }
  if (p.greedy()) return x;
  x = x / p.temperature;
  const int64_t vocab = x.size(0);
  if (p.top_k > 0 && p.top_k < vocab) {
    auto kth = std::get<0>(x.topk(p.top_k)).select(0, p.top_k - 1);
    x = x.masked_fill(x < kth, kNegInf);
  }
  if (p.top_p < 1.0) {
    // Keep the smallest set of most likely tokens whose mass reaches top_p (the top one always).
    auto [sorted, order] = x.sort(/*dim=*/0, /*descending=*/true);
    auto cumulative = sorted.softmax(0).cumsum(0);
    auto drop_sorted = (cumulative - sorted.softmax(0)) >= p.top_p;
    auto drop = at::zeros_like(drop_sorted).scatter(0, order, drop_sorted);
    x = x.masked_fill(drop, kNegInf);
  }
  if (p.min_p > 0.0) {
    auto probs = x.softmax(0);
    x = x.masked_fill(probs < p.min_p * probs.max(), kNegInf);
  }
  return x;
}

at::Tensor Sampler::next(const at::Tensor& logits) {
  auto x = processed(logits);
  at::Tensor token;
  if (params_.greedy()) {
    token = x.argmax().view({1});
  } else {
    // Gumbel-max: argmax(x + G) with G = -log(-log(U)) draws exactly from softmax(x).
    auto u = at::rand({x.size(0)}, generator_, at::TensorOptions().dtype(at::kFloat))
                 .clamp_(std::numeric_limits<float>::min(), 1.0f)
                 .to(x.device());
    token = (x - at::log(-at::log(u))).argmax().view({1});
  }
  counts_.index_add_(0, token, at::ones({1}, counts_.options()));
  seen_.index_fill_(0, token, true);
  return token;
}

}  // namespace torchtpu
