// Gemma 4 text decoder over ATen (research/gemma4-architecture.md §2). Every tensor operation is an
// at:: call on tensors of one device, so the same code runs on the CPU, CUDA and TorchTPU.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "io/implied_shapes.h"
#include "model/lora.h"
#include "model/rings.h"
#include "ops/dense_linear.h"
#include "ops/int4_linear.h"
#include "quant/pack_quantized.h"

namespace torchtpu {

// A vocabulary-sized table (embed_tokens, embed_tokens_per_layer, lm_head): dense in the compute
// dtype, or int4 pack-quantized and expanded only for the rows looked up.
class VocabTable {
 public:
  static VocabTable dense(at::Tensor weight);
  static VocabTable int4(PackedInt4 packed, at::ScalarType dtype);

  int64_t rows() const;
  int64_t width() const;
  at::Tensor lookup(const at::Tensor& ids) const;  // [N] int64 -> [N, width] compute dtype
  at::Tensor matrix() const;                       // the whole table in the compute dtype
  bool is_int4() const { return packed_.has_value(); }
  const PackedInt4* packed() const { return packed_ ? &*packed_ : nullptr; }
  int64_t nbytes() const;

 private:
  at::Tensor dense_;
  std::optional<PackedInt4> packed_;
  at::ScalarType dtype_ = at::kFloat;
};

// A linear layer's weight: dense [out, in] in the compute dtype, multiplied by the
// torchtpu::dense_linear operator, or int4 kept packed and multiplied by torchtpu::int4_linear.
struct Linear {
  at::Tensor dense;
  std::optional<ops::Int4Weight> int4;

  at::Tensor operator()(const at::Tensor& x) const {
    return int4 ? ops::int4_linear(x, *int4) : ops::dense_linear(x, dense);
  }
  int64_t nbytes() const { return int4 ? int4->nbytes() : dense.nbytes(); }
};

// A linear of the vision and audio towers (Gemma4ClippableLinear): no bias, input and output
// clamped to bounds stored in the checkpoint; the bounds are undefined when the tower's config
// has use_clipped_linears false.
struct ClippedLinear {
  at::Tensor weight;                                        // [out, in]
  at::Tensor input_min, input_max, output_min, output_max;  // scalars

  at::Tensor operator()(const at::Tensor& x) const {
    if (!input_min.defined()) return at::linear(x, weight);
    return at::clamp(at::linear(at::clamp(x, input_min, input_max), weight), output_min,
                     output_max);
  }
};

// Linears that read the same input (q/k/v, gate/up), called together. On the CPU kernel's blocks
// they are fused into one call (ops::fuse_cpu_blocks: decode's cost is per call as well as per
// byte); on every other form each part runs on its own. Either way, the parts' outputs in order.
struct LinearGroup {
  std::vector<Linear> parts;  // empty when fused
  Linear whole;               // defined when fused
  std::vector<int64_t> offsets, sizes;

