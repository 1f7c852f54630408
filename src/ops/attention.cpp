#include "ops/attention.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/cpu_float.h"

namespace torchtpu::ops {
namespace {

using cpu::FloatType;

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& query_pos, const at::Tensor& key_pos) {
  TORCH_CHECK_VALUE(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                    "attention: q, k and v must be 4-D [B, kv_heads, rows, d], got ", q.sizes(),
                    ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK_VALUE(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                        k.size(3) == q.size(3),
                    "attention: k and v must be [", q.size(0), ", ", q.size(1), ", S, ", q.size(3),
                    "] for q ", q.sizes(), ", got ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK_VALUE(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
                    "attention: q, k and v must share a dtype, got ", q.scalar_type(), ", ",
                    k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK_VALUE(query_pos.scalar_type() == at::kLong && key_pos.scalar_type() == at::kLong,
                    "attention: positions must be int64");
  TORCH_CHECK_VALUE(query_pos.dim() == 2 && query_pos.size(0) == q.size(0) &&
                        query_pos.size(1) > 0 && q.size(2) % query_pos.size(1) == 0,
                    "attention: query_pos must be [", q.size(0), ", T] with T dividing q's rows (",
                    q.size(2), "), got ", query_pos.sizes());
  TORCH_CHECK_VALUE(
      key_pos.dim() == 2 && key_pos.size(0) == k.size(0) && key_pos.size(1) == k.size(2),
      "attention: key_pos must be [", k.size(0), ", ", k.size(2), "], got ", key_pos.sizes());
}

// The formula, its two products in q's dtype. With f32_products they run in f32 on the same
// values and are rounded to the dtype, as a bf16 or f16 matmul rounds its f32 sums: the same
// roundings (up to the order of the sums), for CPUs where ATen's 16-bit matmuls are slow.
at::Tensor attention_formula(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& query_pos, const at::Tensor& key_pos,
                             int64_t window, bool f32_products) {
  check_shapes(q, k, v, query_pos, key_pos);
  const int64_t B = q.size(0), kv_heads = q.size(1), R = q.size(2);
  const int64_t T = query_pos.size(1), S = k.size(2);
  auto matmul = [&](const at::Tensor& a, const at::Tensor& b) {
    if (!f32_products) return at::matmul(a, b);
    return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(q.scalar_type());
  };
  // One query position computes (k·qᵀ)ᵀ: with a ring as the right operand, transposed, CPU bmm
  // copies all of K first.
  auto scores =
      T == 1 ? matmul(k, q.transpose(2, 3)).transpose(2, 3) : matmul(q, k.transpose(2, 3));
  auto qpos = query_pos.unsqueeze(2);  // [B, T, 1]
  auto kpos = key_pos.unsqueeze(1);    // [B, 1, S]
  auto keep = (kpos >= 0).logical_and(kpos <= qpos);
  if (window > 0) keep = keep.logical_and(kpos > qpos - window);
  scores = scores.view({B, kv_heads, R / T, T, S})
               .masked_fill(keep.logical_not().view({B, 1, 1, T, S}),
                            -std::numeric_limits<double>::infinity());
  auto probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return matmul(probs.view({B, kv_heads, R, S}), v);
}

at::Tensor attention_composite(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& query_pos, const at::Tensor& key_pos,
                               int64_t window) {
  return attention_formula(q, k, v, query_pos, key_pos, window, false);
}

at::Tensor attention_meta(const at::Tensor& q, const at::Tensor&, const at::Tensor&,
                          const at::Tensor&, const at::Tensor&, int64_t) {
  return at::empty_like(q);
}

// One query row's view of the problem: its q row, the k/v rows of its kv head (row s at
// s · row_stride elements), the key positions of its batch row.
struct Row {
  const void* q;
  const void* k;
  const void* v;
  int64_t row_stride;
  const int64_t* key_pos;
  int64_t slots;
  int64_t position;
  int64_t window;
  int64_t d;
  void* out;
};

bool visible(const Row& r, int64_t s) {
  const int64_t p = r.key_pos[s];
  return p >= 0 && p <= r.position && (r.window <= 0 || p > r.position - r.window);
}

// Sixteen partial sums, as the AVX-512 kernel's lanes: as exact, and vectorizable.
template <FloatType F>
float dot_portable(const float* q, const void* k, int64_t d) {
  float partial[16] = {};
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    for (int j = 0; j < 16; ++j) partial[j] += q[i + j] * cpu::load(F, k, i + j);
  }
  float sum = 0.0f;
  for (; i < d; ++i) sum += q[i] * cpu::load(F, k, i);
  for (float p : partial) sum += p;
  return sum;
}

template <FloatType F>
void axpy_portable(float p, const void* v, float* acc, int64_t d) {
  for (int64_t i = 0; i < d; ++i) acc[i] += p * cpu::load(F, v, i);
}

#if defined(__x86_64__)
template <FloatType F>
TORCHTPU_AVX512 float dot_avx512(const float* q, const void* k, int64_t d) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), cpu::load16<F>(k, i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), cpu::load16<F>(k, i + 16), a1);
  }
  for (; i + 16 <= d; i += 16)
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), cpu::load16<F>(k, i), a0);
  float sum = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
  for (; i < d; ++i) sum += q[i] * cpu::load(F, k, i);
  return sum;
}

