#include "model/gemma4.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>

#include "common/errors.h"
#include "common/memory.h"
#include "io/aten_view.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/rms_norm.h"
#include "quant/quantize.h"

namespace torchtpu {
namespace {

const char* dtype_label(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "f16";
    case at::kFloat: return "f32";
    default: return "other";
  }
}

// An int4 weight kept in compressed-tensors' own layout on the host reads the checkpoint's
// mapping; every other form (dequantized, CPU blocks, moved to a device) is a copy of it.
bool aliases_mapping(const Linear& w) {
  return w.int4 && !w.int4->cpu_blocks() && w.int4->weight.device().is_cpu();
}

std::string where_label(const at::Device& device, bool aliased) {
  return device.str() + (aliased ? " (mmap)" : "");
}

// Gemma4RMSNorm (the weight used as is, x̂·w, not x̂·(1+w)); an undefined weight is the weightless
// v norm. f32 inside, cast back to the input dtype.
using ops::rms_norm;

// Half-split ("NeoX") rotation: dimension j pairs with j + d/2.

// inv_freq as transformers computes it. "proportional" rotates the first
// int(partial_rotary_factor * d / 2) frequency pairs with exponents over the full head dim d and
// leaves the rest unrotated (frequency 0), research note §2.4.
at::Tensor inverse_frequencies(const RopeParams& rope_params, int64_t head_dim) {
  const int64_t pairs = head_dim / 2;
  int64_t rotated = pairs;
  if (rope_params.rope_type == "proportional") {
    rotated = static_cast<int64_t>(rope_params.partial_rotary_factor * head_dim / 2);
  }
  auto exponents = at::arange(0, 2 * rotated, 2, at::kLong).to(at::kFloat) / head_dim;
  auto inv = 1.0 / at::pow(rope_params.theta, exponents);
  if (rotated < pairs) inv = at::cat({inv, at::zeros({pairs - rotated}, at::kFloat)});
  return inv / rope_params.factor;
}

// The view on `device` in `dtype`. Where that copies (a conversion, another device, an unaligned
// offset), the view's pages leave the resident set: host memory holds each weight once.
at::Tensor load_dense(const TensorView& view, const at::Device& device, at::ScalarType dtype) {
  auto t = host_tensor(view).to(device, dtype);
  if (t.data_ptr() != static_cast<const void*>(view.data)) release_pages(view);
  return t;
}

}  // namespace

LinearGroup LinearGroup::of(std::vector<Linear> parts) {
  LinearGroup group;
  std::vector<ops::Int4Weight> int4;
  for (const auto& part : parts) {
    if (part.int4) int4.push_back(*part.int4);
  }
  auto fused = int4.size() == parts.size() ? ops::fuse_cpu_blocks(int4) : std::nullopt;
  if (!fused) {
    group.parts = std::move(parts);
    return group;
  }
  group.whole.int4 = std::move(fused->whole);
  group.offsets = std::move(fused->offsets);
  for (const auto& part : int4) group.sizes.push_back(part.out_features);
  return group;
}

std::vector<at::Tensor> LinearGroup::operator()(const at::Tensor& x) const {
  std::vector<at::Tensor> out;
  if (!parts.empty()) {
    for (const auto& part : parts) out.push_back(part(x));
    return out;
  }
  const auto y = whole(x);
  for (size_t i = 0; i < sizes.size(); ++i) out.push_back(y.narrow(-1, offsets[i], sizes[i]));
  return out;
}

VocabTable VocabTable::dense(at::Tensor weight) {
  VocabTable t;
  t.dtype_ = weight.scalar_type();
  t.dense_ = std::move(weight);
  return t;
}

VocabTable VocabTable::int4(PackedInt4 packed, at::ScalarType dtype) {
  VocabTable t;
  t.dtype_ = dtype;
  t.packed_ = std::move(packed);
  return t;
}

int64_t VocabTable::rows() const { return packed_ ? packed_->out : dense_.size(0); }
int64_t VocabTable::width() const { return packed_ ? packed_->in : dense_.size(1); }

at::Tensor VocabTable::lookup(const at::Tensor& ids) const {
  if (packed_) return dequantize_rows(*packed_, ids, dtype_);
  return at::embedding(dense_, ids);
}

