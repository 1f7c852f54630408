#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "common/errors.h"
#include "common/number.h"
#include "ops/argmax.h"

namespace torchtpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The per-row numbers a call uploads, one float column each ([count, kColumns], one copy).
// "Off" values leave every token in: top_k = vocab, top_p = infinity, min_p = 0.
enum Column : int64_t {
  kUniform,      // the row's draw in [0, 1) (0 for a row that does not sample)
  kGreedy,       // 1: the token is the argmax
  kSorted,       // 1: top-k or top-p on, the candidates are taken most likely first
  kTemperature,  // 1 for a greedy row
  kTopK,
  kTopP,
  kMinP,
  kRepetition,
  kPresence,
  kFrequency,
  kColumns,
};

void check(bool ok, const std::string& message) {
  if (!ok) throw ValueError(message);
}

}  // namespace

void SamplingParams::validate(int64_t vocab) const {
  check(std::isfinite(temperature) && temperature >= 0,
        "temperature must be >= 0, got " + number_str(temperature));
  check(top_k >= 0, "top_k must be >= 0 (0 turns it off), got " + std::to_string(top_k));
  check(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got " + number_str(top_p));
  check(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got " + number_str(min_p));
  check(repetition_penalty > 0,
        "repetition_penalty must be > 0, got " + number_str(repetition_penalty));
  check(presence_penalty >= -2 && presence_penalty <= 2,
        "presence_penalty must be in [-2, 2], got " + number_str(presence_penalty));
  check(frequency_penalty >= -2 && frequency_penalty <= 2,
        "frequency_penalty must be in [-2, 2], got " + number_str(frequency_penalty));
  for (const auto& [id, bias] : logit_bias) {
    check(id >= 0 && id < vocab, "logit_bias names token " + std::to_string(id) +
                                     ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
    check(bias >= -100 && bias <= 100, "logit_bias for token " + std::to_string(id) +
                                           " must be in [-100, 100], got " + number_str(bias));
  }
}

Sampler::Sampler(int64_t rows, int64_t vocab, const at::Device& device, bool fixed_shape)
    : vocab_(vocab), fixed_shape_(fixed_shape), rows_(rows) {
  const auto on = at::TensorOptions().device(device);
  seen_ = at::zeros({rows, vocab}, on.dtype(at::kBool));
  counts_ = at::zeros({rows, vocab}, on.dtype(at::kFloat));
  bias_ = at::zeros({rows, vocab}, on.dtype(at::kFloat));
  positions_ = at::arange(vocab, on.dtype(at::kLong)).view({1, vocab});
  forbidden_host_ = at::zeros({rows, vocab}, at::kBool);
  if (fixed_shape_) forbidden_ = at::zeros({rows, vocab}, on.dtype(at::kBool));
}

void Sampler::set(int64_t row, const SamplingParams& params, const std::vector<int64_t>& prompt) {
  params.validate(vocab_);
  clear(row);
  Row& r = rows_[row];
  r.params = params;
  r.biased = !params.logit_bias.empty();
  r.generator.seed(params.seed ? *params.seed : std::random_device{}());
  const auto device = seen_.device();
  seen_[row].fill_(false).index_fill_(0, at::tensor(prompt, at::kLong).to(device), true);
  counts_[row].zero_();
  bias_[row].zero_();
  if (r.biased) {
    std::vector<int64_t> ids;
    std::vector<float> values;
    for (const auto& [id, bias] : params.logit_bias) {
      ids.push_back(id);
      values.push_back(static_cast<float>(bias));
    }
    bias_[row].index_put_({at::tensor(ids, at::kLong).to(device)},
                          at::tensor(values, at::kFloat).to(device));
  }
}

void Sampler::clear(int64_t row) {
  if (rows_[row].constrained) forbidden_host_[row].zero_();
  rows_[row] = Row{};
}

at::Tensor Sampler::forbidden(int64_t row) {
  rows_[row].constrained = true;
  return forbidden_host_[row];
}

at::Tensor Sampler::next(const at::Tensor& logits, int64_t first) {
  const int64_t count = logits.size(0);
  const auto device = logits.device();
  // What the rows of this call need: everything with fixed shapes, else the union of the rows'.
  bool constrained = false, biased = false, repetition = false, occurrence = false;
  bool greedy = false, sampling = false, sorted = false, unsorted = false;
  bool top_k = false, top_p = false, min_p = false;
  int64_t candidates = 0;  // the most any sampling row's top_k keeps (vocab_ when one keeps all)
  for (int64_t i = 0; i < count; ++i) {
    const Row& r = rows_[first + i];
    const SamplingParams& p = r.params;
    constrained |= r.constrained;
    biased |= r.biased;
    repetition |= p.repetition_penalty != 1.0;
    occurrence |= p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
    greedy |= p.greedy();
    if (!p.greedy()) {
      const bool k = p.top_k > 0 && p.top_k < vocab_;
      sampling = true;
      if (k || p.top_p < 1.0) {
        sorted = true;
      } else {
        unsorted = true;
      }
      top_k |= k;
      top_p |= p.top_p < 1.0;
      min_p |= p.min_p > 0.0;
      candidates = std::max(candidates, k ? p.top_k : vocab_);
    }
  }
  if (fixed_shape_) {
    constrained = biased = repetition = occurrence = greedy = sampling = sorted = unsorted = true;
    top_k = top_p = min_p = true;
    candidates = vocab_;
  }

  auto x = logits.to(at::kFloat);
  if (fixed_shape_) {
    // Every call applies the device's copy of the masks; it goes up only when some row has one
    // or had one in the call before (to clear it).
    const bool any =
        std::any_of(rows_.begin(), rows_.end(), [](const Row& r) { return r.constrained; });
    if (any || forbidden_stale_) forbidden_.copy_(forbidden_host_);
    forbidden_stale_ = any;
    x = x.masked_fill(forbidden_.narrow(0, first, count), kNegInf);
  } else if (constrained) {
    x = x.masked_fill(forbidden_host_.narrow(0, first, count).to(device), kNegInf);
  }
  for (int64_t i = 0; i < count; ++i) {
    Row& r = rows_[first + i];
    if (r.constrained) forbidden_host_[first + i].zero_();
    r.constrained = false;
  }
  if (biased) x = x + bias_.narrow(0, first, count);
  if (!repetition && !occurrence && !sampling) return ops::argmax_last(x);

  auto host = at::empty({count, kColumns}, at::kFloat);
  for (int64_t i = 0; i < count; ++i) {
    Row& r = rows_[first + i];
    const SamplingParams& p = r.params;
    const bool k = p.top_k > 0 && p.top_k < vocab_;
    float* column = host.data_ptr<float>() + i * kColumns;
    // 24 random bits: a float in [0, 1) exactly, the same from the same seed on any platform.
    column[kUniform] = p.greedy() ? 0.0f : static_cast<float>(r.generator() >> 40) * 0x1p-24f;
    column[kGreedy] = p.greedy() ? 1.0f : 0.0f;
    column[kSorted] = k || p.top_p < 1.0 ? 1.0f : 0.0f;
    column[kTemperature] = p.greedy() ? 1.0f : static_cast<float>(p.temperature);
    column[kTopK] = static_cast<float>(k ? p.top_k : vocab_);
    column[kTopP] =
        p.top_p < 1.0 ? static_cast<float>(p.top_p) : std::numeric_limits<float>::infinity();
    column[kMinP] = static_cast<float>(p.min_p);
    column[kRepetition] = static_cast<float>(p.repetition_penalty);
    column[kPresence] = static_cast<float>(p.presence_penalty);
    column[kFrequency] = static_cast<float>(p.frequency_penalty);
  }
  const auto columns = host.to(device).split(1, /*dim=*/1);
  const auto seen = seen_.narrow(0, first, count);
  const auto counts = counts_.narrow(0, first, count);
  if (repetition) {
    const auto& penalty = columns[kRepetition];
    x = at::where(seen, at::where(x > 0, x / penalty, x * penalty), x);
  }
  if (occurrence) {
    x = x - columns[kFrequency] * counts - columns[kPresence] * (counts > 0).to(at::kFloat);
  }
  at::Tensor token;
  if (greedy) token = ops::argmax_last(x).unsqueeze(-1);
  if (sampling) {
    // The candidates in the order the row's filters need: most likely first for top-k and top-p
    // (all tokens, or on the CPU the top `candidates` when every sampling row keeps no more:
    // their leading values are the same either way), else the vocabulary's order.
    const auto scaled = x / columns[kTemperature];
    at::Tensor values = scaled, order;
    if (sorted) std::tie(values, order) = top_first(scaled, candidates);
    if (sorted && unsorted) {
      const auto by_row = columns[kSorted] > 0;
      values = at::where(by_row, values, scaled);
      order = at::where(by_row, order, positions_);
    }
    // Weights relative to the most likely token: the filters and the draw need no normalisation,
    // and each cumulative sum adds the same values in the same order however many candidates
    // there are, so a row draws the same token alone or beside rows that keep more.
    const auto top = sorted && !unsorted ? values.narrow(1, 0, 1) : scaled.amax(1, true);
    auto weights = (values - top).exp();
    const int64_t last = values.size(1) - 1;
    if (top_k) {
      weights = weights.masked_fill(positions_.narrow(1, 0, last + 1) >= columns[kTopK], 0.0);
    }
    if (top_p) {
      // Keep the smallest set of most likely tokens whose mass reaches top_p (the top one always).
      const auto cumulative = weights.cumsum(1);
      const auto before = cumulative - weights;
      weights = weights.masked_fill(before >= columns[kTopP] * cumulative.narrow(1, last, 1), 0.0);
    }
    // The top weight is 1, so min_p of the top probability is min_p itself.
    if (min_p) weights = weights.masked_fill(weights < columns[kMinP], 0.0);
    // Inverse transform sampling: the first candidate whose cumulative weight passes the draw.
    const auto cumulative = weights.cumsum(1);
    const auto pick = (cumulative < columns[kUniform] * cumulative.narrow(1, last, 1)).sum(1, true);
    const auto sampled = sorted ? order.gather(1, pick) : pick;
    token = greedy ? at::where(columns[kGreedy] > 0, token, sampled) : sampled;
  }
  if (repetition) seen.scatter_(1, token, true);
  if (occurrence) counts.scatter_add_(1, token, at::ones_like(token, counts.options()));
  return token.view({count});
}

std::tuple<at::Tensor, at::Tensor> top_first(const at::Tensor& x, int64_t k) {
  if (k >= x.size(1)) return x.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
  // topk orders equal values as it likes: by index first, then stably by value.
  const auto [values, ids] = x.topk(k, /*dim=*/1);
  const auto [by_id, from] = ids.sort(/*dim=*/1);
  const auto [sorted, to] = values.gather(1, from).sort(/*stable=*/true, /*dim=*/1,
                                                        /*descending=*/true);
  return {sorted, by_id.gather(1, to)};
}

}  // namespace torchtpu
