#include "engine/draft.h"

#include <algorithm>

#include "ops/attention.h"

namespace torchtpu {

std::vector<int64_t> lookup_draft(const std::vector<int64_t>& prompt,
                                  const std::vector<int64_t>& output, const Drafting& draft,
                                  int64_t limit) {
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  const int64_t length = n_prompt + static_cast<int64_t>(output.size());
  auto at = [&](int64_t i) { return i < n_prompt ? prompt[i] : output[i - n_prompt]; };
  for (int64_t n = std::min(draft.ngram_max, length - 1); n >= draft.ngram_min && limit > 0;
       --n) {
    // Latest first: the recent past predicts the near future best (the line being edited).
    // But in a loop the latest run is followed only by the loop's last turn, so an earlier one
    // gives a longer draft. A run starting at `start` ends before the suffix's own last token;
    // the earlier it starts, the more tokens follow it.
    int64_t found = -1;
    for (int64_t start = length - n - 1; start >= 0; --start) {
      bool same = true;
      for (int64_t i = 0; i < n && same; ++i) same = at(start + i) == at(length - n + i);
      if (!same) continue;
      found = start;
      if (length - (start + n) >= limit) break;
    }
    if (found < 0) continue;
    std::vector<int64_t> tokens;
    for (int64_t i = found + n; i < length && static_cast<int64_t>(tokens.size()) < limit; ++i) {
      tokens.push_back(at(i));
    }
    return tokens;
  }
  return {};
}

int64_t draft_room(const Drafting& draft, const Rings& rings, const at::Device& device) {
  const int64_t room = std::min(draft.tokens, rings.min_slots() - 1);
  return device.is_cpu() ? std::min(room, ops::kMaxFusedQueries - 1) : room;
}

int64_t next_draft_length(int64_t length, int64_t room, bool kept_whole) {
  return kept_whole ? std::min(length + 2, room) : std::max<int64_t>(length - 1, 1);
}

bool DraftGate::draft(int64_t rows) {
  auto& [step, drafts] = kinds_[rows];
  // Two steps (a warm-up and one counted), then a drafting pass, before any comparison.
  bool chosen;
  if (step.passes < 2 || drafts.passes < 1) {
    chosen = step.passes >= 2;
  } else {
    chosen = drafts.per_second > step.per_second;
    const Kind& behind = chosen ? step : drafts;
    if (behind.skipped >= kRetry) chosen = !chosen;
  }
  (chosen ? drafts : step).skipped = 0;
  ++(chosen ? step : drafts).skipped;
  return chosen;
}

void DraftGate::record(int64_t rows, bool drafted, int64_t tokens, double seconds) {
  // Recent passes weigh most: a quarter of the average is the newest pass's rate.
  constexpr double kWeight = 0.25;
  Kind& kind = kinds_[rows][drafted ? 1 : 0];
  const double rate = static_cast<double>(tokens) / std::max(seconds, 1e-9);
  const int64_t first = drafted ? 1 : 2;  // the first pass counted
  if (++kind.passes == first) {
    kind.per_second = rate;
  } else if (kind.passes > first) {
    kind.per_second += kWeight * (rate - kind.per_second);
  }
}

}  // namespace torchtpu