at::Tensor VocabTable::matrix() const { return packed_ ? dequantize(*packed_, dtype_) : dense_; }

int64_t VocabTable::nbytes() const {
  return packed_ ? packed_->nbytes() : dense_.numel() * dense_.element_size();
}

Gemma4::Gemma4(const std::string& model_dir, const ModelOptions& options)
    : config_(load_config(model_dir)), options_(options) {
  if (options_.int4 == Int4Weights::kAuto) {
    options_.int4 = options_.device.is_cpu() ? Int4Weights::kPacked : Int4Weights::kDequantized;
  }
  // Float32 activations take the dequantized product, which has no 8-bit form: 16 is in effect.
  if (options_.dtype == at::kFloat) options_.int4_activation_bits = 16;
  checkpoint_ = std::make_shared<Checkpoint>(model_dir);
  if (!options.emb4_dir.empty()) emb4_ = std::make_shared<Checkpoint>(options.emb4_dir);
  load(*checkpoint_, emb4_.get());
}

Linear Gemma4::int4_linear(const PackedInt4& packed) const {
  const auto& o = options_;
  const bool blocks = o.int4 == Int4Weights::kPacked && o.device.is_cpu();
  if (o.int4 == Int4Weights::kDequantized || packed.g_idx.defined() ||
      (blocks && !ops::cpu_blocks_supported(packed))) {
    // Expanded on the device it runs on: the packed form crosses over (about a quarter of the
    // bf16 bytes) and the device does the unpacking, not the host's cores.
    return {dequantize(packed.to(o.device), o.dtype), std::nullopt};
  }
  auto weight = blocks ? ops::repack_for_cpu(packed) : ops::int4_weight(packed.to(o.device));
  weight.activation_bits = o.int4_activation_bits;
  return {at::Tensor(), std::move(weight)};
}

Linear Gemma4::linear_weight(const Checkpoint& ckpt, const std::string& module,
                             const ImpliedTensor& implied) {
  const auto& o = options_;
  const auto shape = implied.shape();
  if (has_packed(ckpt, module)) {
    auto packed =
        read_packed(ckpt, module, config_.quantization ? &*config_.quantization : nullptr);
    if (packed.out != shape[0] || packed.in != shape[1]) {
      throw FormatError("tensor " + module + ".weight_shape in " + ckpt.dir() + " is [" +
                        std::to_string(packed.out) + ", " + std::to_string(packed.in) +
                        "] but config.json implies " + implied.against({packed.out, packed.in}));
    }
    auto linear = int4_linear(packed);
    if (!aliases_mapping(linear)) release_packed(ckpt, module);
    return linear;
  }
  const auto& view = ckpt.get(module + ".weight");
  expect_weight(view, implied);
  if (o.quantize_int4 && o.int4 != Int4Weights::kDequantized) {
    if (shape[1] % 32 != 0) {
      throw ValueError("--quantize int4 needs input widths that are multiples of 32; " + module +
                       " in " + ckpt.dir() + " has " + std::to_string(shape[1]));
    }
    auto linear = int4_linear(quantize_weight(host_tensor(view), {32, true, std::nullopt}, module));
    release_pages(view);
    return linear;
  }
  return {load_dense(view, o.device, o.dtype), std::nullopt};
}

