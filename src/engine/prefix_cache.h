// Ring states of finished or partly read sequences, kept so that a new sequence whose tokens start
// with one of them skips reading those tokens again (issue #17). What Gemma 4 needs at a reuse
// point p: the full-attention rings' entries for positions [0, p), kept in blocks of `block`
// positions shared by every state with the same tokens up to the block's end; the sliding rings as
// they stand at p (the window before p, which only p itself can reuse); and nothing for the
// KV-shared layers, which own no ring. A byte budget bounds it, evicting the least recently used
// state first.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "model/rings.h"

namespace torchtpu {

struct PrefixCacheStats {
  int64_t hits = 0;           // sequences that started from a saved state
  int64_t misses = 0;         // sequences that found none
  int64_t reused_tokens = 0;  // prompt tokens not read again, over all hits
  int64_t saves = 0;          // states saved
  int64_t evictions = 0;      // states evicted for the budget
  int64_t states = 0;         // states held now
  int64_t bytes = 0;          // bytes held now (shared blocks counted once)
};

// One held state as whole tensors, as a state file holds it: the full rings' entries for
// positions [0, tokens.size()) and each sliding ring's row, rings in layer order.
struct PrefixState {
  std::vector<int64_t> tokens;
  // Per full ring: [kv_heads, positions, head_dim], position i at index i; get() gives exactly
  // tokens.size() positions, put() reads the first tokens.size().
  std::vector<at::Tensor> full_k, full_v;
  std::vector<at::Tensor> sliding_k, sliding_v;  // per sliding ring: [kv_heads, slots, head_dim]
  std::vector<at::Tensor> sliding_kpos;          // per sliding ring: [slots]
};

// ValueError unless `block`, the positions of a prefix cache block, is at least 1 (checked with
// every batch's options, whether or not its cache is on).
void check_cache_block(int64_t block);

class PrefixCache {
 public:
  // budget_bytes: the most it holds (a state larger than that alone is not saved); block: the
  // positions of one shared block of the full rings. ValueError for a negative budget or a block
  // below 1.
  PrefixCache(int64_t budget_bytes, int64_t block);

  // Saves row `row` of `rings` as the state after `tokens` (the ring holds exactly their entries,
  // at positions 0..tokens.size()-1). A state already held for the same tokens is only touched.
  void save(const std::vector<int64_t>& tokens, Rings& rings, int64_t row);
  // Finds the saved state that covers most of `prompt` and writes it into row `row` of `rings`,
  // which must be empty (reset). Returns the tokens it covers (0: none, the row untouched). A
  // state covers the tokens it shares with the prompt when they are its own tokens, less the
  // prompt's last token, which is left to read for the logits: a state saved for the whole prompt
  // (the same prompt sent again) covers all of it but that token. Its entry for that token's
  // position is left out: the entry it overwrote in a sliding ring is outside every window from
  // that position on.
  int64_t restore(const std::vector<int64_t>& prompt, Rings& rings, int64_t row);
  // The tokens restore() would cover now, with nothing restored or counted.
  int64_t held_for(const std::vector<int64_t>& prompt) const;

  // The state held for exactly `tokens`, or none.
  std::optional<PrefixState> get(const std::vector<int64_t>& tokens) const;
  // Holds `state` (its tensors shaped as the rings' rows it came from) as the most recently used
  // one, its full entries copied into blocks, or shared with the states already holding them.
  // False when it alone exceeds the budget: nothing is held then.
  bool put(const PrefixState& state);
  // Forgets the state held for exactly `tokens` (the blocks no other state shares go with it).
  // Returns its tokens' count, 0 when none was held.
  int64_t erase(const std::vector<int64_t>& tokens);

  // The tokens of the state a row's last sequence left, or restored into it (llama-server's slot
  // save and erase name a row); kept here so that they travel with the cache (Batch::take_cache).
  // Empty tokens: the row names none. The state itself may be evicted meanwhile.
  void set_row_state(int64_t row, std::vector<int64_t> tokens);
  const std::vector<int64_t>* row_state(int64_t row) const;

  const PrefixCacheStats& stats() const { return stats_; }
  int64_t block() const { return block_; }
  int64_t budget() const { return budget_; }

 private:
  // Positions [b · block, b · block + size) of every full ring: k and v [kv_heads, size, d].
  struct Block {
    std::vector<at::Tensor> k, v;
    int64_t nbytes = 0;
  };
  struct State {
    std::vector<int64_t> tokens;
    std::vector<std::shared_ptr<Block>> blocks;
    std::vector<at::Tensor> sliding_k, sliding_v, sliding_kpos;  // each sliding ring's row
    int64_t sliding_nbytes = 0;
  };
  using Key = std::vector<int64_t>;  // the tokens up to a block's end, or a state's tokens

  // Holds `state`, which no state holds for the same tokens, as the most recently used: its full
  // entries copied into blocks, or shared with the states holding them already. False (the
  // blocks made for it forgotten) when it alone exceeds the budget.
  bool insert(const PrefixState& state);
  // The state held for exactly `tokens`, or states_.end().
  std::list<State>::const_iterator find(const std::vector<int64_t>& tokens) const;
  // Makes the state held for exactly `tokens` the most recently used; false when none is.
  bool touch(const std::vector<int64_t>& tokens);
  void evict_to(int64_t budget);
  int64_t held_bytes() const;
  // The state covering most of `prompt` (see restore) and what it covers; states_.end() and 0
  // when none covers a token.
  std::pair<std::list<State>::const_iterator, int64_t> covering(
      const std::vector<int64_t>& prompt) const;

  int64_t budget_;
  int64_t block_;
  std::list<State> states_;  // most recently used first
  std::map<Key, std::weak_ptr<Block>> blocks_;
  std::map<int64_t, std::vector<int64_t>> row_states_;
  PrefixCacheStats stats_;
};

}  // namespace torchtpu
