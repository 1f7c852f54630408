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
  // ids of their own.
  SequenceOutput(const DecodeOptions& options, const std::vector<int64_t>& eos_ids,
                 int64_t prompt_tokens, OnTokens on_tokens);

  // Whether a grammar constrains the next token; `forbid` then fills a host bool [vocab] with
  // the tokens it forbids (Sampler::forbidden).
  bool constrained() const { return constraint_ != nullptr; }
  void forbid(const at::Tensor& forbidden) const { constraint_->forbid(forbidden); }
  // Moves `count` tokens read back from the device into the result, up to a stop id; returns
  // false when the sequence must end (a stop id: "stop"; on_tokens returned false: "cancelled").
  bool take(const int64_t* tokens, int64_t count);
  // Ends the sequence: finish is `finish` unless a stop or a cancel set it already; decode_s is
  // measured here.
  DecodeResult done(const char* finish);
  const DecodeResult& result() const { return result_; }

 private:
  using Clock = std::chrono::steady_clock;

  std::vector<int64_t> stops_;
  bool ignore_eos_;
  std::shared_ptr<Constraint> constraint_;
  OnTokens on_tokens_;
  DecodeResult result_;
  Clock::time_point start_;
};

}  // namespace torchtpu
