#include "engine/prefix_cache.h"

#include <algorithm>

#include "common/errors.h"

namespace torchtpu {

void check_cache_block(int64_t block) {
  if (block < 1) {
    throw ValueError("the prefix cache block must be at least 1 position, got " +
                     std::to_string(block));
  }
}

PrefixCache::PrefixCache(int64_t budget_bytes, int64_t block)
    : budget_(budget_bytes), block_(block) {
  if (budget_bytes < 0) {
    throw ValueError("the prefix cache budget must be at least 0 bytes, got " +
                     std::to_string(budget_bytes));
  }
  check_cache_block(block);
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

std::list<PrefixCache::State>::const_iterator PrefixCache::find(
    const std::vector<int64_t>& tokens) const {
  return std::find_if(states_.begin(), states_.end(),
                      [&](const State& s) { return s.tokens == tokens; });
}

bool PrefixCache::touch(const std::vector<int64_t>& tokens) {
  const auto held = find(tokens);
  if (held == states_.end()) return false;
  states_.splice(states_.begin(), states_, held);
  return true;
}

void PrefixCache::save(const std::vector<int64_t>& tokens, Rings& rings, int64_t row) {
  if (tokens.empty() || budget_ == 0 || touch(tokens)) return;
  PrefixState state;
  state.tokens = tokens;
  for (auto& ring : rings.all()) {
    if (ring.type == LayerType::kFull) {
      // Views of the whole row: insert copies out the blocks no state holds already.
      state.full_k.push_back(ring.k[row]);
      state.full_v.push_back(ring.v[row]);
    } else {
      state.sliding_k.push_back(ring.k[row].clone());
      state.sliding_v.push_back(ring.v[row].clone());
      state.sliding_kpos.push_back(ring.kpos[row].clone());
    }
  }
  insert(state);
}

bool PrefixCache::put(const PrefixState& state) {
  if (state.tokens.empty() || budget_ == 0) return false;
  return touch(state.tokens) || insert(state);
}

bool PrefixCache::insert(const PrefixState& saved) {
  const auto& tokens = saved.tokens;
  const auto p = static_cast<int64_t>(tokens.size());
  State state;
  state.tokens = tokens;
  for (int64_t begin = 0; begin < p; begin += block_) {
    const int64_t size = std::min(block_, p - begin);
    auto& slot = blocks_[Key(tokens.begin(), tokens.begin() + begin + size)];
    auto block = slot.lock();
    if (!block) {
      block = std::make_shared<Block>();
      for (size_t j = 0; j < saved.full_k.size(); ++j) {
        block->k.push_back(saved.full_k[j].narrow(1, begin, size).clone());
        block->v.push_back(saved.full_v[j].narrow(1, begin, size).clone());
        block->nbytes += block->k.back().nbytes() + block->v.back().nbytes();
      }
      slot = block;
    }
    state.blocks.push_back(std::move(block));
  }
  state.sliding_k = saved.sliding_k;
  state.sliding_v = saved.sliding_v;
  state.sliding_kpos = saved.sliding_kpos;
  for (size_t j = 0; j < state.sliding_k.size(); ++j) {
    state.sliding_nbytes += state.sliding_k[j].nbytes() + state.sliding_v[j].nbytes() +
                            state.sliding_kpos[j].nbytes();
  }
  int64_t own_bytes = state.sliding_nbytes;
  for (const auto& block : state.blocks) own_bytes += block->nbytes;
  if (own_bytes > budget_) {
    state.blocks.clear();
    evict_to(budget_);  // forgets the blocks made for it
    return false;
  }
  states_.push_front(std::move(state));
  ++stats_.saves;
  evict_to(budget_);
  return true;
}

std::optional<PrefixState> PrefixCache::get(const std::vector<int64_t>& tokens) const {
  const auto held = find(tokens);
  if (held == states_.end()) return std::nullopt;
  PrefixState out;
  out.tokens = tokens;
  const size_t full = held->blocks.empty() ? 0 : held->blocks.front()->k.size();
  for (size_t j = 0; j < full; ++j) {
    std::vector<at::Tensor> k, v;
    for (const auto& block : held->blocks) {
      k.push_back(block->k[j]);
      v.push_back(block->v[j]);
    }
    out.full_k.push_back(at::cat(k, 1));
    out.full_v.push_back(at::cat(v, 1));
  }
  out.sliding_k = held->sliding_k;
  out.sliding_v = held->sliding_v;
  out.sliding_kpos = held->sliding_kpos;
  return out;
}

int64_t PrefixCache::erase(const std::vector<int64_t>& tokens) {
  const auto held = find(tokens);
  if (held == states_.end()) return 0;
  states_.erase(held);
  evict_to(budget_);  // forgets the blocks no other state holds
  return static_cast<int64_t>(tokens.size());
}

void PrefixCache::set_row_state(int64_t row, std::vector<int64_t> tokens) {
  if (tokens.empty()) {
    row_states_.erase(row);
  } else {
    row_states_[row] = std::move(tokens);
  }
}

const std::vector<int64_t>* PrefixCache::row_state(int64_t row) const {
  const auto it = row_states_.find(row);
  return it == row_states_.end() ? nullptr : &it->second;
}

std::pair<std::list<PrefixCache::State>::const_iterator, int64_t> PrefixCache::covering(
    const std::vector<int64_t>& prompt) const {
  const auto n = static_cast<int64_t>(prompt.size());
  auto best = states_.end();
  int64_t covered = 0;
  for (auto it = states_.begin(); it != states_.end(); ++it) {
    const auto p = static_cast<int64_t>(it->tokens.size());
    const int64_t covers = std::min(p, n - 1);
    if (p <= n && covers > covered &&
        std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin())) {
      best = it;
      covered = covers;
    }
  }
  return {best, covered};
}

int64_t PrefixCache::held_for(const std::vector<int64_t>& prompt) const {
  return covering(prompt).second;
}

int64_t PrefixCache::restore(const std::vector<int64_t>& prompt, Rings& rings, int64_t row) {
  const auto [best, p] = covering(prompt);
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
      const auto& kpos = state.sliding_kpos[sliding];
      ring.kpos[row].copy_(kpos.masked_fill(kpos >= p, -1));
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
    ring.kpos[row].narrow(0, 0, p).copy_(at::arange(p, ring.kpos.options()));
    ++full;
  }
  ++stats_.hits;
  stats_.reused_tokens += p;
  return p;
}

}  // namespace torchtpu
