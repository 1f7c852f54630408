#include "model/rings.h"

#include <algorithm>

namespace torchtpu {

Ring filled_part(const Ring& ring) {
  const auto filled = (ring.kpos >= 0).any(0).nonzero();
  const int64_t n = filled.numel() ? filled.max().item<int64_t>() + 1 : 0;
  Ring part = ring;
  part.k = ring.k.narrow(2, 0, n);
  part.v = ring.v.narrow(2, 0, n);
  part.kpos = ring.kpos.narrow(1, 0, n);
  return part;
}

namespace {

// A sliding ring never needs more than the window; a window wider than the context is capped by
// the context.
int64_t ring_slots(const ModelConfig& config, int64_t layer, int64_t context) {
  return config.layer_types[layer] == LayerType::kSliding
             ? std::min(config.sliding_window, context)
             : context;
}

}  // namespace

Layout ring_layout(const ModelConfig& config, int64_t context, at::ScalarType dtype) {
  Layout layout;
  layout.context = context;
  const auto element = static_cast<int64_t>(c10::elementSize(dtype));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    if (config.is_shared(l)) {
      ++layout.shared_layers;
      continue;
    }
    (config.layer_types[l] == LayerType::kSliding ? layout.sliding_rings : layout.full_rings)++;
    const int64_t entry = 2 * config.num_key_value_heads * config.layer_head_dim(l) * element;
    layout.row_bytes +=
        ring_slots(config, l, context) * (entry + static_cast<int64_t>(sizeof(int64_t)));
  }
  return layout;
}

Rings::Rings(const ModelConfig& config, int64_t context, int64_t batch, at::ScalarType dtype,
             const at::Device& device)
    : layout_(ring_layout(config, context, dtype)) {
  const int64_t layers = config.num_hidden_layers;
  owner_.assign(layers, -1);
  auto options = at::TensorOptions().dtype(dtype).device(device);
  for (int64_t l = 0; l < layers; ++l) {
    if (config.is_shared(l)) continue;
    Ring ring;
    ring.type = config.layer_types[l];
    ring.slots = ring_slots(config, l, context);
    const int64_t d = config.layer_head_dim(l);
    ring.k = at::zeros({batch, config.num_key_value_heads, ring.slots, d}, options);
    ring.v = at::zeros({batch, config.num_key_value_heads, ring.slots, d}, options);
    ring.kpos = at::full({batch, ring.slots}, -1, options.dtype(at::kLong));
    owner_[l] = static_cast<int64_t>(rings_.size());
    rings_.push_back(std::move(ring));
  }
  for (int64_t l = 0; l < layers; ++l) {
    if (config.is_shared(l)) owner_[l] = owner_[config.kv_source(l)];
  }
}

void Rings::reset() {
  for (auto& ring : rings_) ring.kpos.fill_(-1);
}

void Rings::reset_row(int64_t row) {
  for (auto& ring : rings_) ring.kpos.select(0, row).fill_(-1);
}

namespace {

at::Tensor slots_of(const Ring& ring, int64_t begin, int64_t end) {
  return at::remainder(at::arange(begin, end, ring.kpos.options()), ring.slots);
}

}  // namespace

RingEntries Rings::save(int64_t begin, int64_t end) const {
  RingEntries saved{begin, end, {}, {}, {}};
  for (const auto& ring : rings_) {
    const auto slots = slots_of(ring, begin, end);
    saved.k.push_back(ring.k.index_select(2, slots));
    saved.v.push_back(ring.v.index_select(2, slots));
    saved.kpos.push_back(ring.kpos.index_select(1, slots));
  }
  return saved;
}

void Rings::restore(const RingEntries& saved, int64_t from) {
  const int64_t count = saved.end - from;
  if (count <= 0) return;
  for (size_t r = 0; r < rings_.size(); ++r) {
    auto& ring = rings_[r];
    const auto slots = slots_of(ring, from, saved.end);
    const int64_t offset = from - saved.begin;
    ring.k.index_copy_(2, slots, saved.k[r].narrow(2, offset, count));
    ring.v.index_copy_(2, slots, saved.v[r].narrow(2, offset, count));
    ring.kpos.index_copy_(1, slots, saved.kpos[r].narrow(1, offset, count));
  }
}

int64_t Rings::min_slots() const {
  int64_t fewest = layout_.context;
  for (const auto& ring : rings_) fewest = std::min(fewest, ring.slots);
  return fewest;
}

Rings Rings::rows(int64_t begin, int64_t count) const {
  Rings view = *this;
  for (auto& ring : view.rings_) {
    ring.k = ring.k.narrow(0, begin, count);
    ring.v = ring.v.narrow(0, begin, count);
    ring.kpos = ring.kpos.narrow(0, begin, count);
  }
  return view;
}

}  // namespace torchtpu
