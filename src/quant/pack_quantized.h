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

#include "io/checkpoint.h"
#include "io/config.h"

namespace torchtpu {

struct PackedInt4 {
  std::string module;     // "model.layers.0.mlp.down_proj", for messages
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

// True when `module` + ".weight_packed" exists in the checkpoint.
bool has_packed(const Checkpoint& ckpt, const std::string& module);

// Reads `module`.weight_packed / weight_scale / weight_shape / [weight_zero_point] / [weight_g_idx]
// and validates them against each other and against `quant` (FormatError naming the tensor on a
// packed width that does not match weight_shape, a scale shape that does not fit the group size,
// a zero point in a symmetric config, ...). Tensors alias the checkpoint's mapping where aligned.
PackedInt4 read_packed(const Checkpoint& ckpt, const std::string& module,
                       const QuantizationConfig* quant);

// Full [out, in] matrix in `dtype`, bit-identical to compressed-tensors' decompressor: the exact
// product (q - zp) * scale is rounded once to the scale dtype, then converted to `dtype`.
at::Tensor dequantize(const PackedInt4& w, at::ScalarType dtype);

// Rows `rows` (int64 [N], on w's device) of the dequantized matrix: [N, in] in `dtype`. Used for
// int4 vocabulary tables, so only the looked-up rows are ever expanded.
at::Tensor dequantize_rows(const PackedInt4& w, const at::Tensor& rows, at::ScalarType dtype);

}  // namespace torchtpu