template <FloatType F>
TORCHTPU_AVX512 void axpy_avx512(float p, const void* v, float* acc, int64_t d) {
  const __m512 pp = _mm512_set1_ps(p);
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    _mm512_storeu_ps(acc + i, _mm512_fmadd_ps(pp, cpu::load16<F>(v, i), _mm512_loadu_ps(acc + i)));
  }
  for (; i < d; ++i) acc[i] += p * cpu::load(F, v, i);
}

template <FloatType F>
TORCHTPU_AVX2 float dot_avx2(const float* q, const void* k, int64_t d) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= d; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), cpu::load8<F>(k, i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), cpu::load8<F>(k, i + 8), a1);
  }
  for (; i + 8 <= d; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), cpu::load8<F>(k, i), a0);
  // The lanes summed pairwise, as _mm512_reduce_add_ps does: summed one after another, a score
  // of 512 products lost enough that an f32 softmax near a tie moved 1.9x further from float64
  // (Attention.CpuKernelIsAsCloseToFloat64AsTheAtenFormula).
  float sum = cpu::reduce_add8(_mm256_add_ps(a0, a1));
  for (; i < d; ++i) sum += q[i] * cpu::load(F, k, i);
  return sum;
}

template <FloatType F>
TORCHTPU_AVX2 void axpy_avx2(float p, const void* v, float* acc, int64_t d) {
  const __m256 pp = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pp, cpu::load8<F>(v, i), _mm256_loadu_ps(acc + i)));
  }
  for (; i < d; ++i) acc[i] += p * cpu::load(F, v, i);
}
#endif

// The kernel tier attend runs with.
enum class Tier { kPortable, kAvx2, kAvx512 };

// Scores, softmax and the weighted sum of v for one query row, in the formula's roundings.
template <FloatType F, Tier kTier>
void attend(const Row& r, std::vector<float>& q, std::vector<float>& probs,
            std::vector<float>& acc) {
  auto dot = [&](const void* k) {
#if defined(__x86_64__)
    if constexpr (kTier == Tier::kAvx512) return dot_avx512<F>(q.data(), k, r.d);
    if constexpr (kTier == Tier::kAvx2) return dot_avx2<F>(q.data(), k, r.d);
#endif
    return dot_portable<F>(q.data(), k, r.d);
  };
  auto axpy = [&](float p, const void* v) {
#if defined(__x86_64__)
    if constexpr (kTier == Tier::kAvx512) return axpy_avx512<F>(p, v, acc.data(), r.d);
    if constexpr (kTier == Tier::kAvx2) return axpy_avx2<F>(p, v, acc.data(), r.d);
#endif
    axpy_portable<F>(p, v, acc.data(), r.d);
  };
  const int64_t elem = F == FloatType::kFloat ? 4 : 2;
  auto row_of = [&](const void* base, int64_t s) {
    return static_cast<const char*>(base) + s * r.row_stride * elem;
  };
  q.resize(r.d);
  for (int64_t i = 0; i < r.d; ++i) q[i] = cpu::load(F, r.q, i);
  probs.resize(r.slots);
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < r.slots; ++s) {
    probs[s] = visible(r, s) ? cpu::round_to(F, dot(row_of(r.k, s))) : -INFINITY;
    top = std::max(top, probs[s]);
  }
  TORCH_CHECK_VALUE(top > -std::numeric_limits<float>::infinity(),
                    "attention: a query row at position ", r.position, " sees no key");
  float sum = 0.0f;
  for (int64_t s = 0; s < r.slots; ++s) {
    probs[s] = std::exp(probs[s] - top);
    sum += probs[s];
  }
  const float inv = 1.0f / sum;
  acc.assign(r.d, 0.0f);
  for (int64_t s = 0; s < r.slots; ++s) {
    const float p = cpu::round_to(F, probs[s] * inv);
    if (p != 0.0f) axpy(p, row_of(r.v, s));
  }
  for (int64_t i = 0; i < r.d; ++i) cpu::store(F, r.out, i, acc[i]);
}

