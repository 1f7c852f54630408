// The CPU side of torchtpu::int4_linear: the weight layout the decode kernel streams, the
// activation quantization it multiplies with, and the kernels (AMX and AVX-512 VNNI where the CPU
// has them, AVX2 on x86-64 CPUs without AVX-512, portable C++ elsewhere; all compute the same
// integer sums).
//
// Layout ("cpu blocks"). Output rows are cut into blocks of 64 (4 tiles of 16, the last block
// padded with zero rows), the input dim into sub-blocks of 32. For block b and sub-block kb, 1024
// bytes hold tile t (0..3), chunk c (0..3), lane j (0..15), byte i (0..3) at
// ((t * 4 + c) * 16 + j) * 4 + i: low nibble = u[64b + 16t + j][32kb + 8c + i], high nibble =
// u[...][32kb + 8c + 4 + i], with u = q + 8 the unsigned nibble of compressed-tensors. So one
// 64-byte load is 16 rows × 8 inputs, and a dword lane lines up with 4 consecutive activation
// bytes (vpdpbusd). Scales [blocks, groups, 64] keep the checkpoint's dtype; zero points
// [blocks, groups, 64] are the unsigned stored nibbles (zp + 8), absent when symmetric.
//
// Activations are quantized per row and 32-block to two int8 parts, x ≈ d·(hi + lo/254) with
// d = max|x| / 127: about 16-bit block fixed point (relative error ≤ 2⁻¹⁶ of the block's max), so
// the products are those of the exact int4 weights and nearly exact activations, summed exactly in
// int32 per 32-block and in f32 across blocks.
//
// With 8-bit activations (no lo part: llama.cpp's Q8_0 blocks, x ≈ d·hi) a row costs half the
// vpdpbusd: the fast mode for several rows at once on CPUs without AMX, at a relative error per
// linear of about 2⁻⁸ of each block's max instead of 2⁻¹⁶.
#pragma once

#include <cstdint>

#include "common/cpu_float.h"

namespace torchtpu::ops::int4_cpu {

constexpr int64_t kBlockRows = 64;
constexpr int64_t kSubK = 32;
constexpr int64_t kSubBytes = kBlockRows * kSubK / 2;

struct BlockWeights {
  const uint8_t* nibbles = nullptr;  // [blocks, k / 32, 1024]
  const void* scale = nullptr;       // [blocks, k / group_size, 64], scale_type
  const uint8_t* zero = nullptr;     // [blocks, k / group_size, 64]; nullptr: symmetric (8)
  cpu::FloatType scale_type = cpu::FloatType::kBFloat16;
  int64_t k = 0;
  int64_t group_size = 0;  // a multiple of 32 that divides k
};

// Rows of activations quantized as described above; every array is [rows, k / 32] except hi/lo.
// lo, d_lo, sum_lo and lo_start are nullptr for 8-bit activations.
struct QuantizedRows {
  int8_t* hi = nullptr;  // [rows, k]
  int8_t* lo = nullptr;  // [rows, k]
  float* d = nullptr;
  float* d_lo = nullptr;    // d / 254, the step of lo
  float* sum_hi = nullptr;  // Σ hi per 32-block, as float (exact)
  float* sum_lo = nullptr;
  // -8·Σ hi (lo): what a symmetric weight's zero point takes from a block's sum, so the VNNI
  // kernels start their int32 sums there instead of subtracting it in f32 (the same exact value).
  int32_t* hi_start = nullptr;
  int32_t* lo_start = nullptr;
  int64_t rows = 0;
  int64_t k = 0;
};

// Quantizes x [rows, k] (row-major, in `type`; k = a.k, rows = a.rows) into a's arrays.
void quantize_rows(const void* x, cpu::FloatType type, const QuantizedRows& a);

// Where gemv_blocks writes: row m of the result at data + m * ld elements, columns below `columns`
// only (the padding rows of the last block are dropped), rounded to `type` (nearest even).
struct Output {
  void* data = nullptr;
  int64_t ld = 0;
  int64_t columns = 0;
  cpu::FloatType type = cpu::FloatType::kBFloat16;
};

// Rows of `a` gemv_blocks takes in one call: the AMX kernel's activation tile holds their hi and
// lo parts (16 tile rows), and the VNNI kernel has a version for each row count up to it.
constexpr int64_t kMaxRows = 8;

// y[m][64b + r] = Σ_k x[m][k] · (u - zero)·scale for blocks [b0, b1) and every row of `a`
// (at most kMaxRows).
void gemv_blocks(const BlockWeights& w, const QuantizedRows& a, int64_t b0, int64_t b1,
                 const Output& y);

// Writes rows [64·b0, min(64·b1, out_rows)) of the dequantized matrix, row-major [out_rows, k],
// as compressed-tensors computes them: (u - zero)·scale rounded once to the scale dtype, then
// converted to bf16 (out_bf16) or f32.
void dequantize_blocks(const BlockWeights& w, int64_t b0, int64_t b1, int64_t out_rows,
                       bool out_bf16, void* out);

}  // namespace torchtpu::ops::int4_cpu