void Gemma4::load(const Checkpoint& ckpt, const Checkpoint* emb4) {
  const auto& c = config_;
  const auto& o = options_;
  const std::string p = ckpt.prefix();
  const int64_t L = c.num_hidden_layers;
  const int64_t P = c.hidden_size_per_layer_input;
  // Every shape checked below is the one this table gives.
  const auto implied = implied_tensors(c, p);

  auto norm = [&](const std::string& name) {
    const auto& view = ckpt.get(p + name);
    expect_weight(view, implied.at(p + name));
    // Rounded through the compute dtype first, as a model cast to that dtype holds it.
    return host_tensor(view).to(o.dtype).to(at::kFloat).to(o.device);
  };

  int64_t linear_bytes = 0;
  bool linears_packed = false;
  std::string int4_format;  // describe() of the int4 linears, when kept packed
  bool int4_aliased = false;
  layers_.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    auto& w = layers_[l];
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    auto lin = [&](const std::string& module) {
      linears_packed = linears_packed || has_packed(ckpt, lp + module);
      auto t = linear_weight(ckpt, lp + module, implied.at(lp + module + ".weight"));
      linear_bytes += t.nbytes();
      if (t.int4) {
        int4_format = t.int4->describe();
        int4_aliased = aliases_mapping(t);
      }
      return t;
    };
    w.input_layernorm = norm("layers." + std::to_string(l) + ".input_layernorm.weight");
    w.post_attention_layernorm =
        norm("layers." + std::to_string(l) + ".post_attention_layernorm.weight");
    w.pre_feedforward_layernorm =
        norm("layers." + std::to_string(l) + ".pre_feedforward_layernorm.weight");
    w.post_feedforward_layernorm =
        norm("layers." + std::to_string(l) + ".post_feedforward_layernorm.weight");
    std::vector<Linear> qkv{lin("self_attn.q_proj")};
    w.q_norm = norm("layers." + std::to_string(l) + ".self_attn.q_norm.weight");
    // Shared layers read their source's K/V; their own k/v/k_norm, present in the published
    // checkpoint and absent from re-saved ones, are dead weights (research note §5.9).
    if (!c.is_shared(l)) {
      qkv.push_back(lin("self_attn.k_proj"));
      qkv.push_back(lin("self_attn.v_proj"));
      w.k_norm = norm("layers." + std::to_string(l) + ".self_attn.k_norm.weight");
    }
    w.qkv = LinearGroup::of(std::move(qkv));
    w.o_proj = lin("self_attn.o_proj");
    w.gate_up = LinearGroup::of({lin("mlp.gate_proj"), lin("mlp.up_proj")});
    w.down_proj = lin("mlp.down_proj");
    if (P > 0) {
      w.per_layer_input_gate = lin("per_layer_input_gate");
      w.per_layer_projection = lin("per_layer_projection");
      w.post_per_layer_input_norm =
          norm("layers." + std::to_string(l) + ".post_per_layer_input_norm.weight");
    }
    const auto& scalar = ckpt.get(lp + "layer_scalar");
    expect_weight(scalar, implied.at(lp + "layer_scalar"));
    w.layer_scalar = host_tensor(scalar).to(o.device, o.dtype);
    release_free_heap();
  }
  const bool aliased = int4_format.empty() ? o.device.is_cpu() && !linears_packed : int4_aliased;
  std::string linear_format = dtype_label(o.dtype);
  if (!int4_format.empty()) {
    linear_format = int4_format + (o.quantize_int4 && !linears_packed ? ", quantized at load" : "");
  } else if (linears_packed) {
    linear_format += " (dequantized from int4 at load)";
  }
  storage_.push_back({"linears", linear_format, where_label(o.device, aliased), linear_bytes});

  final_norm_ = norm("norm.weight");
  if (P > 0) {
    per_layer_model_projection_ =
        linear_weight(ckpt, p + "per_layer_model_projection",
                      implied.at(p + "per_layer_model_projection.weight"));
    per_layer_projection_norm_ = norm("per_layer_projection_norm.weight");
  }

  // Vocabulary tables: the emb4 twin's int4 tables win over the main checkpoint's; a dense table
  // comes from the main checkpoint alone (the twin `quantize --emb4` writes holds int4 tables).
  bool emb4_read = false;
  auto table = [&](const std::string& name,
                   const std::string& family) -> std::optional<VocabTable> {
    // Named as the main checkpoint names it: the emb4 twin's prefix may be another.
    const ImpliedTensor& expected = implied.at((name == "lm_head" ? "" : p) + name + ".weight");
    for (const Checkpoint* source : {emb4, &ckpt}) {
      if (!source) continue;
      const std::string module = (name == "lm_head" ? "" : source->prefix()) + name;
      if (has_packed(*source, module)) {
        auto packed = read_packed(*source, module, nullptr);
        if (std::vector<int64_t>{packed.out, packed.in} != expected.shape()) {
          throw FormatError("int4 table " + module + " in " + source->dir() + " is [" +
                            std::to_string(packed.out) + ", " + std::to_string(packed.in) +
                            "] but config.json implies " +
                            expected.against({packed.out, packed.in}));
        }
        if (!o.device.is_cpu()) {
          packed = packed.to(o.device);
          release_packed(*source, module);
        }
        storage_.push_back({family,
                            "int4(g" + std::to_string(packed.group_size) + ", " +
                                dtype_label(packed.scale.scalar_type()) + " scales)",
                            where_label(o.device, o.device.is_cpu()), packed.nbytes()});
        emb4_read = emb4_read || source == emb4;
        return VocabTable::int4(std::move(packed), o.dtype);
      }
      if (source != &ckpt) continue;
      if (const auto* view = source->find(module + ".weight")) {
        expect_weight(*view, expected);
        auto t = load_dense(*view, o.device, o.dtype);
        storage_.push_back(
            {family, dtype_label(o.dtype),
             where_label(o.device, o.device.is_cpu() && scalar_type(view->dtype) == o.dtype),
             t.numel() * t.element_size()});
        return VocabTable::dense(std::move(t));
      }
    }
    return std::nullopt;
  };
  auto embed = table("embed_tokens", "embed_tokens");
  if (!embed) ckpt.get(p + "embed_tokens.weight");  // throws the precise "no tensor" error
  embed_tokens_ = std::move(*embed);
  if (P > 0) {
    auto ple = table("embed_tokens_per_layer", "embed_tokens_per_layer");
    if (!ple) ckpt.get(p + "embed_tokens_per_layer.weight");
    embed_tokens_per_layer_ = std::move(*ple);
  }
  // An untied lm_head (the emb4 twin writes one) is used when present; otherwise the head is tied
  // to embed_tokens. Every decode step reads all of it, so an int4 head stays int4 (in the form
  // options_.int4 asks for) and a dense one is quantized like the emb4 twin's with
  // quantize_int4. The packed pages of a head that was copied leave the resident set (a tied int4
  // embed_tokens faults back only the rows its lookups touch).
  auto head = table("lm_head", "lm_head");
  if (emb4 && !emb4_read) {
    throw FormatError("--emb4 " + emb4->dir() +
                      " holds no int4 vocabulary table (embed_tokens, embed_tokens_per_layer or "
                      "lm_head, packed): it takes the twin that quantize --emb4 writes");
  }
  if (!head && !c.tie_word_embeddings) {
    throw FormatError("checkpoint " + ckpt.dir() +
                      " has no lm_head.weight and config.json sets tie_word_embeddings false");
  }
  const VocabTable& table_of_head = head ? *head : embed_tokens_;
  const std::string head_name = head ? "lm_head" : "embed_tokens";
  if (table_of_head.is_int4()) {
    lm_head_ = int4_linear(*table_of_head.packed());
    if (!aliases_mapping(lm_head_)) {
      for (const Checkpoint* source : {emb4, &ckpt}) {
        if (source) release_packed(*source, (head ? "" : source->prefix()) + head_name);
      }
    }
  } else if (o.quantize_int4 && o.int4 != Int4Weights::kDequantized) {
    lm_head_ = int4_linear(quantize_table(table_of_head.matrix().cpu(), head_name));
  } else {
    lm_head_ = {table_of_head.matrix(), std::nullopt};
  }
  std::string head_format = lm_head_.int4 ? lm_head_.int4->describe() : dtype_label(o.dtype);
  if (lm_head_.int4 && !table_of_head.is_int4()) head_format += ", quantized at load";
  // The head as computed replaces the table's entry as read.
  std::erase_if(storage_, [](const StorageReport& r) { return r.family == "lm_head"; });
  if (head || lm_head_.int4) {
    storage_.push_back({"lm_head", head_format, where_label(o.device, aliases_mapping(lm_head_)),
                        lm_head_.nbytes()});
  }

  if (c.assistant) {
    const auto& a = *c.assistant;
    pre_projection_ = linear_weight(ckpt, "pre_projection", implied.at("pre_projection.weight"));
    post_projection_ = linear_weight(ckpt, "post_projection", implied.at("post_projection.weight"));
    head_rows_ = head ? *head : embed_tokens_;
    if (a.use_ordered_embeddings) {
      centroids_ = linear_weight(ckpt, "masked_embedding.centroids",
                                 implied.at("masked_embedding.centroids.weight"));
      const auto& view = ckpt.get("masked_embedding.token_ordering");
      expect_implied_shape(view, implied.at("masked_embedding.token_ordering"));
      const auto ordering = host_tensor(view).to(at::kLong);
      if (ordering.numel() > 0 &&
          (ordering.min().item<int64_t>() < 0 || ordering.max().item<int64_t>() >= c.vocab_size)) {
        throw FormatError("tensor masked_embedding.token_ordering in " + ckpt.dir() +
                          " holds ids outside [0, " + std::to_string(c.vocab_size) + ")");
      }
      token_ordering_ = ordering.to(o.device);
    }
  }

  inv_freq_sliding_ = inverse_frequencies(c.rope_sliding, c.head_dim).to(o.device);
  inv_freq_full_ = inverse_frequencies(c.rope_full, c.global_head_dim).to(o.device);
  release_free_heap();
}

