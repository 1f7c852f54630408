// One sequence's output as its tokens reach the host: stop ids, the grammar's commits, the
// caller's on_tokens (which may cancel), and the timings. Engine::decode and Batch feed every
// token through it, so a sequence ends for the same reasons alone or in a batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine.h"

namespace torchtpu {

class SequenceOutput {
 public:
  // The clock for read_s starts here. `eos_ids` stop the sequence when the options name no stop
  // ids of their own. The prompt may have opened a thinking block already.
  SequenceOutput(const DecodeOptions& options, const std::vector<int64_t>& eos_ids,
                 const std::vector<int64_t>& prompt, OnTokens on_tokens);

  // Whether the next token is masked: a grammar constrains it, or a thinking budget is spent and
  // only the budget's message, then the block's closing marker, may come. `forbid` then fills a
  // host bool [vocab] with the tokens forbidden (Sampler::forbidden).
  bool masked() const { return constraint_ != nullptr || closing(); }
  void forbid(const at::Tensor& forbidden) const;
  // Moves `count` tokens read back from the device into the result, up to a stop id; returns
  // false when the sequence must end (a stop id: "stop"; on_tokens returned false: "cancelled").
  bool take(const int64_t* tokens, int64_t count);
  // Ends the sequence: finish is `finish` unless a stop or a cancel set it already; decode_s is
  // measured here.
  DecodeResult done(const char* finish);
  const DecodeResult& result() const { return result_; }

 private:
  using Clock = std::chrono::steady_clock;

  bool closing() const { return budget_ && thought_ >= budget_->tokens; }
  // Follows the thinking block's markers through `token`.
  void count_thought(int64_t token);

  std::vector<int64_t> stops_;
  bool ignore_eos_;
  std::shared_ptr<Constraint> constraint_;
  std::optional<ThinkingBudget> budget_;
  int64_t thought_ = -1;  // tokens since the open block's opening marker; -1: no block is open
  int64_t forced_ = 0;    // tokens of the budget's message written since the budget was spent
  OnTokens on_tokens_;
  DecodeResult result_;
  Clock::time_point start_;
};

}  // namespace torchtpu
