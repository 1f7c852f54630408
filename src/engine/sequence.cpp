#include "engine/sequence.h"

#include <algorithm>
#include <utility>

namespace torchtpu {

SequenceOutput::SequenceOutput(const DecodeOptions& options, const std::vector<int64_t>& eos_ids,
                               const std::vector<int64_t>& prompt, OnTokens on_tokens)
    : stops_(options.stop_ids.empty() ? eos_ids : options.stop_ids),
      ignore_eos_(options.ignore_eos),
      constraint_(options.constraint),
      budget_(options.thinking_budget),
      on_tokens_(std::move(on_tokens)),
      start_(Clock::now()) {
  result_.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (budget_) {
    for (const int64_t token : prompt) count_thought(token);
  }
}

void SequenceOutput::count_thought(int64_t token) {
  if (token == budget_->markers.open) {
    thought_ = 0;
    forced_ = 0;
  } else if (token == budget_->markers.close) {
    thought_ = -1;
    forced_ = 0;
  } else if (thought_ >= 0) {
    ++thought_;
  }
}

void SequenceOutput::forbid(const at::Tensor& forbidden) const {
  if (constraint_) constraint_->forbid(forbidden);
  if (closing()) {
    const auto& message = budget_->message;
    forbidden.fill_(true);
    forbidden[forced_ < static_cast<int64_t>(message.size()) ? message[forced_]
                                                              : budget_->markers.close] = false;
  }
}

bool SequenceOutput::take(const int64_t* tokens, int64_t count) {
  std::vector<int64_t> batch;
  bool stopped = false;
  const auto in = [](const std::vector<int64_t>& ids, int64_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (int64_t i = 0; i < count; ++i) {
    // A grammar's end token ends the sequence whatever its stop ids and ignore_eos say.
    if ((!ignore_eos_ && in(stops_, tokens[i])) ||
        (constraint_ && in(constraint_->end_ids(), tokens[i]))) {
      result_.stop_id = tokens[i];
      stopped = true;
      break;
    }
    if (constraint_) constraint_->commit(tokens[i]);
    if (budget_) {
      if (closing()) ++forced_;
      count_thought(tokens[i]);
    }
    batch.push_back(tokens[i]);
  }
  result_.tokens.insert(result_.tokens.end(), batch.begin(), batch.end());
  if (result_.read_s == 0) {
    result_.read_s = std::chrono::duration<double>(Clock::now() - start_).count();
    start_ = Clock::now();
  }
  if (stopped) result_.finish = "stop";
  if (on_tokens_ && !batch.empty() && !on_tokens_(batch)) {
    result_.finish = "cancelled";
    return false;
  }
  return !stopped;
}

DecodeResult SequenceOutput::done(const char* finish) {
  if (result_.finish.empty()) result_.finish = finish;
  result_.decode_s = std::chrono::duration<double>(Clock::now() - start_).count();
  return std::move(result_);
}

}  // namespace torchtpu
