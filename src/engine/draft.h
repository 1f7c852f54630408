// The drafter of speculative decoding by prompt lookup (engine.h, Drafting): a sequence's next
// tokens guessed from its own history, with no second model.
#pragma once

#include <array>
#include <cstdint>
#include <map>
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

// Whether a pass checks the drafts found or decodes one token a row, learnt from the passes
// themselves (Drafting::always aside): the tokens a second each kind of pass has given, by the
// number of rows decoding, as moving averages. A draft pays only when its tokens come faster
// than a step's: how many are kept and what the longer pass costs both vary with the output, the
// rows beside it, the CPU and the activation bits (docs/BENCHMARKS.md, "Drafts that pay"). The
// first step is a warm-up and not counted (it follows the prompt's read), a drafting pass counts
// from the first, since each one that does not pay costs several steps; the kind that is behind
// is tried again after kRetry passes without it, so that a change (output that starts or stops
// repeating, a neighbour slowing the machine) is seen.
class DraftGate {
 public:
  static constexpr int64_t kRetry = 16;

  // Whether the next pass of `rows` decoding rows, which found drafts, checks them.
  bool draft(int64_t rows);
  // A pass of `rows` decoding rows that checked drafts or not gave `tokens` in `seconds`.
  void record(int64_t rows, bool drafted, int64_t tokens, double seconds);

 private:
  struct Kind {
    int64_t passes = 0;     // recorded, the warm-up included
    double per_second = 0;  // tokens a second, over the passes counted
    int64_t skipped = 0;    // decisions since this kind was last chosen
  };
  std::map<int64_t, std::array<Kind, 2>> kinds_;  // by rows decoding: {steps, drafts}
};

}  // namespace torchtpu
