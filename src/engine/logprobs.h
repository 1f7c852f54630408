// Log-probabilities of tokens under the logits that scored them: what a response's logprobs, a
// prompt's logprobs (vLLM's prompt_logprobs, OpenAI's echo) and Engine::score report.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace torchtpu {

// One token's log-probability under the logits it was chosen from or scored by, and the most
// likely alternatives there, best first.
struct TokenLogprob {
  int64_t id;
  double logprob;
  std::vector<std::pair<int64_t, double>> top;
  int64_t rank = 0;  // when ranked: 1 + how many tokens the logits put above it
};

// The entry of token `id` under log_softmax `row` [vocab] (float32), with its `top` most likely
// alternatives, and with `ranked` its rank.
TokenLogprob token_logprob(const at::Tensor& row, int64_t id, int64_t top, bool ranked);

// The ranked entries of prompt positions [first, first + logits.size(0)) (OnPromptLogits'
// arguments: raw logits [count, vocab]), each scoring the prompt token after it, appended to
// `into` in order.
void append_prompt_logprobs(const at::Tensor& logits, int64_t first,
                            const std::vector<int64_t>& prompt, int64_t top,
                            std::vector<TokenLogprob>& into);

}  // namespace torchtpu