  static LinearGroup of(std::vector<Linear> parts);
  std::vector<at::Tensor> operator()(const at::Tensor& x) const;
};

struct LayerWeights {
  at::Tensor input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
      post_feedforward_layernorm, post_per_layer_input_norm;  // f32, via the compute dtype
  LinearGroup qkv;  // q_proj, k_proj, v_proj; q_proj alone when shared
  Linear o_proj;
  at::Tensor q_norm, k_norm;  // k_norm undefined when shared
  LinearGroup gate_up;        // gate_proj, up_proj
  Linear down_proj;
  Linear per_layer_input_gate, per_layer_projection;
  at::Tensor layer_scalar;  // [1], compute dtype
};

// How each tensor family is held, for reports (generate --json, /v1/engine).
struct StorageReport {
  std::string family;  // "linears", "embed_tokens", "embed_tokens_per_layer", "lm_head", "norms"
  std::string format;  // "bf16", "f32", "int4(g32, bf16 scales)" ...
  std::string where;   // "cpu (mmap)", "cuda:0", ...
  int64_t bytes = 0;
};

// How int4 weights (pack-quantized linears, an int4 head) are held.
enum class Int4Weights {
  kAuto,         // packed on the CPU, dequantized elsewhere
  kPacked,       // packed; on the CPU in the CPU kernel's blocks (ops/int4_cpu.h)
  kComposite,    // packed in compressed-tensors' layout: the operator's composite kernel
  kDequantized,  // expanded to the compute dtype at load (the head included)
};

// Soft tokens (the vision or audio tower's rows) taking the place of some positions of a forward
// pass's ids, as Gemma4Model.forward places them: those positions look up pad_token_id in both
// embedding tables, then their main embeddings are replaced by `rows` (unscaled), in order.
struct SoftTokens {
  at::Tensor mask;  // [batch, T] bool on the device, true at soft-token positions
  at::Tensor rows;  // [mask.sum(), hidden_size] on the device
};

struct ModelOptions {
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kBFloat16;  // compute dtype
  std::string emb4_dir;                  // int4 vocabulary tables overriding the checkpoint's
  // Attention reads ring slots only up to the last filled one (DESIGN principle 3's host-side
  // shortcut): one host read of kpos per ring and step, so shapes vary with the length. A large
  // saving on the CPU (a 4,000-token prompt in a 33,024-slot context stops attending to 29,000
  // empty slots); off where a fixed program per step matters more (CUDA graphs, TorchTPU).
  bool attend_filled_slots = false;
  Int4Weights int4 = Int4Weights::kAuto;
  // Quantizes dense linears and the head at load as `torchtpu-cpp quantize --group 32` and
  // `--emb4` would (symmetric, group 32; the head with f16 scales), so a bf16 checkpoint decodes
  // from int4 without a file being written.
  bool quantize_int4 = false;
  // The int4 operator's activation_bits for every int4 linear: 16, or 8 for the CPU kernel's fast
  // mode for several rows (ops/int4_cpu.h).
  int64_t int4_activation_bits = 16;
};

class Gemma4 {
 public:
  Gemma4(const std::string& model_dir, const ModelOptions& options);

  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  const std::vector<StorageReport>& storage() const { return storage_; }

  // One forward pass over ids [batch, T] at positions [batch, T] (int64, on the device).
  // rings == nullptr: a plain causal pass with no cache (logits for every position).
  // With rings: the chunk attends to what the rings hold plus itself, then is written into them.
  // `last_only`: only the last position continues past the non-shared layers (the shared ones
  // write nothing, so earlier positions need them only for their own logits); `no_logits` stops
  // after the last non-shared layer, for prompt chunks before the final one.
  // Returns float32 logits [batch, T or 1, vocab], or an undefined tensor with no_logits.
  // `soft`: soft tokens for some positions of this pass (nullptr: ids alone).
  // `lengths` ([batch] int64 on the device, with rings): row b's tokens are its first lengths[b]
  // (0 to T); the rest are padding, which writes nothing into the rings, and with last_only row
  // b continues from its position lengths[b] - 1. Several prompts read in one pass (a Batch).
  // `hidden`: set to the final norm's output [batch, T or 1, hidden_size] (the head's input at
  // the positions of the logits), what an assistant drafts from; undefined with no_logits.
  // `lora`: the adapters (model/lora.h) each row applies and at what scale, for the model's
  // linears to add; empty: none.
  // `head`: false returns an undefined tensor once `hidden` is set, for a caller that takes the
  // head over parts of the positions (head()), so that a long chunk's logits need not all exist
  // at once.
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& positions, Rings* rings,
                     bool last_only = false, bool no_logits = false,
                     const SoftTokens* soft = nullptr, const at::Tensor& lengths = {},
                     at::Tensor* hidden = nullptr, const LoraRows& lora = {},
                     bool head = true) const;
  // The head over final hidden states [..., hidden_size] (forward's `hidden`): float32 logits
  // [..., vocab], softcapped as forward's.
  at::Tensor head(const at::Tensor& hidden) const;
  // The input embeddings of ids [N] (int64, on the device): embed_tokens' rows times
  // sqrt(hidden_size), [N, hidden_size] in the compute dtype.
  at::Tensor embed(const at::Tensor& ids) const;

