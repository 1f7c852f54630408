// compressed-tensors "pack-quantized" int4 weights (W4A16): reading, validating and dequantizing.
// Layout (research/formats.md §1, checked against compressed-tensors' own code): 8 signed int4
// values per int32 along the input dim, column 8j+i in bits 4i..4i+3, stored as q+8; scales per
// group of input columns (or per channel); optional zero points packed along the output dim;
// optional g_idx mapping columns to groups. All tensors stay in their file dtypes and on the host
// mapping until moved; dequantization is ATen ops only, so it runs on any device.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"

namespace torchtpu {

struct PackedInt4 {
  std::string module;     // "model.layers.0.mlp.down_proj", for messages
  std::string file;       // file holding weight_packed, for messages ("" when built in memory)
  at::Tensor packed;      // int32 [out, ceil(in/8)]
  at::Tensor scale;       // bf16/f16/f32 [out, groups] (groups = 1 for channel strategy)
  at::Tensor zero_point;  // int32 [ceil(out/8), groups], undefined when symmetric
  at::Tensor g_idx;       // int32 [in], undefined unless activation ordering
  int64_t out = 0;
  int64_t in = 0;
  int64_t group_size = 0;  // == in for channel strategy

  // Moves every tensor to `device` (scales keep their dtype).
  PackedInt4 to(const at::Device& device) const;
  // Bytes held by the packed form.
  int64_t nbytes() const;
};

// Modules named `*.embed_tokens` / `*.embed_tokens_per_layer` count as the class "Embedding" in
// quantization_config targets; every other module with a 2-D weight counts as "Linear" (lm_head
// included, as in transformers). A C++ loader has no module classes, so names decide.
bool is_embedding_module(const std::string& module);

// The config group that quantizes `module`, as compressed-tensors' apply_quantization_config
// resolves it: an `ignore` entry wins; a target belongs to the last group naming it; exact names
// beat "re:" patterns (Python re.match, anchored at the start; the alphabetically first matching
// pattern wins), which beat class names. nullptr when no group covers the module. FormatError on
// an invalid pattern.
const QuantGroup* quant_group_for(const QuantizationConfig& quant, const std::string& module);

// Where config and tensors disagree about which modules are pack-quantized. The tensors win (a
// module with weight_packed is read as int4 whatever the config says); the loader logs summary()
// once, so a user learns that the config is stale without the load failing.
struct QuantMismatch {
  std::vector<std::string> packed_not_targeted;  // has weight_packed, no config group covers it
  std::vector<std::string> targeted_not_packed;  // a config group covers it, stored dense
  bool empty() const { return packed_not_targeted.empty() && targeted_not_packed.empty(); }
  // One message naming up to `max_names` modules of each kind and the counts; "" when empty.
  std::string summary(const std::string& dir, size_t max_names = 4) const;
};
// Compares every module of `ckpt` that has `.weight_packed` or a 2-D `.weight` with `quant`
// (nullptr: no quantization_config, so every packed module is a mismatch).
QuantMismatch quantized_modules_mismatch(const Checkpoint& ckpt, const QuantizationConfig* quant);

// True when `module` + ".weight_packed" exists in the checkpoint.
bool has_packed(const Checkpoint& ckpt, const std::string& module);

// Drops the pages of `module`'s packed tensors from the resident set (release_pages), for once
// they have been dequantized or copied to a device: the result no longer aliases them.
void release_packed(const Checkpoint& ckpt, const std::string& module);

// Reads `module`.weight_packed / weight_scale / weight_shape / [weight_zero_point] / [weight_g_idx]
// and validates them against each other and against `quant` (FormatError naming the tensor on a
// packed width that does not match weight_shape, a scale shape that does not fit the group size,
// a zero point in a symmetric config, ...). Tensors alias the checkpoint's mapping where aligned,
// so `ckpt` must outlive the result unless it is moved with to(). The config group that covers
// `module` sets group size and symmetry; without one (no config, or a module the config does not
// name: tensors win) they are inferred from the scale and zero-point tensors.
PackedInt4 read_packed(const Checkpoint& ckpt, const std::string& module,
                       const QuantizationConfig* quant);

// FormatError naming module and file unless `w` is [out, in]: an int4 vocabulary table must have
// one row per token. `expected` says where the expectation comes from ("vocab_size in
// config.json").
void expect_shape(const PackedInt4& w, int64_t out, int64_t in, const std::string& expected);

// Full [out, in] matrix in `dtype`, bit-identical to compressed-tensors' decompressor: the exact
// product (q - zp) * scale is rounded once to the scale dtype, then converted to `dtype`.
at::Tensor dequantize(const PackedInt4& w, at::ScalarType dtype);

// Rows `rows` (int64 [N], on w's device) of the dequantized matrix: [N, in] in `dtype`. Used for
// int4 vocabulary tables, so only the looked-up rows are ever expanded.
at::Tensor dequantize_rows(const PackedInt4& w, const at::Tensor& rows, at::ScalarType dtype);

}  // namespace torchtpu
