// torchtpu::dense_linear: x · wᵀ for the text model's dense linears, as one dispatcher operator.
//
//   torchtpu::dense_linear(Tensor x, Tensor w) -> Tensor
//
// x [..., in], w [out, in]; returns [..., out], as at::linear(x, w). The composite kernel is that
// ATen op (every device, every dtype). The CPU kernel takes float32, where a row's sums must not
// depend on the rows beside it: a Batch decodes a sequence in passes of however many rows are
// decoding, and at float32 it promises the tokens the sequence gets alone. BLAS's f32 kernels
// block rows by the call's row count and give a row other bits in a call of 2, 4 or 40 rows
// (docs/RELIABILITY.md, "A row's f32 bits and the rows beside it"). Here each output is one
// vector of per-lane partial sums over the input in order, one fixed reduction of its lanes, then
// the inputs short of a whole vector one at a time: the same operations whatever the row count,
// the tiling or the threads, within one tier of kernels (AVX-512, AVX2, portable).
#pragma once

#include <ATen/ATen.h>

namespace torchtpu::ops {

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w);

}  // namespace torchtpu::ops