at::Tensor Gemma4::per_layer_inputs(const at::Tensor& ids, const at::Tensor& embeds) const {
  const auto& c = config_;
  const int64_t B = ids.size(0), T = ids.size(1);
  const int64_t L = c.num_hidden_layers, P = c.hidden_size_per_layer_input;
  // Scales are rounded to the table dtype before multiplying, as transformers does. Made on the
  // device: a host tensor here would be one more upload per step.
  auto token_scale =
      at::scalar_tensor(std::sqrt(static_cast<double>(P)), ids.options().dtype(at::kFloat))
          .to(options_.dtype);
  auto token_part =
      (embed_tokens_per_layer_.lookup(ids.reshape(-1)) * token_scale).view({B, T, L, P});
  auto context_part =
      per_layer_model_projection_(embeds) * std::pow(static_cast<double>(c.hidden_size), -0.5);
  context_part =
      rms_norm(context_part.view({B, T, L, P}), per_layer_projection_norm_, c.rms_norm_eps);
  return (context_part + token_part) * std::pow(2.0, -0.5);
}

at::Tensor Gemma4::attention(int64_t l, const at::Tensor& x, const at::Tensor& positions,
                             const at::Tensor& cos, const at::Tensor& sin,
                             const at::Tensor& padding, Rings* rings,
                             std::vector<at::Tensor>& kv_views, const LoraPass& lora) const {
  const auto& c = config_;
  const auto& w = layers_[l];
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t d = c.layer_head_dim(l);
  const int64_t kv_heads = c.num_key_value_heads;

  auto projected = w.qkv(x);
  lora.add(l, LoraGroup::kQkv, x, projected);
  const auto q = query(l, projected[0], cos, sin);

  at::Tensor k, v, kpos;
  if (c.is_shared(l)) {
    const int64_t source = c.kv_source(l);
    k = kv_views[3 * source];
    v = kv_views[3 * source + 1];
    kpos = kv_views[3 * source + 2];
  } else {
    k = rms_norm(projected[1].view({B, T, kv_heads, d}), w.k_norm, c.rms_norm_eps);
    k = ops::rope(k, cos, sin).transpose(1, 2);  // [B, kv_heads, T, d]
    v = rms_norm(projected[2].view({B, T, kv_heads, d}), at::Tensor(), c.rms_norm_eps)
            .transpose(1, 2);
    kpos = positions;
    if (rings) {
      Ring& ring = rings->for_layer(l);
      // The ring as attention reads it: all slots, or only up to the last filled one (the rest
      // are empty, masked anyway).
      auto readable = [&] {
        const Ring read = options_.attend_filled_slots ? filled_part(ring) : ring;
        return std::make_tuple(read.k, read.v, read.kpos);
      };
      // Each row writes at its own positions: position p into slot p % slots of its ring row.
      // One row (Engine::decode) takes index_copy_ along the slots; several take index_put_ with
      // `entries`, a (row, head, slot) index per entry. scatter_ would say both in one op, but on
      // the CPU it costs milliseconds per write on a full ring (measured: 8.5 ms against 20 µs
      // for index_copy_ on an 8,192-slot bf16 ring), and index_put_ about twice index_copy_.
      auto entries = [&](const at::Tensor& slots) {  // slots: [B, n]
        const auto on = slots.options();
        return std::vector<at::indexing::TensorIndex>{
            at::arange(B, on).view({B, 1, 1}), at::arange(kv_heads, on).view({1, kv_heads, 1}),
            slots.unsqueeze(1)};
      };
      // `recorded`: the positions the slots record, the written positions but for a batch's
      // padding.
      auto write = [&](const at::Tensor& kk, const at::Tensor& vv, const at::Tensor& slots,
                       const at::Tensor& recorded) {
        if (B == 1) {
          ring.k.index_copy_(2, slots[0], kk);
          ring.v.index_copy_(2, slots[0], vv);
          ring.kpos.index_copy_(1, slots[0], recorded);
          return;
        }
        const auto index = entries(slots);
        ring.k.index_put_(index, kk);
        ring.v.index_put_(index, vv);
        ring.kpos.index_put_({index[0].tensor().view({B, 1}), slots}, recorded);
      };
      if (T == 1) {
        // Decode: writing first is safe (the slot overwritten holds position p - slots, outside
        // every window), and attention then reads the ring: with every slot, one fixed-shape
        // program.
        write(k, v, at::remainder(positions, ring.slots), positions);
        std::tie(k, v, kpos) = readable();
      } else {
        // A chunk: its own queries still need ring entries that its later tokens would
        // overwrite, so attend to ring + chunk, then keep the chunk's last `slots` tokens.
        // Entries at or after the chunk's first position are stale (a batch's padding step
        // wrote one there, or the row held a longer sequence): the chunk replaces them.
        auto [ring_k, ring_v, ring_pos] = readable();
        ring_pos = ring_pos.masked_fill(ring_pos >= positions.narrow(1, 0, 1), -1);
        auto all_k = at::cat({ring_k, k}, 2);
        auto all_v = at::cat({ring_v, v}, 2);
        auto all_pos = at::cat({ring_pos, positions}, 1);
        const int64_t n = std::min(T, ring.slots);
        auto kk = k.narrow(2, T - n, n), vv = v.narrow(2, T - n, n);
        const auto pp = positions.narrow(1, T - n, n);
        const auto slots = at::remainder(pp, ring.slots);
        auto recorded = pp;
        if (padding.defined()) {
          // Padding writes back what its slots hold: its positions follow the row's tokens, so
          // its slots are not theirs, and the entries there may still be in a window. The slots
          // are its own positions', whatever (or nothing, -1) they record.
          const auto pad = padding.narrow(1, T - n, n);
          const auto held = entries(slots);
          const auto pad4 = pad.view({B, 1, n, 1});
          kk = at::where(pad4, ring.k.index(held), kk);
          vv = at::where(pad4, ring.v.index(held), vv);
          recorded = at::where(pad, ring.kpos.gather(1, slots), pp);
        }
        write(kk, vv, slots, recorded);
        k = all_k;
        v = all_v;
        kpos = all_pos;
      }
    }
    kv_views[3 * l] = k;
    kv_views[3 * l + 1] = v;
    kv_views[3 * l + 2] = kpos;
  }

  return attend(l, q, k, v, positions, kpos, lora);
}

