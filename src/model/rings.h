// The ring KV cache (seeds, DESIGN principle 3). One ring per non-shared layer: sliding rings with
// `sliding_window` slots, full rings with `context` slots. Position p lives in slot p % slots, and
// `kpos` holds each slot's position (-1 when empty), so attention masks instead of slicing and
// every decode step is the same program. Shared layers own no ring: they read their source's.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "io/config.h"

namespace torchtpu {

struct Ring {
  at::Tensor k;     // [batch, kv_heads, slots, head_dim], compute dtype
  at::Tensor v;     // [batch, kv_heads, slots, head_dim]
  at::Tensor kpos;  // [batch, slots] int64, -1 for an empty slot
  int64_t slots = 0;
  LayerType type = LayerType::kSliding;
};

// The ring up to its last slot that any row has filled (one host read of kpos): the slots past it
// are empty and masked anyway (ModelOptions::attend_filled_slots); slots and type as they are.
Ring filled_part(const Ring& ring);

struct Layout {
  int64_t full_rings = 0;
  int64_t sliding_rings = 0;
  int64_t shared_layers = 0;
  int64_t context = 0;
  int64_t row_bytes = 0;  // one batch row of every ring: its k, v and kpos
};

// The layout of Rings(config, context, batch, dtype, ...), without making them.
Layout ring_layout(const ModelConfig& config, int64_t context, at::ScalarType dtype);

// What the rings held at some positions' slots before a pass wrote there (Rings::save).
struct RingEntries {
  int64_t begin = 0, end = 0;  // the positions
  std::vector<at::Tensor> k, v, kpos;  // one per ring: its entries at those slots
};

class Rings {
 public:
  Rings() = default;
  Rings(const ModelConfig& config, int64_t context, int64_t batch, at::ScalarType dtype,
        const at::Device& device);

  // The ring a layer reads: its own, or its source's for a shared layer.
  Ring& for_layer(int64_t layer) { return rings_[owner_[layer]]; }
  // Empties every ring (kpos = -1); contents need not be cleared.
  void reset();
  // Empties one batch row of every ring.
  void reset_row(int64_t row);
  // Rows [begin, begin + count) of every ring as views: a forward pass over them reads and writes
  // these rings' storage, and the other rows are untouched.
  Rings rows(int64_t begin, int64_t count) const;
  // What every ring holds at the slots positions [begin, end) map to, before a pass that may be
  // partly undone writes there (speculative decoding's check of a draft). At most as many
  // positions as the smallest ring has slots.
  RingEntries save(int64_t begin, int64_t end) const;
  // Undoes a pass's writes for positions [from, saved.end): their slots hold again what `saved`
  // found. A full ring's slot held nothing needed there, a sliding ring's the window's oldest
  // entries, which the next positions still attend to.
  void restore(const RingEntries& saved, int64_t from);
  // The fewest slots of any ring: positions one pass may write without overwriting its own.
  int64_t min_slots() const;
  // Every ring (one per non-shared layer, in layer order), for whoever copies ring states.
  std::vector<Ring>& all() { return rings_; }
  int64_t batch() const { return rings_.empty() ? 0 : rings_.front().kpos.size(0); }
  Layout layout() const { return layout_; }
  int64_t context() const { return layout_.context; }

 private:
  std::vector<Ring> rings_;     // one per non-shared layer
  std::vector<int64_t> owner_;  // layer -> index into rings_
  Layout layout_;
};

}  // namespace torchtpu
