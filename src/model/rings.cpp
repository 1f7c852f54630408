#include "model/rings.h"

namespace torchtpu {

Rings::Rings(const ModelConfig& config, int64_t context, int64_t batch, at::ScalarType dtype,
             const at::Device& device) {
  const int64_t layers = config.num_hidden_layers;
  owner_.assign(layers, -1);
  layout_.context = context;
  auto options = at::TensorOptions().dtype(dtype).device(device);
  for (int64_t l = 0; l < layers; ++l) {
    if (config.is_shared(l)) {
      ++layout_.shared_layers;
      continue;
    }
    Ring ring;
    ring.type = config.layer_types[l];
    // A sliding ring never needs more than the window; a window wider than the context is
    // capped by the context.
    ring.slots =
        ring.type == LayerType::kSliding ? std::min(config.sliding_window, context) : context;
    const int64_t d = config.layer_head_dim(l);
    ring.k = at::zeros({batch, config.num_key_value_heads, ring.slots, d}, options);
    ring.v = at::zeros({batch, config.num_key_value_heads, ring.slots, d}, options);
    ring.kpos = at::full({batch, ring.slots}, -1, options.dtype(at::kLong));
    (ring.type == LayerType::kSliding ? layout_.sliding_rings : layout_.full_rings)++;
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
