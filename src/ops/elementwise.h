// Gemma 4's elementwise steps as dispatcher operators, each one pass on the CPU:
//
//   torchtpu::gelu_tanh_mul(Tensor gate, Tensor up) -> Tensor
//     the GeGLU gate, gelu(gate, approximate="tanh") * up (gate and up of one shape and dtype),
//     the GELU rounded to that dtype before the product; 70 calls per E2B decode step (MLP and
//     per-layer input gates);
//   torchtpu::softcap(Tensor x, float cap, ScalarType? dtype=None) -> Tensor
//     the final logit soft-cap, tanh(x / cap) * cap, each of the three steps rounded to x's dtype,
//     the result then converted to dtype (the head asks for f32: one pass, where a conversion
//     after it was a second over the 262,144 logits); once per step;
//   torchtpu::rope(Tensor x, Tensor cos, Tensor sin) -> Tensor
//     rotary embedding in the rotate-half convention, x·cos + rotate_half(x)·sin, each product
//     and the sum rounded to x's dtype; x [B, T, heads, d] with cos/sin [B, T, 1, d] (broadcast
//     over heads); 50 calls per E2B decode step.
//
// The composite kernels are those ATen ops (every device, and softcap's f32, whose ATen tanh is
// not Sleef's). The CPU kernels evaluate ATen's own expressions in one pass, AVX-512 with the
// Sleef tanh that ATen's vectorized kernels call, so the bits are the ATen ops' (tested in bf16,
// f16 and f32); as ATen ops each was two or three calls with their temporaries.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace torchtpu::ops {

at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up);

at::Tensor softcap(const at::Tensor& x, double cap,
                   std::optional<at::ScalarType> dtype = std::nullopt);

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace torchtpu::ops