at::Tensor Gemma4::query(int64_t l, const at::Tensor& projected, const at::Tensor& cos,
                         const at::Tensor& sin) const {
  const auto& c = config_;
  const int64_t B = projected.size(0), T = projected.size(1);
  auto q = rms_norm(projected.view({B, T, c.num_attention_heads, c.layer_head_dim(l)}),
                    layers_[l].q_norm, c.rms_norm_eps);
  return ops::rope(q, cos, sin).transpose(1, 2);
}

at::Tensor Gemma4::attend(int64_t l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& query_pos, const at::Tensor& key_pos,
                          const LoraPass& lora) const {
  const auto& c = config_;
  const int64_t B = q.size(0), heads = q.size(1), T = q.size(2), d = q.size(3);
  const int64_t kv_heads = c.num_key_value_heads;
  const bool sliding = c.layer_types[l] == LayerType::kSliding;
  // Query head h reads kv head h / group (transformers' repeat_kv order).
  const auto q_rows = q.reshape({B, kv_heads, heads / kv_heads * T, d});
  auto out = ops::attention(q_rows, k, v, query_pos, key_pos, sliding ? c.sliding_window : 0);
  out = out.view({B, heads, T, d}).transpose(1, 2).reshape({B, T, heads * d});
  return lora.add(l, LoraGroup::kO, out, layers_[l].o_proj(out));
}

