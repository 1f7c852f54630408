// The drafter of speculative decoding by prompt lookup (engine.h, Drafting): a sequence's next
// tokens guessed from its own history, with no second model.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "model/rings.h"

namespace torchtpu {

// The sequence `prompt` followed by `output`, its last n tokens looked up for n from
// draft.ngram_max down to draft.ngram_min: at the latest earlier place they occur that `limit`
// tokens follow, else the earliest (which the most follow), the tokens that followed them, at
// most `limit`. Empty when no such run recurs (or limit is 0).
std::vector<int64_t> lookup_draft(const std::vector<int64_t>& prompt,
                                  const std::vector<int64_t>& output, const Drafting& draft,
                                  int64_t limit);

// The longest draft one pass may check: draft.tokens, within the slots of the smallest ring beside
// the fed token (a pass must not overwrite its own entries) and, on the CPU, within the query
// positions the attention kernel of a step takes: a longer pass goes through the composite
// formula, whose other rounding a bf16 near tie can follow to another token.
int64_t draft_room(const Drafting& draft, const Rings& rings, const at::Device& device);

// The next draft's length at most, by transformers' heuristic schedule: 2 more after a draft
// kept whole, 1 fewer after one cut short, so a sequence whose drafts mostly fail stops paying
// for long passes while one that repeats itself gets the longest.
int64_t next_draft_length(int64_t length, int64_t room, bool kept_whole);

}  // namespace torchtpu
