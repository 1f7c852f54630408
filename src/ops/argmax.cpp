#include "ops/argmax.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/cpu_float.h"

namespace torchtpu::ops {
namespace {

at::Tensor argmax_composite(const at::Tensor& x) { return at::argmax(x, -1); }

#if defined(__x86_64__)
// What a scan of one piece of a row found: its largest value and that value's first index, or,
// with `nan`, its first NaN's index.
struct Found {
  float value;
  int64_t index;
  bool nan;
};

// x[i0, i1) (i1 > i0) one value at a time.
Found scan_portable(const float* x, int64_t i0, int64_t i1) {
  Found best{x[i0], i0, false};
  for (int64_t i = i0; i < i1; ++i) {
    if (std::isnan(x[i])) return {x[i], i, true};
    if (x[i] > best.value) best = {x[i], i, false};
  }
  return best;
}

// A vector scan's `found` over [.., i) with x[i, i1) (the values short of a whole vector) after it.
Found with_tail(const Found& found, const float* x, int64_t i, int64_t i1) {
  if (i == i1) return found;
  const Found tail = scan_portable(x, i, i1);
  return tail.nan || tail.value > found.value ? tail : found;
}

// scan_portable with 16 lanes: each lane keeps its largest value and the first index it saw it
// at (a strictly greater value replaces it), so the smallest index among the lanes holding the
// maximum is the piece's first. A piece holding a NaN is scanned again for the first one.
// Indices are 32-bit offsets from i0: pieces are shorter than 2^31.
TORCHTPU_AVX512 Found scan_avx512(const float* x, int64_t i0, int64_t i1) {
  if (i1 - i0 < 16) return scan_portable(x, i0, i1);
  const __m512i step = _mm512_set1_epi32(16);
  __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 best = _mm512_loadu_ps(x + i0);
  __m512i best_index = index;
  __mmask16 nan = _mm512_cmp_ps_mask(best, best, _CMP_UNORD_Q);
  int64_t i = i0 + 16;
  for (; i + 16 <= i1; i += 16) {
    index = _mm512_add_epi32(index, step);
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, greater, v);
    best_index = _mm512_mask_mov_epi32(best_index, greater, index);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  if (nan) return scan_portable(x, i0, i1);
  const float top = _mm512_reduce_max_ps(best);
  const __mmask16 at_top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ);
  Found found{top, i0 + _mm512_mask_reduce_min_epi32(at_top, best_index), false};
  return with_tail(found, x, i, i1);
}

// scan_avx512 with 8 lanes.
TORCHTPU_AVX2 Found scan_avx2(const float* x, int64_t i0, int64_t i1) {
  if (i1 - i0 < 8) return scan_portable(x, i0, i1);
  const __m256i step = _mm256_set1_epi32(8);
  __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 best = _mm256_loadu_ps(x + i0);
  __m256i best_index = index;
  __m256 nan = _mm256_cmp_ps(best, best, _CMP_UNORD_Q);
  int64_t i = i0 + 8;
  for (; i + 8 <= i1; i += 8) {
    index = _mm256_add_epi32(index, step);
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 greater = _mm256_cmp_ps(v, best, _CMP_GT_OQ);
    best = _mm256_blendv_ps(best, v, greater);
    best_index = _mm256_blendv_epi8(best_index, index, _mm256_castps_si256(greater));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  if (_mm256_movemask_ps(nan)) return scan_portable(x, i0, i1);
  __m128 top = _mm_max_ps(_mm256_castps256_ps128(best), _mm256_extractf128_ps(best, 1));
  top = _mm_max_ps(top, _mm_movehl_ps(top, top));
  top = _mm_max_ss(top, _mm_movehdup_ps(top));
  const float value = _mm_cvtss_f32(top);
  // The lanes not at the maximum take the largest index, so the smallest is the first at it.
  const __m256 at_top = _mm256_cmp_ps(best, _mm256_set1_ps(value), _CMP_EQ_OQ);
  const __m256i candidates = _mm256_blendv_epi8(_mm256_set1_epi32(INT32_MAX), best_index,
                                                _mm256_castps_si256(at_top));
  __m128i first = _mm_min_epi32(_mm256_castsi256_si128(candidates),
                                _mm256_extracti128_si256(candidates, 1));
  first = _mm_min_epi32(first, _mm_shuffle_epi32(first, _MM_SHUFFLE(1, 0, 3, 2)));
  first = _mm_min_epi32(first, _mm_shuffle_epi32(first, _MM_SHUFFLE(2, 3, 0, 1)));
  return with_tail({value, i0 + _mm_cvtsi128_si32(first), false}, x, i, i1);
}

// The running tier's scan.
Found scan(const float* x, int64_t i0, int64_t i1) {
  return cpu::use_avx512() ? scan_avx512(x, i0, i1) : scan_avx2(x, i0, i1);
}
#endif

at::Tensor argmax_cpu(const at::Tensor& x_in) {
  if (x_in.scalar_type() != at::kFloat || x_in.dim() == 0 || x_in.size(-1) == 0 ||
      !cpu::use_avx2()) {
    return argmax_composite(x_in);
  }
#if defined(__x86_64__)
  const auto x = x_in.contiguous();
  const int64_t width = x.size(-1), rows = x.numel() / width;
  // Pieces of about 32 Ki values, so that one row of logits keeps every thread busy too.
  const int64_t pieces = (width + 32767) / 32768;
  std::vector<Found> found(rows * pieces);
  const float* data = x.data_ptr<float>();
  at::parallel_for(0, rows * pieces, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / pieces, j = t % pieces;
      found[t] = scan(data + r * width, width * j / pieces, width * (j + 1) / pieces);
    }
  });
  auto out = at::empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(at::kLong));
  auto* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    Found best = found[r * pieces];
    for (int64_t j = 1; j < pieces && !best.nan; ++j) {
      const Found& next = found[r * pieces + j];
      if (next.nan || next.value > best.value) best = next;
    }
    o[r] = best.index;
  }
  return out;
#else
  return argmax_composite(x_in);
#endif
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) { m.def("argmax_last(Tensor x) -> Tensor"); }

// The composite serves Meta too (ATen's argmax has a Meta kernel).
TORCH_LIBRARY_IMPL(torchtpu, CompositeExplicitAutograd, m) {
  m.impl("argmax_last", &argmax_composite);
}

TORCH_LIBRARY_IMPL(torchtpu, CPU, m) { m.impl("argmax_last", &argmax_cpu); }

at::Tensor argmax_last(const at::Tensor& x) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchtpu::argmax_last", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(x);
}

}  // namespace torchtpu::ops