at::Tensor attention_cpu(const at::Tensor& q_in, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& query_pos, const at::Tensor& key_pos, int64_t window) {
  check_shapes(q_in, k, v, query_pos, key_pos);
  const auto type = q_in.scalar_type();
  const bool fits = (type == at::kBFloat16 || type == at::kHalf || type == at::kFloat) &&
                    query_pos.size(1) <= kMaxFusedQueries && k.stride(3) == 1 && v.stride(3) == 1 &&
                    k.strides() == v.strides();
  if (!fits) {
    // Below the AVX-512 tier ATen's bf16 and f16 matmuls are slow (oneDNN needs AVX-512 for
    // them): a 512-token chunk's products ran at 2 GFLOP/s on Zen 3, 71% of reading it.
    const bool f32_products = type != at::kFloat && !cpu::use_avx512();
    return attention_formula(q_in, k, v, query_pos, key_pos, window, f32_products);
  }
  const auto q = q_in.contiguous();
  const auto qpos = query_pos.contiguous();
  const auto kpos = key_pos.contiguous();
  const int64_t B = q.size(0), kv_heads = q.size(1), R = q.size(2), d = q.size(3);
  const int64_t T = qpos.size(1), S = k.size(2);
  auto out = at::empty_like(q);
  const int64_t elem = q.element_size();
  const auto* q_base = static_cast<const char*>(q.data_ptr());
  const auto* k_base = static_cast<const char*>(k.data_ptr());
  const auto* v_base = static_cast<const char*>(v.data_ptr());
  auto* out_base = static_cast<char*>(out.data_ptr());
  const FloatType f = cpu::float_type(type);
  const Tier tier = cpu::use_avx512() ? Tier::kAvx512
                    : cpu::use_avx2() ? Tier::kAvx2
                                      : Tier::kPortable;
  // attend<F, kTier> for the runtime format and tier.
  auto attend_row = [&](const Row& r, std::vector<float>& qf, std::vector<float>& probs,
                        std::vector<float>& acc) {
    auto with_tier = [&]<FloatType F>() {
      switch (tier) {
        case Tier::kAvx512: return attend<F, Tier::kAvx512>(r, qf, probs, acc);
        case Tier::kAvx2: return attend<F, Tier::kAvx2>(r, qf, probs, acc);
        case Tier::kPortable: return attend<F, Tier::kPortable>(r, qf, probs, acc);
      }
    };
    switch (f) {
      case FloatType::kBFloat16: return with_tier.template operator()<FloatType::kBFloat16>();
      case FloatType::kHalf: return with_tier.template operator()<FloatType::kHalf>();
      case FloatType::kFloat: return with_tier.template operator()<FloatType::kFloat>();
    }
  };
  at::parallel_for(0, B * kv_heads * R, 1, [&](int64_t u0, int64_t u1) {
    std::vector<float> qf, probs, acc;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / (kv_heads * R), h = (u / R) % kv_heads, row = u % R;
      const int64_t kv_at = (b * k.stride(0) + h * k.stride(1)) * elem;
      const Row r{q_base + u * d * elem,
                  k_base + kv_at,
                  v_base + kv_at,
                  k.stride(2),
                  kpos.data_ptr<int64_t>() + b * S,
                  S,
                  qpos.data_ptr<int64_t>()[b * T + row % T],
                  window,
                  d,
                  out_base + u * d * elem};
      attend_row(r, qf, probs, acc);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor query_pos, Tensor key_pos, int window) -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(torchtpu, CompositeExplicitAutograd, m) {
  m.impl("attention", &attention_composite);
}

TORCH_LIBRARY_IMPL(torchtpu, CPU, m) { m.impl("attention", &attention_cpu); }

TORCH_LIBRARY_IMPL(torchtpu, Meta, m) { m.impl("attention", &attention_meta); }

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& query_pos, const at::Tensor& key_pos, int64_t window) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchtpu::attention", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(q, k, v, query_pos, key_pos, window);
}

}  // namespace torchtpu::ops
