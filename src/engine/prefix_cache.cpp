#include "engine/prefix_cache.h"

#include <algorithm>

#include "common/errors.h"

namespace torchtpu {

PrefixCache::PrefixCache(int64_t budget_bytes, int64_t block)
    : budget_(budget_bytes), block_(block) {
  if (budget_bytes < 0) {
    throw ValueError("the prefix cache budget must be at least 0 bytes, got " +
                     std::to_string(budget_bytes));
  }
  if (block < 1) {
    throw ValueError("the prefix cache block must be at least 1 position, got " +
                     std::to_string(block));
  }
}

int64_t PrefixCache::held_bytes() const {
  int64_t bytes = 0;
  for (const auto& state : states_) bytes += state.sliding_nbytes;
  for (const auto& [key, block] : blocks_) {
    if (const auto held = block.lock()) bytes += held->nbytes;
  }
  return bytes;
}

void PrefixCache::evict_to(int64_t budget) {
  while (!states_.empty() && held_bytes() > budget) {
    states_.pop_back();
    ++stats_.evictions;
  }
  std::erase_if(blocks_, [](const auto& entry) { return entry.second.expired(); });
  stats_.states = static_cast<int64_t>(states_.size());
  stats_.bytes = held_bytes();
}

void PrefixCache::save(const std::vector<int64_t>& tokens, Rings& rings, int64_t row) {
  const auto p = static_cast<int64_t>(tokens.size());
  if (p == 0 || budget_ == 0) return;
  const auto held = std::find_if(states_.begin(), states_.end(),
                                 [&](const State& s) { return s.tokens == tokens; });
  if (held != states_.end()) {
    states_.splice(states_.begin(), states_, held);
    return;
  }
  State state;
  state.tokens = tokens;
  int64_t new_bytes = 0;
  for (int64_t begin = 0; begin < p; begin += block_) {
    const int64_t size = std::min(block_, p - begin);
    Key key(tokens.begin(), tokens.begin() + begin + size);
    auto& slot = blocks_[key];
    auto block = slot.lock();
    if (!block) {
      block = std::make_shared<Block>();
      for (auto& ring : rings.all()) {
        if (ring.type != LayerType::kFull) continue;
        block->k.push_back(ring.k[row].narrow(1, begin, size).clone());
        block->v.push_back(ring.v[row].narrow(1, begin, size).clone());
        block->nbytes += block->k.back().nbytes() + block->v.back().nbytes();
      }
      slot = block;
      new_bytes += block->nbytes;
    }
    state.blocks.push_back(std::move(block));
  }
  for (auto& ring : rings.all()) {
    if (ring.type != LayerType::kSliding) continue;
    state.sliding_k.push_back(ring.k[row].clone());
    state.sliding_v.push_back(ring.v[row].clone());
    state.sliding_kpos.push_back(ring.kpos[row].clone());
    state.sliding_nbytes += state.sliding_k.back().nbytes() + state.sliding_v.back().nbytes() +
                            state.sliding_kpos.back().nbytes();
  }
  int64_t own_bytes = state.sliding_nbytes;
  for (const auto& block : state.blocks) own_bytes += block->nbytes;
  if (own_bytes > budget_) {
    state.blocks.clear();
    evict_to(budget_);  // forgets the blocks made for it
    return;
  }
  states_.push_front(std::move(state));
  ++stats_.saves;
  evict_to(budget_);
}

std::list<PrefixCache::State>::const_iterator PrefixCache::longest_state(
    const std::vector<int64_t>& prompt) const {
  const auto n = static_cast<int64_t>(prompt.size());
  auto best = states_.end();
  for (auto it = states_.begin(); it != states_.end(); ++it) {
    const auto p = static_cast<int64_t>(it->tokens.size());
    if (p < n && (best == states_.end() || p > static_cast<int64_t>(best->tokens.size())) &&
        std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) {
      best = it;
    }
  }
  return best;
}

int64_t PrefixCache::held_for(const std::vector<int64_t>& prompt) const {
  const auto best = longest_state(prompt);
  return best == states_.end() ? 0 : static_cast<int64_t>(best->tokens.size());
}

int64_t PrefixCache::restore(const std::vector<int64_t>& prompt, Rings& rings, int64_t row) {
  const auto best = longest_state(prompt);
  if (best == states_.end()) {
    ++stats_.misses;
    return 0;
  }
  states_.splice(states_.begin(), states_, best);
  const State& state = states_.front();
  size_t full = 0, sliding = 0;
  for (auto& ring : rings.all()) {
    if (ring.type == LayerType::kSliding) {
      ring.k[row].copy_(state.sliding_k[sliding]);
      ring.v[row].copy_(state.sliding_v[sliding]);
      ring.kpos[row].copy_(state.sliding_kpos[sliding]);
      ++sliding;
      continue;
    }
    int64_t begin = 0;
    for (const auto& block : state.blocks) {
      const int64_t size = block->k[full].size(1);
      ring.k[row].narrow(1, begin, size).copy_(block->k[full]);
      ring.v[row].narrow(1, begin, size).copy_(block->v[full]);
      begin += size;
    }
    ring.kpos[row].narrow(0, 0, begin).copy_(at::arange(begin, ring.kpos.options()));
    ++full;
  }
  const auto p = static_cast<int64_t>(state.tokens.size());
  ++stats_.hits;
  stats_.reused_tokens += p;
  return p;
}

}  // namespace torchtpu