  // One step of an assistant (config().assistant, a multi-token-prediction drafter): a draft
  // token for each of B rows. `x` [B, 1, 2 * backbone_hidden_size]: the target's embed() of the
  // row's last token beside the target's final hidden state that chose it, or beside the carry
  // of this call for the draft token before. `positions` [B, 1]: that last token's position; the
  // layers attend, at that position and without a causal order, to the K/V the target's rings
  // hold before it: sliding layers to `sliding` (the target's last non-shared sliding layer's
  // ring, its window of keys), full layers to `full` (likewise, every key). Returns the draft
  // tokens [B] (int64, the head's argmax over the vocabulary or, with ordered embeddings, over
  // the top clusters' tokens) and the carry [B, 1, backbone_hidden_size].
  std::pair<at::Tensor, at::Tensor> draft(const at::Tensor& x, const at::Tensor& positions,
                                          const Ring& sliding, const Ring& full) const;

 private:
  // `padding`: [batch, T] bool, true where forward's `lengths` say padding (undefined: none).
  at::Tensor attention(int64_t layer, const at::Tensor& x, const at::Tensor& positions,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& padding,
                       Rings* rings, std::vector<at::Tensor>& kv_views,
                       const LoraPass& lora) const;
  at::Tensor per_layer_inputs(const at::Tensor& ids, const at::Tensor& embeds) const;
  // cos and sin [B, T, 1, d] of positions [B, T] for one layer type's inverse frequencies.
  std::pair<at::Tensor, at::Tensor> angles(const at::Tensor& positions,
                                           const at::Tensor& inv_freq) const;
  // Layer l's queries from its q projection's output [B, T, heads * d]: normed and rotated,
  // [B, heads, T, d].
  at::Tensor query(int64_t l, const at::Tensor& projected, const at::Tensor& cos,
                   const at::Tensor& sin) const;
  // The attention's output [B, T, heads * d] of queries [B, heads, T, d] over k/v, projected.
  at::Tensor attend(int64_t l, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& query_pos, const at::Tensor& key_pos,
                    const LoraPass& lora) const;
  // The residual stream h after layer l's attention output: its norm added, then the MLP's.
  at::Tensor after_attention(int64_t l, const at::Tensor& h, const at::Tensor& attn,
                             const LoraPass& lora) const;
  Linear linear_weight(const Checkpoint& ckpt, const std::string& module,
                       const ImpliedTensor& implied);
  // The form options_.int4 asks for of an int4 weight on the host.
  Linear int4_linear(const PackedInt4& packed) const;
  void load(const Checkpoint& ckpt, const Checkpoint* emb4);

  ModelConfig config_;
  ModelOptions options_;
  std::shared_ptr<Checkpoint> checkpoint_;  // keeps weight mappings alive
  std::shared_ptr<Checkpoint> emb4_;
  std::vector<LayerWeights> layers_;
  VocabTable embed_tokens_, embed_tokens_per_layer_;
  Linear lm_head_, per_layer_model_projection_;
  at::Tensor per_layer_projection_norm_, final_norm_;
  at::Tensor inv_freq_sliding_, inv_freq_full_;  // f32 on the device
  // An assistant's own weights (config_.assistant): the projections into and out of its width,
  // the vocabulary table its head scores, and with ordered embeddings the clusters' centroids
  // and token_ordering (the vocabulary ids, cluster by cluster).
  Linear pre_projection_, post_projection_, centroids_;
  VocabTable head_rows_;
  at::Tensor token_ordering_;  // [vocab] int64 on the device
  std::vector<StorageReport> storage_;
};

}  // namespace torchtpu
