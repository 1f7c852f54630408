#include "ops/dense_linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>

#include "common/cpu_float.h"

namespace torchtpu::ops {
namespace {

at::Tensor dense_linear_composite(const at::Tensor& x, const at::Tensor& w) {
  return at::linear(x, w);
}

// Where a tile's rows and outputs are: x [rows, k] and w [n, k] row-major, y [rows, n].
struct Operands {
  const float* x;
  const float* w;
  float* y;
  int64_t k, n;
};

// The inputs from `from` on (those short of a whole vector), one at a time, after `sum`.
float add_tail(float sum, const float* x, const float* w, int64_t from, int64_t k) {
  for (int64_t t = from; t < k; ++t) sum += x[t] * w[t];
  return sum;
}

// The portable tier: 8 partial sums per output (lane t % 8), reduced in reduce_add8's order.
void output_portable(const Operands& o, int64_t m, int64_t j) {
  const float* x = o.x + m * o.k;
  const float* w = o.w + j * o.k;
  float lane[8] = {};
  const int64_t whole = o.k / 8 * 8;
  for (int64_t c = 0; c < whole; c += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += x[c + l] * w[c + l];
  }
  float half[4], quarter[2];
  for (int l = 0; l < 4; ++l) half[l] = lane[l] + lane[l + 4];
  for (int l = 0; l < 2; ++l) quarter[l] = half[l] + half[l + 2];
  o.y[m * o.n + j] = add_tail(quarter[0] + quarter[1], x, w, whole, o.k);
}

#if defined(__x86_64__)

// R rows from m by J outputs from j: R·J accumulators of 8 lanes, an FMA each per 8 inputs.
template <int R, int J>
TORCHTPU_AVX2 void tile_avx2(const Operands& o, int64_t m, int64_t j) {
  __m256 acc[R][J];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < J; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const int64_t whole = o.k / 8 * 8;
  for (int64_t t = 0; t < whole; t += 8) {
    __m256 wv[J];
    for (int c = 0; c < J; ++c) wv[c] = _mm256_loadu_ps(o.w + (j + c) * o.k + t);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(o.x + (m + r) * o.k + t);
      for (int c = 0; c < J; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < J; ++c) {
      o.y[(m + r) * o.n + j + c] = add_tail(cpu::reduce_add8(acc[r][c]), o.x + (m + r) * o.k,
                                            o.w + (j + c) * o.k, whole, o.k);
    }
  }
}

// tile_avx2 with 16 lanes, reduced pairwise (_mm512_reduce_add_ps).
template <int R, int J>
TORCHTPU_AVX512 void tile_avx512(const Operands& o, int64_t m, int64_t j) {
  __m512 acc[R][J];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < J; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const int64_t whole = o.k / 16 * 16;
  for (int64_t t = 0; t < whole; t += 16) {
    __m512 wv[J];
    for (int c = 0; c < J; ++c) wv[c] = _mm512_loadu_ps(o.w + (j + c) * o.k + t);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(o.x + (m + r) * o.k + t);
      for (int c = 0; c < J; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < J; ++c) {
      o.y[(m + r) * o.n + j + c] = add_tail(_mm512_reduce_add_ps(acc[r][c]),
                                            o.x + (m + r) * o.k, o.w + (j + c) * o.k, whole, o.k);
    }
  }
}

// A tier's tile at run-time sizes r <= R, c <= J: the instantiation with those sizes.
template <int R, int J, template <int, int> typename Tile>
void tile_of(int r, int c, const Operands& o, int64_t m, int64_t j) {
  if constexpr (R > 1) {
    if (r < R) return tile_of<R - 1, J, Tile>(r, c, o, m, j);
  }
  if constexpr (J > 1) {
    if (c < J) return tile_of<R, J - 1, Tile>(r, c, o, m, j);
  }
  Tile<R, J>::run(o, m, j);
}

template <int R, int J>
struct Avx2Tile {
  static void run(const Operands& o, int64_t m, int64_t j) { tile_avx2<R, J>(o, m, j); }
};
template <int R, int J>
struct Avx512Tile {
  static void run(const Operands& o, int64_t m, int64_t j) { tile_avx512<R, J>(o, m, j); }
};

#endif

// Outputs [j0, j1) of every row, in tiles of the tier's rows by 4 outputs (AVX2: 3 x 4 = 12
// accumulators of its 16 registers; AVX-512: 6 x 4 of 32).
void outputs(const Operands& o, int64_t rows, int64_t j0, int64_t j1) {
  constexpr int kJ = 4;
#if defined(__x86_64__)
  if (cpu::use_avx2()) {
    const bool wide = cpu::use_avx512();
    const int tile_rows = wide ? 6 : 3;
    for (int64_t j = j0; j < j1; j += kJ) {
      const int c = static_cast<int>(std::min<int64_t>(kJ, j1 - j));
      for (int64_t m = 0; m < rows; m += tile_rows) {
        const int r = static_cast<int>(std::min<int64_t>(tile_rows, rows - m));
        if (wide) {
          tile_of<6, kJ, Avx512Tile>(r, c, o, m, j);
        } else {
          tile_of<3, kJ, Avx2Tile>(r, c, o, m, j);
        }
      }
    }
    return;
  }
#endif
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t m = 0; m < rows; ++m) output_portable(o, m, j);
  }
}

at::Tensor dense_linear_cpu(const at::Tensor& x_in, const at::Tensor& w_in) {
  if (x_in.scalar_type() != at::kFloat || w_in.scalar_type() != at::kFloat || w_in.dim() != 2 ||
      x_in.dim() == 0 || x_in.size(-1) != w_in.size(1) || x_in.numel() == 0 ||
      w_in.numel() == 0) {
    return dense_linear_composite(x_in, w_in);
  }
  const auto x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t k = w.size(1), n = w.size(0), rows = x.numel() / k;
  auto sizes = x.sizes().vec();
  sizes.back() = n;
  auto y = at::empty(sizes, x.options());
  const Operands o{x.data_ptr<float>(), w.data_ptr<float>(), y.data_ptr<float>(), k, n};
  // Threads split the outputs in runs of 4 (a tile's width), so that no tile is cut.
  const int64_t quads = (n + 3) / 4;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, rows * k));
  at::parallel_for(0, quads, grain, [&](int64_t q0, int64_t q1) {
    outputs(o, rows, q0 * 4, std::min(n, q1 * 4));
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) { m.def("dense_linear(Tensor x, Tensor w) -> Tensor"); }

// The composite serves Meta too (at::linear has Meta kernels).
TORCH_LIBRARY_IMPL(torchtpu, CompositeExplicitAutograd, m) {
  m.impl("dense_linear", &dense_linear_composite);
}

TORCH_LIBRARY_IMPL(torchtpu, CPU, m) { m.impl("dense_linear", &dense_linear_cpu); }

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchtpu::dense_linear", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(x, w);
}

}  // namespace torchtpu::ops
