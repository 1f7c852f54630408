#include "engine/logprobs.h"

namespace torchtpu {

TokenLogprob token_logprob(const at::Tensor& row, int64_t id, int64_t top, bool ranked) {
  const at::Tensor chosen = row[id];
  TokenLogprob lp{id, chosen.item<double>(), {}};
  if (top > 0) {
    auto [values, ids] = row.topk(top);
    values = values.to(at::kCPU);
    ids = ids.to(at::kCPU);
    for (int64_t i = 0; i < top; ++i) {
      lp.top.emplace_back(ids[i].item<int64_t>(), values[i].item<double>());
    }
  }
  if (ranked) lp.rank = (row > chosen).sum().item<int64_t>() + 1;
  return lp;
}

void append_prompt_logprobs(const at::Tensor& logits, int64_t first,
                            const std::vector<int64_t>& prompt, int64_t top,
                            std::vector<TokenLogprob>& into) {
  const auto rows = at::log_softmax(logits.to(at::kFloat), 1);
  for (int64_t j = 0; j < rows.size(0); ++j) {
    into.push_back(token_logprob(rows[j], prompt[first + j + 1], top, true));
  }
}

}  // namespace torchtpu