at::Tensor Gemma4::after_attention(int64_t l, const at::Tensor& h, const at::Tensor& attn,
                                   const LoraPass& lora) const {
  const auto& c = config_;
  const auto& w = layers_[l];
  auto x = h + rms_norm(attn, w.post_attention_layernorm, c.rms_norm_eps);
  RECORD_USER_SCOPE("gemma4::mlp");
  auto f = rms_norm(x, w.pre_feedforward_layernorm, c.rms_norm_eps);
  auto gate_up = w.gate_up(f);
  lora.add(l, LoraGroup::kGateUp, f, gate_up);
  const auto gated = ops::gelu_tanh_mul(gate_up[0], gate_up[1]);
  auto m = lora.add(l, LoraGroup::kDown, gated, w.down_proj(gated));
  return x + rms_norm(m, w.post_feedforward_layernorm, c.rms_norm_eps);
}

std::pair<at::Tensor, at::Tensor> Gemma4::angles(const at::Tensor& positions,
                                                 const at::Tensor& inv_freq) const {
  auto freqs = positions.unsqueeze(-1).to(at::kFloat) * inv_freq;
  auto emb = at::cat({freqs, freqs}, -1);
  // [B, T, 1, d]: broadcast over heads.
  return {emb.cos().to(options_.dtype).unsqueeze(2), emb.sin().to(options_.dtype).unsqueeze(2)};
}

