// Choosing the next token from logits for several sequences at once (one row each): greedy, or
// sampling with temperature, top-k, top-p, min-p, repetition / presence / frequency penalties and
// logit bias, in that order (as vLLM and transformers apply them). ATen ops only, on the logits'
// device; each row's random numbers come from its own seeded host generator, so a seed reproduces
// the same tokens on the same build on any device, and in a batch as alone.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

namespace torchtpu {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (argmax), every other knob then only shapes logprobs
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  double repetition_penalty = 1.0;  // transformers' rule, over prompt and generated tokens
  double presence_penalty = 0.0;    // OpenAI's rules, over generated tokens
  double frequency_penalty = 0.0;
  std::map<int64_t, double> logit_bias;
  std::optional<uint64_t> seed;  // none: a random seed

  bool greedy() const { return temperature <= 0.0; }
  // ValueError naming the parameter for values outside their ranges.
  void validate(int64_t vocab) const;
};

// The k largest values of each row of `x` [rows, n] and their indices, the largest first and,
// among equal values, the smaller index first: argmax_last's rule, so that a greedy token leads
// its top_logprobs and top-p's candidates. (Which of the values tied at the k-th place are kept
// is topk's choice.)
std::tuple<at::Tensor, at::Tensor> top_first(const at::Tensor& x, int64_t k);

// The sampling state of `rows` sequences over one vocabulary: per-row parameters on the host,
// per-row histories and biases as [rows, vocab] tensors on the device. Rows are set when a
// sequence joins and cleared when it leaves, between calls to `next`, without changing any shape.
//
// With `fixed_shape`, every call runs every row, free ones included, through the same ops with
// the same shapes whatever the rows' parameters (a greedy row is a `where` over the sampled
// token), so a decode step stays one program on a compiling device. Without it, ops that no row
// of the call needs are skipped (the CPU's greedy step is one argmax); a row's tokens are the same
// either way, since every skipped op leaves the rows that skip it bit for bit unchanged.
class Sampler {
 public:
  Sampler(int64_t rows, int64_t vocab, const at::Device& device, bool fixed_shape);

  // A sequence takes `row`: its parameters (ValueError from validate), its generator, its prompt
  // in the repetition history. Device ops on that row's slices of the histories and bias.
  void set(int64_t row, const SamplingParams& params, const std::vector<int64_t>& prompt);
  // The row is free: greedy and unpenalised from the next call on (host only, so a sequence can
  // leave within a step; the next `set` resets its device state).
  void clear(int64_t row);
  // A host bool [vocab] for the caller to fill with the tokens `row` may not take in the next
  // call (a grammar's mask); only rows asked for in a step are constrained in it. With
  // `fixed_shape` the masks of all rows go up in one copy in the steps that have any.
  at::Tensor forbidden(int64_t row);

  // The next token of rows [first, first + logits.size(0)) from their float32 logits
  // [count, vocab]: int64 [count] on the device (no host synchronisation). Records the tokens in
  // the histories of the rows with penalties and draws one number from each sampling row's
  // generator.
  at::Tensor next(const at::Tensor& logits, int64_t first = 0);

 private:
  struct Row {
    SamplingParams params;
    bool biased = false;
    bool constrained = false;  // forbidden() was asked for since the last call
    std::mt19937_64 generator;
  };

  int64_t vocab_;
  bool fixed_shape_;
  std::vector<Row> rows_;
  at::Tensor seen_;    // bool [rows, vocab]: in the prompt or generated (repetition penalty)
  at::Tensor counts_;  // float [rows, vocab]: times generated (presence / frequency penalties)
  at::Tensor bias_;    // float [rows, vocab]
  // int64 [1, vocab]: 0, 1, ... Top-k keeps the first k sorted (ties at the k-th value are cut
  // where the sort puts them).
  at::Tensor positions_;
  at::Tensor forbidden_host_;     // bool [rows, vocab] on the host, filled through forbidden()
  at::Tensor forbidden_;          // its copy on the device (fixed_shape only)
  bool forbidden_stale_ = false;  // the device copy still holds a mask of an earlier call
};

}  // namespace torchtpu
