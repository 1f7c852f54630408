// torchtpu::attention: Gemma 4's attention of a few new query rows over a KV ring, as one
// dispatcher operator.
//
//   torchtpu::attention(Tensor q, Tensor k, Tensor v, Tensor query_pos, Tensor key_pos,
//                       int window) -> Tensor
//
// q [B, kv_heads, R, d] holds R = group · T query rows per kv head, row r at position
// query_pos[b, r % T] (query_pos [B, T], int64); k and v are [B, kv_heads, S, d]; key_pos [B, S]
// (int64, negative for an empty slot). Row r attends to key s when 0 <= key_pos <= its position
// and, for window > 0, key_pos > position - window; every row must see at least one key (its
// own). Scale 1: Gemma 4's q/k norms carry it. The numerics are the ATen formula's in q's dtype:
// scores rounded to that dtype, softmax in f32, probabilities rounded to that dtype, their product
// with v summed in f32 and rounded once. Returns [B, kv_heads, R, d] in q's dtype.
//
// The composite kernel is that ATen formula (every device; on the CPU, chunks of more than a few
// queries also take it, for oneDNN's matmuls). The CPU kernel computes a decode step's rows in
// one pass each: a decode step as ATen ops is ~20 small calls per layer (ring narrowing, mask,
// softmax, two bf16 matmuls of ~30 µs each), about a sixth of an E2B step on two cores.
#pragma once

#include <ATen/ATen.h>

namespace torchtpu::ops {

// Query positions per row up to which the CPU kernel runs; longer chunks (prompt reading) take
// the composite, whose matmuls oneDNN runs on AMX (or in f32 below the AVX-512 tier), and whose
// rounding differs from the kernel's.
constexpr int64_t kMaxFusedQueries = 8;

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& query_pos, const at::Tensor& key_pos, int64_t window);

}  // namespace torchtpu::ops
