// torchtpu::int4_linear: a linear layer whose weights stay packed int4 (compressed-tensors
// pack-quantized), as a dispatcher operator (docs/ARCHITECTURE.md, "The int4 operator").
//
//   torchtpu::int4_linear(Tensor x, Tensor weight, Tensor scale, Tensor? zero_point,
//                         int group_size, int out_features, int activation_bits=16) -> Tensor
//   torchtpu::int4_repack(Tensor weight, Tensor scale, Tensor? zero_point, int group_size,
//                         int out_features) -> Tensor[]
//
// The weight comes in one of two layouts, told apart by its dtype:
//  - compressed-tensors' own (int32 weight [out, ceil(in/8)], scale [out, groups], zero_point
//    int32 [ceil(out/8), groups] or None): any device. The composite kernel dequantizes exactly as
//    compressed-tensors does and calls at::linear, so CUDA, TorchTPU and every other backend run
//    the op as plain ATen.
//  - the CPU kernel's blocks (uint8 weight, ops/int4_cpu.h), made once at load by int4_repack on
//    the CPU: the CPU kernel streams them with AVX-512 VNNI (or portable C++) for a few rows of x,
//    and dequantizes into a bf16 matrix for oneDNN when x has many rows (prompt chunks) or is f32.
// activation_bits (16 or 8) is the precision of x's rows when the CPU kernel streams the weights
// (ops/int4_cpu.h); 8 is the fast mode for several rows at once. Where the weights are dequantized
// instead (other devices, prompt chunks, f32) x keeps its dtype either way.
// A Meta kernel gives shapes only. The CPU kernel takes either layout (the first through the
// composite), which is how tests force the composite on the CPU.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "quant/pack_quantized.h"

namespace torchtpu::ops {

// One int4 linear's tensors in either layout.
struct Int4Weight {
  at::Tensor weight, scale, zero_point;  // zero_point undefined when symmetric
  int64_t group_size = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t activation_bits = 16;  // the operator's activation_bits

  bool cpu_blocks() const { return weight.scalar_type() == at::kByte; }
  int64_t nbytes() const;
  // "int4 g32, bf16 scales, cpu blocks (avx512-vnni)" for storage reports.
  std::string describe() const;
};

// x [..., in] -> [..., out] in x's dtype, through the dispatcher.
at::Tensor int4_linear(const at::Tensor& x, const Int4Weight& w);

// The compressed-tensors tensors of `packed` as an Int4Weight (no copy).
Int4Weight int4_weight(const PackedInt4& packed);

// True when the CPU kernel can take `packed` in its own layout: no activation ordering (g_idx),
// in_features and the group size multiples of 32 (channel strategy counts as one group).
bool cpu_blocks_supported(const PackedInt4& packed);

// The CPU kernel's layout of `packed` (host tensors; cpu_blocks_supported must hold).
Int4Weight repack_for_cpu(const PackedInt4& packed);

// Int4 linears that read the same input, as one whose outputs lie side by side: one call then
// streams all their weights with one dispatch, one quantization of the input and one fork/join
// instead of one each. Part i's outputs are columns [offsets[i], offsets[i] + its out_features);
// each part keeps its padding rows, so offsets are multiples of the block's 64 rows. Only for the
// CPU kernel's blocks of one in_features, group size, scale dtype and symmetry; nullopt otherwise.
struct FusedInt4 {
  Int4Weight whole;
  std::vector<int64_t> offsets;
};
std::optional<FusedInt4> fuse_cpu_blocks(const std::vector<Int4Weight>& parts);

// Rows of x up to which the CPU kernel streams its blocks (a Batch step, a short prompt chunk);
// beyond, it dequantizes them for a dense product.
int64_t int4_cpu_streamed_rows();

// The ISA the CPU kernel runs with here ("avx512-vnni+amx-int8", "avx512-vnni", "avx2" or
// "portable").
const char* int4_cpu_isa();

}  // namespace torchtpu::ops
