// Choosing the next token from logits: greedy, or sampling with temperature, top-k, top-p, min-p,
// repetition / presence / frequency penalties and logit bias, in that order (as vLLM and
// transformers apply them). ATen ops only, on the logits' device; the random numbers come from a
// seeded host generator, so a seed reproduces the same tokens on the same build on any device.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>

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

class Sampler {
 public:
  // `prompt` ids feed the repetition penalty; vocab and device size the history tensors.
  Sampler(const SamplingParams& params, const at::Tensor& prompt, int64_t vocab,
          const at::Device& device);

  // The logits after bias, penalties, temperature and filtering (-inf outside the kept set):
  // the distribution `next` samples from. float32 [vocab].
  at::Tensor processed(const at::Tensor& logits) const;
  // The next token as an int64 tensor [1] on the device (no host synchronisation), and records
  // it for the penalties.
  at::Tensor next(const at::Tensor& logits);

 private:
  SamplingParams params_;
  at::Tensor seen_;    // bool [vocab]: in the prompt or generated (repetition penalty)
  at::Tensor counts_;  // float [vocab]: times generated (presence / frequency penalties)
  at::Tensor bias_;    // float [vocab] or undefined
  at::Generator generator_;
};

}  // namespace torchtpu
