// The drafter of speculative decoding by prompt lookup (engine.h, Drafting): a sequence's next
// tokens guessed from its own history, with no second model.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"

namespace torchtpu {

// The sequence `prompt` followed by `output`, its last n tokens looked up for n from
// draft.ngram_max down to draft.ngram_min: at the latest earlier place they occur that `limit`
// tokens follow, else the earliest (which the most follow), the tokens that followed them, at
// most `limit`. Empty when no such run recurs (or limit is 0).
std::vector<int64_t> lookup_draft(const std::vector<int64_t>& prompt,
                                  const std::vector<int64_t>& output, const Drafting& draft,
                                  int64_t limit);

}  // namespace torchtpu