at::Tensor Gemma4::embed(const at::Tensor& ids) const {
  auto scale = at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)),
                                 ids.options().dtype(at::kFloat))
                   .to(options_.dtype);
  return embed_tokens_.lookup(ids) * scale;
}

at::Tensor Gemma4::forward(const at::Tensor& ids, const at::Tensor& positions, Rings* rings,
                           bool last_only, bool no_logits, const SoftTokens* soft,
                           const at::Tensor& lengths, at::Tensor* hidden,
                           const LoraRows& lora, bool head) const {
  const auto& c = config_;
  const int64_t B = ids.size(0), T = ids.size(1);
  const LoraPass adapters(lora, options_.device, options_.dtype);

  // Profiler scopes (bench/decode_profile.py groups a decode step's time by them).
  at::Tensor h, ple;
  {
    RECORD_USER_SCOPE("gemma4::inputs");
    // Soft-token positions read pad_token_id's rows (the per-layer token part included), then
    // their main embeddings become the tower's rows, which the per-layer context part sees.
    const auto text_ids = soft ? at::where(soft->mask, c.pad_token_id, ids) : ids;
    h = embed(text_ids.reshape(-1)).view({B, T, c.hidden_size});
    if (soft) h = h.masked_scatter(soft->mask.unsqueeze(-1), soft->rows.to(h.scalar_type()));
    if (c.hidden_size_per_layer_input > 0) ple = per_layer_inputs(text_ids, h);
  }

  auto pos = positions;
  auto [cos_sliding, sin_sliding] = angles(pos, inv_freq_sliding_);
  auto [cos_full, sin_full] = angles(pos, inv_freq_full_);

  const auto padding =
      lengths.defined() ? at::arange(T, lengths.options()).unsqueeze(0) >= lengths.unsqueeze(1)
                        : at::Tensor();
  // From the first shared layer on (or at the head, with no shared layers), only the last
  // position continues when `last_only`.
  auto keep_last_position = [&] {
    if (!last_only || h.size(1) == 1) return;
    const int64_t t = h.size(1) - 1;
    // A row of padding alone continues from its first position, whose result nobody reads.
    const auto last = lengths.defined() ? (lengths - 1).clamp_min(0) : at::Tensor();
    for (auto* x : {&h, &ple, &pos, &cos_sliding, &sin_sliding, &cos_full, &sin_full}) {
      if (!x->defined()) continue;
      if (!last.defined()) {
        *x = x->narrow(1, t, 1);
        continue;
      }
      std::vector<int64_t> shape(x->dim(), 1), taken = x->sizes().vec();
      shape[0] = B;
      taken[1] = 1;
      *x = x->gather(1, last.view(shape).expand(taken));
    }
  };
  std::vector<at::Tensor> kv_views(3 * c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (l == c.first_shared_layer()) {
      if (no_logits) return {};
      keep_last_position();
    }
    const auto& w = layers_[l];
    const bool sliding = c.layer_types[l] == LayerType::kSliding;
    at::Tensor attn;
    {
      RECORD_USER_SCOPE("gemma4::attention");
      attn = attention(l, rms_norm(h, w.input_layernorm, c.rms_norm_eps), pos,
                       sliding ? cos_sliding : cos_full, sliding ? sin_sliding : sin_full, padding,
                       rings, kv_views, adapters);
    }
    h = after_attention(l, h, attn, adapters);
    if (ple.defined()) {
      RECORD_USER_SCOPE("gemma4::per_layer_input");
      auto g = ops::gelu_tanh_mul(
          adapters.add(l, LoraGroup::kPerLayerGate, h, w.per_layer_input_gate(h)),
          ple.select(2, l));
      g = adapters.add(l, LoraGroup::kPerLayerProjection, g, w.per_layer_projection(g));
      h = h + rms_norm(g, w.post_per_layer_input_norm, c.rms_norm_eps);
    }
    h = h * w.layer_scalar;  // scales the whole residual stream
  }
  if (no_logits) return {};
  keep_last_position();

  at::Tensor normed;
  {
    RECORD_USER_SCOPE("gemma4::head");  // the final norm counts with the head it feeds
    normed = rms_norm(h, final_norm_, c.rms_norm_eps);
  }
  if (hidden) *hidden = normed;
  return head ? this->head(normed) : at::Tensor();
}

