// torchtpu::gelu_tanh_mul: Gemma 4's GeGLU gate, gelu(gate, approximate="tanh") * up, as one
// dispatcher operator.
//
//   torchtpu::gelu_tanh_mul(Tensor gate, Tensor up) -> Tensor
//
// gate and up of one shape and dtype; the GELU is rounded to that dtype before the product, as the
// two ATen ops round it. The composite kernel is those two ops (every device); the CPU kernel
// computes ATen's expression in one pass (AVX-512 with the Sleef tanh that ATen's vectorized GELU
// calls: the same bits as the two ops, measured on 2^20 values per dtype). A decode step makes 70
// of these (MLP and per-layer input gates); as ATen ops each was two calls and a temporary.
#pragma once

#include <ATen/ATen.h>

namespace torchtpu::ops {

at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace torchtpu::ops
