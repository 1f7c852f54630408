#include "ops/rms_norm.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

#include "common/cpu_float.h"

namespace torchtpu::ops {
namespace {

at::Tensor rms_norm_composite(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                              double eps) {
  auto xf = x.to(at::kFloat);
  auto normed = xf * at::pow(xf.pow(2).mean(-1, /*keepdim=*/true) + eps, -0.5);
  if (weight) normed = normed * *weight;
  return normed.to(x.scalar_type());
}

// The scale of a row from its sum of squares, as ATen computes pow(mean + eps, -0.5): 1 / sqrt.
float row_scale(float sum, int64_t width, float eps) {
  return 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
}

template <typename T>
void rms_norm_rows(const T* x, const float* weight, float eps, int64_t width, int64_t r0,
                   int64_t r1, T* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* row = x + r * width;
    // Eight partial sums: vectorizable, and as exact as ATen's cascade sum at these widths.
    float partial[8] = {};
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const float v = static_cast<float>(row[i + j]);
        partial[j] += v * v;
      }
    }
    float sum = 0.0f;
    for (; i < width; ++i) sum += static_cast<float>(row[i]) * static_cast<float>(row[i]);
    for (float p : partial) sum += p;
    const float scale = row_scale(sum, width, eps);
    T* dst = out + r * width;
    for (int64_t k = 0; k < width; ++k) {
      float v = static_cast<float>(row[k]) * scale;
      if (weight) v *= weight[k];
      dst[k] = static_cast<T>(v);
    }
  }
}

#if defined(__x86_64__)
// rms_norm_rows with vectors: the eight partial sums are one 8-lane register, added in the same
// order, and every product is rounded as there, so the output has the same bits. 8 lanes serve the
// AVX-512 tier as well: rows are a few thousand values, read once.
template <cpu::FloatType F>
TORCHTPU_AVX2 void rms_norm_rows_avx2(const void* x, const float* weight, float eps,
                                      int64_t width, int64_t r0, int64_t r1, void* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t row = r * width;
    __m256 partial8 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= width; i += 8) {
      const __m256 v = cpu::load8<F>(x, row + i);
      partial8 = _mm256_add_ps(partial8, _mm256_mul_ps(v, v));
    }
    float partial[8];
    _mm256_storeu_ps(partial, partial8);
    float sum = 0.0f;
    for (; i < width; ++i) {
      const float v = cpu::load(F, x, row + i);
      sum += v * v;
    }
    for (float p : partial) sum += p;
    const float scale = row_scale(sum, width, eps);
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t k = 0;
    for (; k + 8 <= width; k += 8) {
      __m256 v = _mm256_mul_ps(cpu::load8<F>(x, row + k), vscale);
      if (weight) v = _mm256_mul_ps(v, _mm256_loadu_ps(weight + k));
      cpu::store8(F, out, row + k, v);
    }
    for (; k < width; ++k) {
      float v = cpu::load(F, x, row + k) * scale;
      if (weight) v *= weight[k];
      cpu::store(F, out, row + k, v);
    }
  }
}
#endif

at::Tensor rms_norm_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps) {
  const auto type = x.scalar_type();
  const int64_t width = x.size(-1);
  const bool fits = (type == at::kBFloat16 || type == at::kHalf || type == at::kFloat) &&
                    width > 0 &&
                    (!weight || (weight->scalar_type() == at::kFloat && weight->dim() == 1 &&
                                 weight->size(0) == width && weight->is_contiguous()));
  if (!fits) return rms_norm_composite(x, weight, eps);
  const auto in = x.contiguous();
  auto out = at::empty_like(in);
  const int64_t rows = in.numel() / width;
  const float* w = weight ? weight->data_ptr<float>() : nullptr;
  const auto e = static_cast<float>(eps);
  // Rows are short: a thread takes at least 64 of them.
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
#if defined(__x86_64__)
    if (cpu::use_avx2()) {
      const void* src = in.data_ptr();
      void* dst = out.data_ptr();
      switch (type) {
        case at::kBFloat16:
          return rms_norm_rows_avx2<cpu::FloatType::kBFloat16>(src, w, e, width, r0, r1, dst);
        case at::kHalf:
          return rms_norm_rows_avx2<cpu::FloatType::kHalf>(src, w, e, width, r0, r1, dst);
        default:
          return rms_norm_rows_avx2<cpu::FloatType::kFloat>(src, w, e, width, r0, r1, dst);
      }
    }
#endif
    switch (type) {
      case at::kBFloat16:
        rms_norm_rows(in.data_ptr<c10::BFloat16>(), w, e, width, r0, r1,
                      out.data_ptr<c10::BFloat16>());
        break;
      case at::kHalf:
        rms_norm_rows(in.data_ptr<c10::Half>(), w, e, width, r0, r1, out.data_ptr<c10::Half>());
        break;
      default:
        rms_norm_rows(in.data_ptr<float>(), w, e, width, r0, r1, out.data_ptr<float>());
        break;
    }
  });
  return out;
}

at::Tensor rms_norm_meta(const at::Tensor& x, const std::optional<at::Tensor>&, double) {
  return at::empty_like(x);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtpu, CompositeExplicitAutograd, m) {
  m.impl("rms_norm", &rms_norm_composite);
}

TORCH_LIBRARY_IMPL(torchtpu, CPU, m) { m.impl("rms_norm", &rms_norm_cpu); }

TORCH_LIBRARY_IMPL(torchtpu, Meta, m) { m.impl("rms_norm", &rms_norm_meta); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchtpu::rms_norm", "")
          .typed<at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&, double)>();
  std::optional<at::Tensor> w;
  if (weight.defined()) w = weight;
  return op.call(x, w, eps);
}

}  // namespace torchtpu::ops
