// torchtpu::rms_norm: Gemma 4's RMSNorm as one dispatcher operator.
//
//   torchtpu::rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor
//
// x * (mean(x², last dim) + eps)^-0.5 [* weight], in f32, rounded once to x's dtype (weight f32,
// or None for the weightless v norm). The composite kernel is those ATen ops (every device); the
// CPU kernel computes the same per row in one pass. A decode step runs ~250 of these norms, and
// as ATen ops each is ~12 calls: on the CPU that overhead alone was ~5 ms of a ~75 ms E2B step.
#pragma once

#include <ATen/ATen.h>

namespace torchtpu::ops {

// weight: f32 [x.size(-1)] or undefined.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace torchtpu::ops