at::Tensor Gemma4::head(const at::Tensor& hidden) const {
  RECORD_USER_SCOPE("gemma4::head");
  const auto logits = lm_head_(hidden);
  const double cap = config_.final_logit_softcapping;
  return cap > 0 ? ops::softcap(logits, cap, at::kFloat) : logits.to(at::kFloat);
}

std::pair<at::Tensor, at::Tensor> Gemma4::draft(const at::Tensor& x, const at::Tensor& positions,
                                                const Ring& sliding, const Ring& full) const {
  const auto& c = config_;
  TORCH_CHECK(c.assistant, "Gemma4::draft needs an assistant's checkpoint");
  const int64_t B = x.size(0);
  auto h = pre_projection_(x);
  auto [cos_sliding, sin_sliding] = angles(positions, inv_freq_sliding_);
  auto [cos_full, sin_full] = angles(positions, inv_freq_full_);
  // The rings hold the target's keys before the token, its own not yet: what the token's
  // position sees, the window's W keys included, is what position - 1 sees causally.
  const auto seen = positions - 1;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto& w = layers_[l];
    const bool is_sliding = c.layer_types[l] == LayerType::kSliding;
    const Ring& ring = is_sliding ? sliding : full;
    const auto q = query(l, w.qkv(rms_norm(h, w.input_layernorm, c.rms_norm_eps))[0],
                         is_sliding ? cos_sliding : cos_full, is_sliding ? sin_sliding : sin_full);
    const LoraPass none;
    h = after_attention(l, h, attend(l, q, ring.k, ring.v, seen, ring.kpos, none), none) *
        w.layer_scalar;
  }
  h = rms_norm(h, final_norm_, c.rms_norm_eps);
  auto carry = post_projection_(h);
  if (!c.assistant->use_ordered_embeddings) {
    return {lm_head_(h).view({B, -1}).argmax(-1), std::move(carry)};
  }
  // Gemma4AssistantMaskedEmbedder: the tokens of the top clusters scored, the rest masked below
  // them, so the argmax is the best of those tokens.
  const auto& a = *c.assistant;
  const int64_t per_cluster = c.vocab_size / a.num_centroids;
  const auto top = std::get<1>(centroids_(h).view({B, -1}).topk(a.centroid_intermediate_top_k));
  const auto candidates = token_ordering_.view({a.num_centroids, per_cluster})
                              .index_select(0, top.reshape(-1))
                              .view({B, -1});
  const auto rows = head_rows_.lookup(candidates.reshape(-1)).view({B, -1, c.hidden_size});
  const auto scores = at::bmm(rows, h.view({B, c.hidden_size, 1})).view({B, -1});
  return {candidates.gather(1, scores.argmax(-1, /*keepdim=*/true)).view({B}), std::move(carry)};
}

}  // namespace torchtpu
