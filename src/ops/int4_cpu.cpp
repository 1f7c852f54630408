#include "ops/int4_cpu.h"

#include <algorithm>
#include <cmath>

#include "common/cpu_float.h"

namespace torchtpu::ops::int4_cpu {
namespace {

using cpu::FloatType;

// Round to nearest even for |v| < 2^22 by the float adder itself (a libm call per value costs more
// than the whole dot product of its block): adding 1.5·2^23 leaves no fraction bits.
float round_even(float v) {
  const float shifted = v + 12582912.0f;
  return shifted - 12582912.0f;
}

uint8_t nibble(const uint8_t* sub, int64_t row, int64_t kk) {
  const int64_t t = row / 16, j = row % 16, c = kk / 8, i = kk % 8;
  const uint8_t byte = sub[((t * 4 + c) * 16 + j) * 4 + (i % 4)];
  return i < 4 ? (byte & 0xF) : (byte >> 4);
}

void gemv_portable(const BlockWeights& w, const QuantizedRows& a, int64_t b0, int64_t b1,
                   const Output& y) {
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  const int64_t per_group = w.group_size / kSubK;
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t m = 0; m < a.rows; ++m) {
      for (int64_t r = 0; r < kBlockRows; ++r) {
        float acc = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t at = (b * groups + g) * kBlockRows + r;
          const float zero = w.zero ? w.zero[at] : 8.0f;
          float part = 0.0f;
          for (int64_t s = 0; s < per_group; ++s) {
            const int64_t kb = g * per_group + s;
            const uint8_t* sub = w.nibbles + (b * kb_count + kb) * kSubBytes;
            int32_t i1 = 0, i2 = 0;
            for (int64_t kk = 0; kk < kSubK; ++kk) {
              const int32_t u = nibble(sub, r, kk);
              i1 += u * a.hi[m * a.k + kb * kSubK + kk];
              if (a.lo) i2 += u * a.lo[m * a.k + kb * kSubK + kk];
            }
            const int64_t ai = m * kb_count + kb;
            const float f1 = static_cast<float>(i1) - zero * a.sum_hi[ai];
            if (a.lo) {
              const float f2 = static_cast<float>(i2) - zero * a.sum_lo[ai];
              part += f1 * a.d[ai] + f2 * a.d_lo[ai];
            } else {
              part += f1 * a.d[ai];
            }
          }
          acc += part * cpu::load(w.scale_type, w.scale, at);
        }
        if (b * kBlockRows + r < y.columns)
          cpu::store(y.type, y.data, m * y.ld + b * kBlockRows + r, acc);
      }
    }
  }
}

void dequantize_portable(const BlockWeights& w, int64_t b0, int64_t b1, int64_t out_rows,
                         bool out_bf16, void* out) {
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  for (int64_t b = b0; b < b1; ++b) {
    for (int64_t r = 0; r < kBlockRows && b * kBlockRows + r < out_rows; ++r) {
      const int64_t row = b * kBlockRows + r;
      for (int64_t k = 0; k < w.k; ++k) {
        const int64_t kb = k / kSubK, g = k / w.group_size;
        const int64_t at = (b * groups + g) * kBlockRows + r;
        const float zero = w.zero ? w.zero[at] : 8.0f;
        const uint8_t* sub = w.nibbles + (b * kb_count + kb) * kSubBytes;
        const float scale = cpu::load(w.scale_type, w.scale, at);
        const float v = cpu::round_to(
            w.scale_type, (static_cast<float>(nibble(sub, r, k % kSubK)) - zero) * scale);
        cpu::store(out_bf16 ? FloatType::kBFloat16 : FloatType::kFloat, out, row * w.k + k, v);
      }
    }
  }
}

// Each block's statistics from its hi and lo values (sums as exact floats and as the symmetric
// zero point's int32 share), shared by both quantizers.
void block_sums(const QuantizedRows& a, int64_t at, float step, int32_t s1, int32_t s2) {
  a.d[at] = step;
  a.sum_hi[at] = static_cast<float>(s1);
  a.hi_start[at] = -8 * s1;
  if (a.lo) {
    a.d_lo[at] = step / 254.0f;
    a.sum_lo[at] = static_cast<float>(s2);
    a.lo_start[at] = -8 * s2;
  }
}

void quantize_rows_portable(const void* x, FloatType type, const QuantizedRows& a) {
  const int64_t k = a.k, blocks = k / kSubK;
  for (int64_t m = 0; m < a.rows; ++m) {
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t at = m * blocks + kb, off = m * k + kb * kSubK;
      float xb[kSubK];
      for (int64_t i = 0; i < kSubK; ++i) xb[i] = cpu::load(type, x, off + i);
      float amax = 0.0f;
      for (int64_t i = 0; i < kSubK; ++i) amax = std::max(amax, std::fabs(xb[i]));
      if (amax == 0.0f) {
        std::fill(a.hi + off, a.hi + off + kSubK, 0);
        if (a.lo) std::fill(a.lo + off, a.lo + off + kSubK, 0);
        block_sums(a, at, 0.0f, 0, 0);
        continue;
      }
      const float step = amax / 127.0f, inv = 127.0f / amax;
      int32_t s1 = 0, s2 = 0;
      for (int64_t i = 0; i < kSubK; ++i) {
        const float q1 = std::clamp(round_even(xb[i] * inv), -127.0f, 127.0f);
        a.hi[off + i] = static_cast<int8_t>(q1);
        s1 += a.hi[off + i];
        if (a.lo) {
          const float rest = xb[i] - q1 * step;
          const float q2 = std::clamp(round_even(rest * inv * 254.0f), -127.0f, 127.0f);
          a.lo[off + i] = static_cast<int8_t>(q2);
          s2 += a.lo[off + i];
        }
      }
      block_sums(a, at, step, s1, s2);
    }
  }
}

#if defined(__x86_64__)

TORCHTPU_AVX512 __m512 load_zeros(const uint8_t* zero, int64_t at) {
  if (!zero) return _mm512_set1_ps(8.0f);
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(zero + at))));
}

// Stores 16 results of row m from column `column` on, those below y.columns.
TORCHTPU_AVX512 void store_tile(const Output& y, int64_t m, int64_t column, __m512 v) {
  const int64_t n = std::min<int64_t>(16, y.columns - column);
  if (n <= 0) return;
  cpu::store16(y.type, y.data, m * y.ld + column, v, static_cast<__mmask16>((1u << n) - 1));
}

// Prefetch distance in bytes along the nibble stream (measured best of 1-16 KiB on this CPU kind,
// 4 KiB: +40% over none, the hardware prefetcher alone stops at page boundaries).
constexpr int64_t kPrefetchAhead = 4 * kSubBytes;

// Asks for the nibbles kPrefetchAhead bytes on from sub-block `sub`.
inline void prefetch_ahead(const uint8_t* sub) {
  for (int64_t p = 0; p < kSubBytes; p += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(sub + kPrefetchAhead + p), _MM_HINT_T0);
  }
}

// The zero points less the symmetric 8 that the int32 sums already took off (a.hi_start): what
// the f32 epilogue still subtracts for asymmetric weights.
TORCHTPU_AVX512 inline __m512 zero_rest(const uint8_t* zero, int64_t at) {
  return _mm512_sub_ps(load_zeros(zero, at), _mm512_set1_ps(8.0f));
}

// The f32 epilogue of every kernel, one tile of one row and sub-block: its int32 sums against the
// activations' hi and lo parts (i1, i2; i2 only when kLo), started at a.hi_start / a.lo_start,
// less what asymmetric zero points still take (zero_rest; nothing when kSymmetric), times the
// activations' steps (row and sub-block `ai` of `a`) and the weights' scales, added to acc. The
// integers are exact in f32 whichever way the zero point is taken off, and every kernel calling
// this one is what gives a row the same bits whichever kernel takes it.
template <bool kLo, bool kSymmetric>
TORCHTPU_AVX512 inline __m512 accumulate(__m512 acc, __m512i i1, __m512i i2, __m512 zero_rest,
                                         __m512 scale, const QuantizedRows& a, int64_t ai) {
  __m512 f1 = _mm512_cvtepi32_ps(i1);
  if constexpr (!kSymmetric) f1 = _mm512_fnmadd_ps(zero_rest, _mm512_set1_ps(a.sum_hi[ai]), f1);
  const __m512 hi = _mm512_mul_ps(f1, _mm512_set1_ps(a.d[ai]));
  if constexpr (!kLo) {
    return _mm512_fmadd_ps(hi, scale, acc);
  } else {
    __m512 f2 = _mm512_cvtepi32_ps(i2);
    if constexpr (!kSymmetric) {
      f2 = _mm512_fnmadd_ps(zero_rest, _mm512_set1_ps(a.sum_lo[ai]), f2);
    }
    return _mm512_fmadd_ps(_mm512_fmadd_ps(f2, _mm512_set1_ps(a.d_lo[ai]), hi), scale, acc);
  }
}

// A thread's blocks [b0, b1) as two streams from DRAM, its first half alongside its second half
// (measured 1 thread: 10.8 GB/s with one stream, 13.5 with two): kernel(blocks) for each pair,
// then for the odd one out.
template <typename Kernel>
void for_block_pairs(int64_t b0, int64_t b1, Kernel&& kernel) {
  const int64_t half = (b1 - b0) / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t pair[2] = {b0 + i, b0 + half + i};
    kernel(pair);
  }
  if ((b1 - b0) % 2) {
    const int64_t last[1] = {b1 - 1};
    kernel(last);
  }
}

// The one row of activations of `a` (several go through gemv_blocks_rows) against N blocks at
// once, sub-block by sub-block. Per block, the 4 tiles' 8 (4 without lo parts) int32 accumulators
// are independent, so the vpdpbusd latency chains overlap.
template <FloatType S, int N, bool kLo, bool kSym>
TORCHTPU_AVX512 void gemv_blocks_row(const BlockWeights& w, const QuantizedRows& a,
                                     const int64_t (&b)[N], const Output& y) {
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  const int64_t per_group = w.group_size / kSubK;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[N][4];
  for (int n = 0; n < N; ++n) {
    for (int t = 0; t < 4; ++t) acc[n][t] = _mm512_setzero_ps();
  }
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    const auto* ah = reinterpret_cast<const int32_t*>(a.hi + kb * kSubK);
    const auto* al = reinterpret_cast<const int32_t*>(kLo ? a.lo + kb * kSubK : nullptr);
    for (int n = 0; n < N; ++n) {
      const uint8_t* sub = w.nibbles + (b[n] * kb_count + kb) * kSubBytes;
      prefetch_ahead(sub);
      __m512i i1[4], i2[4];
      for (int t = 0; t < 4; ++t) {
        i1[t] = _mm512_set1_epi32(a.hi_start[kb]);
        i2[t] = kLo ? _mm512_set1_epi32(a.lo_start[kb]) : _mm512_setzero_si512();
      }
      for (int c = 0; c < 4; ++c) {
        const __m512i h0 = _mm512_set1_epi32(ah[2 * c]), h1 = _mm512_set1_epi32(ah[2 * c + 1]);
        for (int t = 0; t < 4; ++t) {
          const __m512i x = _mm512_loadu_si512(sub + (t * 4 + c) * 64);
          const __m512i lo = _mm512_and_si512(x, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
          i1[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(i1[t], lo, h0), hi, h1);
          if constexpr (kLo) {
            i2[t] = _mm512_dpbusd_epi32(
                _mm512_dpbusd_epi32(i2[t], lo, _mm512_set1_epi32(al[2 * c])), hi,
                _mm512_set1_epi32(al[2 * c + 1]));
          }
        }
      }
      const int64_t at = (b[n] * groups + kb / per_group) * kBlockRows;
      for (int t = 0; t < 4; ++t) {
        const __m512 zero = kSym ? _mm512_setzero_ps() : zero_rest(w.zero, at + 16 * t);
        acc[n][t] = accumulate<kLo, kSym>(acc[n][t], i1[t], i2[t], zero,
                                          cpu::load16<S>(w.scale, at + 16 * t), a, kb);
      }
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int t = 0; t < 4; ++t) store_tile(y, 0, b[n] * kBlockRows + 16 * t, acc[n][t]);
  }
}

// acc + vpdpbusd(w, the dword at `a` in every lane), the dword read by the instruction itself (an
// embedded broadcast), which GCC 12 does not fold from _mm512_set1_epi32: one instruction, no
// vector register, nothing for the optimizer to share between tiles and spill. Measured in L2 on
// Zen 4 against the intrinsics, 8-bit activations: 2 rows 40 -> 33 µs, 8 rows 115 -> 113.
TORCHTPU_AVX512 inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int32_t* a) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*a));
  return acc;
}

// Several rows at once with VNNI, for CPUs without AMX (and 2-3 rows on those with it): each
// 64 bytes of weights is unpacked once for every row; a row's int32 sums are gemv_blocks_row's and
// its epilogue is `accumulate`, sub-block after sub-block as there, so each row gets the bits it
// gets alone.
//
// One weight tile (16 outputs) of block `block` for rows [M0, M0 + G), over all of k: their G f32
// sums and 2·G int32 sums (G without lo parts) stay in registers across the sub-blocks, which
// holds up to 5 rows with lo parts and 8 without (measured in L2 when the f32 sums lived in
// memory: 6 rows with lo parts spilled, 1.3x slower per row), and it must be inlined (called, 4
// rows were 1.13x slower then). With kPrefetch it asks for the same tile of the next block (one
// block's bytes on) into L2: a block's four passes, each reading a quarter of every sub-block,
// then find it there, and the weights come from DRAM at one pace through all of them rather than
// in the first pass's burst.
template <FloatType S, int M0, int G, bool kLo, bool kSym, bool kPrefetch>
TORCHTPU_AVX512 __attribute__((always_inline)) inline void tile_rows(const BlockWeights& w,
                                                                     const QuantizedRows& a,
                                                                     int64_t block, int t,
                                                                     const Output& y) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  const int64_t per_group = w.group_size / kSubK;
  const uint8_t* tiles = w.nibbles + block * kb_count * kSubBytes + t * 256;
  __m512 acc[G];
  for (int m = 0; m < G; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    const uint8_t* tile = tiles + kb * kSubBytes;
    if constexpr (kPrefetch) {
      for (int p = 0; p < 256; p += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(tile + kb_count * kSubBytes + p), _MM_HINT_T1);
      }
    }
    __m512i i1[G], i2[G];
    for (int m = 0; m < G; ++m) {
      i1[m] = _mm512_set1_epi32(a.hi_start[(M0 + m) * kb_count + kb]);
      i2[m] = kLo ? _mm512_set1_epi32(a.lo_start[(M0 + m) * kb_count + kb])
                  : _mm512_setzero_si512();
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i x = _mm512_loadu_si512(tile + c * 64);
      const __m512i lo = _mm512_and_si512(x, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
      for (int m = 0; m < G; ++m) {
        const int64_t off = (M0 + m) * a.k + kb * kSubK;
        const auto* ah = reinterpret_cast<const int32_t*>(a.hi + off);
        i1[m] = dpbusd_broadcast(dpbusd_broadcast(i1[m], lo, ah + 2 * c), hi, ah + 2 * c + 1);
        if constexpr (kLo) {
          const auto* al = reinterpret_cast<const int32_t*>(a.lo + off);
          i2[m] = dpbusd_broadcast(dpbusd_broadcast(i2[m], lo, al + 2 * c), hi, al + 2 * c + 1);
        }
      }
    }
    const int64_t at = (block * groups + kb / per_group) * kBlockRows + 16 * t;
    const __m512 zero = kSym ? _mm512_setzero_ps() : zero_rest(w.zero, at);
    const __m512 scale = cpu::load16<S>(w.scale, at);
    for (int m = 0; m < G; ++m) {
      acc[m] = accumulate<kLo, kSym>(acc[m], i1[m], i2[m], zero, scale, a,
                                     (M0 + m) * kb_count + kb);
    }
  }
  for (int m = 0; m < G; ++m) store_tile(y, M0 + m, block * kBlockRows + 16 * t, acc[m]);
}

// R rows (2 to 8) against N blocks, tile after tile; more than 5 rows with lo parts go through
// each tile in two groups, the second meeting the weights in L2.
template <FloatType S, int N, int R, bool kLo, bool kSym>
TORCHTPU_AVX512 void gemv_blocks_rows(const BlockWeights& w, const QuantizedRows& a,
                                      const int64_t (&b)[N], const Output& y) {
  constexpr int kFirst = !kLo || R <= 5 ? R : (R + 1) / 2;
  for (int n = 0; n < N; ++n) {
    for (int t = 0; t < 4; ++t) {
      tile_rows<S, 0, kFirst, kLo, kSym, true>(w, a, b[n], t, y);
      if constexpr (R > kFirst) {
        tile_rows<S, kFirst, R - kFirst, kLo, kSym, false>(w, a, b[n], t, y);
      }
    }
  }
}

// Calls kernel.template operator()<S, R, kLo, kSym>() with w's scale format, a's row count (1 to
// kMaxRows), whether a has lo parts and whether w is symmetric as compile-time arguments.
template <typename Kernel>
void with_shape(const BlockWeights& w, const QuantizedRows& a, Kernel&& kernel) {
  auto rows = [&]<FloatType S, bool kLo, bool kSym>() {
    switch (a.rows) {
      case 1: return kernel.template operator()<S, 1, kLo, kSym>();
      case 2: return kernel.template operator()<S, 2, kLo, kSym>();
      case 3: return kernel.template operator()<S, 3, kLo, kSym>();
      case 4: return kernel.template operator()<S, 4, kLo, kSym>();
      case 5: return kernel.template operator()<S, 5, kLo, kSym>();
      case 6: return kernel.template operator()<S, 6, kLo, kSym>();
      case 7: return kernel.template operator()<S, 7, kLo, kSym>();
      default: return kernel.template operator()<S, kMaxRows, kLo, kSym>();
    }
  };
  auto kinds = [&]<FloatType S>() {
    if (a.lo) {
      if (w.zero) return rows.template operator()<S, true, false>();
      return rows.template operator()<S, true, true>();
    }
    if (w.zero) return rows.template operator()<S, false, false>();
    return rows.template operator()<S, false, true>();
  };
  switch (w.scale_type) {
    case FloatType::kBFloat16: return kinds.template operator()<FloatType::kBFloat16>();
    case FloatType::kHalf: return kinds.template operator()<FloatType::kHalf>();
    case FloatType::kFloat: return kinds.template operator()<FloatType::kFloat>();
  }
}

void gemv_avx512(const BlockWeights& w, const QuantizedRows& a, int64_t b0, int64_t b1,
                 const Output& y) {
  with_shape(w, a, [&]<FloatType S, int R, bool kLo, bool kSym>() {
    for_block_pairs(b0, b1, [&]<int N>(const int64_t (&blocks)[N]) {
      if constexpr (R == 1) {
        gemv_blocks_row<S, N, kLo, kSym>(w, a, blocks, y);
      } else {
        gemv_blocks_rows<S, N, R, kLo, kSym>(w, a, blocks, y);
      }
    });
  });
}

#define TORCHTPU_AMX                                                                    \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma,amx-tile,amx-int8")))

// Several rows at once through AMX. A sub-block of weights is unpacked to bytes once, and each of
// its four 16-output tiles meets every row's hi and lo parts in one tdpbsud (signed activation
// bytes times unsigned weight bytes: the int32 sums vpdpbusd makes), so a row costs only the f32
// epilogue, `accumulate` as in the VNNI kernels, so each row gets the bits it gets alone.
//
// Tiles 0 and 1 hold the rows' hi parts and then their lo parts for one sub-block (2·rows × 32
// bytes, even and odd sub-blocks), 2 and 3 a weight tile as bytes (8 rows of 4 inputs × 16
// outputs), 4 to 7 the sums of the sub-block's four weight tiles (2·rows × 16 int32).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TORCHTPU_AMX void configure_tiles(int64_t rows) {
  TileConfig config;
  for (int i = 0; i < 8; ++i) {
    config.rows[i] = static_cast<uint8_t>(i == 2 || i == 3 ? 8 : 2 * rows);
    config.colsb[i] = i < 2 ? 32 : 64;
  }
  _tile_loadconfig(&config);
}

// Weight tile t of a sub-block as bytes: row 2c the low nibbles of chunk c (inputs 8c..8c+3 of
// its 16 outputs), row 2c + 1 the high ones (8c+4..8c+7), so the rows run in input order.
TORCHTPU_AMX inline void unpack_sub_block(const uint8_t* sub, uint8_t (*unpacked)[8][64]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  prefetch_ahead(sub);
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < 4; ++c) {
      const __m512i x = _mm512_loadu_si512(sub + (t * 4 + c) * 64);
      _mm512_store_si512(unpacked[t][2 * c], _mm512_and_si512(x, low4));
      _mm512_store_si512(unpacked[t][2 * c + 1], _mm512_and_si512(_mm512_srli_epi16(x, 4), low4));
    }
  }
}

// Activation tile A (0 or 1) times a sub-block's four unpacked weight tiles, into tiles 4 to 7;
// TORCHTPU_STORE_SUMS stores those to sums[t]. Macros, not functions: GCC's AMX intrinsics paste
// tile numbers, which must be literals, into the assembly. Their loads name no memory, hence the
// compiler barrier before them.
#define TORCHTPU_MULTIPLY_SUB_BLOCK(A, unpacked) \
  do {                                                 \
    asm volatile("" ::: "memory");                     \
    _tile_loadd(2, unpacked[0], 64);                   \
    _tile_zero(4);                                     \
    _tile_dpbsud(4, A, 2);                             \
    _tile_loadd(3, unpacked[1], 64);                   \
    _tile_zero(5);                                     \
    _tile_dpbsud(5, A, 3);                             \
    _tile_loadd(2, unpacked[2], 64);                   \
    _tile_zero(6);                                     \
    _tile_dpbsud(6, A, 2);                             \
    _tile_loadd(3, unpacked[3], 64);                   \
    _tile_zero(7);                                     \
    _tile_dpbsud(7, A, 3);                             \
  } while (0)
#define TORCHTPU_STORE_SUMS(sums)  \
  do {                             \
    _tile_stored(4, sums[0], 64);  \
    _tile_stored(5, sums[1], 64);  \
    _tile_stored(6, sums[2], 64);  \
    _tile_stored(7, sums[3], 64);  \
  } while (0)

// The f32 epilogue of sub-block kb of `block` for every row: sums[t][m] is row m's hi sum for
// tile t, sums[t][rows + m] its lo sum, both from zero (the tiles' start), so a.hi_start and
// a.lo_start are added here.
template <FloatType S>
TORCHTPU_AMX inline void accumulate_sub_block(const BlockWeights& w, const QuantizedRows& a,
                                              int64_t block, int64_t kb,
                                              const int32_t (*sums)[2 * kMaxRows][16],
                                              float (*acc)[kBlockRows]) {
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  const int64_t at = (block * groups + kb / (w.group_size / kSubK)) * kBlockRows;
  __m512 zero[4], scale[4];
  for (int t = 0; t < 4; ++t) {
    zero[t] = zero_rest(w.zero, at + 16 * t);
    scale[t] = cpu::load16<S>(w.scale, at + 16 * t);
  }
  for (int64_t m = 0; m < a.rows; ++m) {
    const int64_t ai = m * kb_count + kb;
    const __m512i hi_start = _mm512_set1_epi32(a.hi_start[ai]);
    const __m512i lo_start = _mm512_set1_epi32(a.lo_start[ai]);
    for (int t = 0; t < 4; ++t) {
      float* out = acc[m] + 16 * t;
      const __m512i i1 = _mm512_add_epi32(_mm512_load_si512(sums[t][m]), hi_start);
      const __m512i i2 = _mm512_add_epi32(_mm512_load_si512(sums[t][a.rows + m]), lo_start);
      const __m512 sum = w.zero ? accumulate<true, false>(_mm512_load_ps(out), i1, i2, zero[t],
                                                          scale[t], a, ai)
                                : accumulate<true, true>(_mm512_load_ps(out), i1, i2, zero[t],
                                                         scale[t], a, ai);
      _mm512_store_ps(out, sum);
    }
  }
}

// N blocks side by side (N streams from DRAM, as gemv_blocks_row), software-pipelined over the
// steps (sub-block kb, block n): while the tiles multiply step s, the vector units unpack step
// s + 1 and run the epilogue of step s - kLag. Loads behind a pending tile store wait for it, so
// step s's sums are stored only after that epilogue, and the epilogue reads sums stored kLag
// steps before: storing first made 2-8 rows 1.7-1.9x slower, a lag of 1 instead of 3 made 2 rows
// 1.5-1.9x slower (measured on E2B shapes).
constexpr int64_t kLag = 3;

template <FloatType S, int N>
TORCHTPU_AMX void gemv_blocks_amx(const BlockWeights& w, const QuantizedRows& a,
                                  const int64_t (&b)[N], const Output& y) {
  const int64_t kb_count = w.k / kSubK, steps = kb_count * N;
  alignas(64) uint8_t unpacked[2][4][8][64];
  alignas(64) int32_t sums[kLag + 1][4][2 * kMaxRows][16];
  alignas(64) float acc[N][kMaxRows][kBlockRows];
  for (int n = 0; n < N; ++n) {
    for (int64_t m = 0; m < a.rows; ++m) std::fill(acc[n][m], acc[n][m] + kBlockRows, 0.0f);
  }
  auto sub_block = [&](int64_t step) {
    return w.nibbles + (b[step % N] * kb_count + step / N) * kSubBytes;
  };
  unpack_sub_block(sub_block(0), unpacked[0]);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t kb = s / N;
    if (kb % 2) {
      if (s % N == 0) _tile_loadd(1, a.hi + kb * kSubK, a.k);
      TORCHTPU_MULTIPLY_SUB_BLOCK(1, unpacked[s % 2]);
    } else {
      if (s % N == 0) _tile_loadd(0, a.hi + kb * kSubK, a.k);
      TORCHTPU_MULTIPLY_SUB_BLOCK(0, unpacked[s % 2]);
    }
    if (s + 1 < steps) unpack_sub_block(sub_block(s + 1), unpacked[(s + 1) % 2]);
    if (s >= kLag) {
      const int64_t e = s - kLag;
      accumulate_sub_block<S>(w, a, b[e % N], e / N, sums[e % (kLag + 1)], acc[e % N]);
    }
    TORCHTPU_STORE_SUMS(sums[s % (kLag + 1)]);
  }
  for (int64_t e = std::max<int64_t>(0, steps - kLag); e < steps; ++e) {
    accumulate_sub_block<S>(w, a, b[e % N], e / N, sums[e % (kLag + 1)], acc[e % N]);
  }
  for (int n = 0; n < N; ++n) {
    for (int64_t m = 0; m < a.rows; ++m) {
      for (int t = 0; t < 4; ++t) {
        store_tile(y, m, b[n] * kBlockRows + 16 * t, _mm512_load_ps(acc[n][m] + 16 * t));
      }
    }
  }
}

#undef TORCHTPU_MULTIPLY_SUB_BLOCK
#undef TORCHTPU_STORE_SUMS

// for_block_pairs' two streams per thread, every row at once. The activation tiles read hi and lo
// as one matrix: lo must follow hi directly.
template <FloatType S>
TORCHTPU_AMX void gemv_amx(const BlockWeights& w, const QuantizedRows& a, int64_t b0, int64_t b1,
                           const Output& y) {
  configure_tiles(a.rows);
  for_block_pairs(b0, b1, [&]<int N>(const int64_t (&blocks)[N]) {
    gemv_blocks_amx<S, N>(w, a, blocks, y);
  });
  _tile_release();
}

// One row of one sub-block: 32 values from the 16 bytes that lane j holds across the 4 chunks.
TORCHTPU_AVX512 void dequantize_row_avx512(const BlockWeights& w, const uint8_t* tile, int j,
                                           float zero, float scale, bool out_bf16, void* out) {
  const auto* words = reinterpret_cast<const int32_t*>(tile);
  const __m128i x = _mm_set_epi32(words[3 * 16 + j], words[2 * 16 + j], words[16 + j], words[j]);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(x, low4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), low4);
  // Dword c of lo holds inputs 8c..8c+3, of hi 8c+4..8c+7: interleaving dwords gives input order.
  const __m128i first = _mm_unpacklo_epi32(lo, hi), second = _mm_unpackhi_epi32(lo, hi);
  const __m512 z = _mm512_set1_ps(zero), s = _mm512_set1_ps(scale);
  for (int half = 0; half < 2; ++half) {
    const __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(half ? second : first));
    __m512 v = cpu::round16(w.scale_type, _mm512_mul_ps(_mm512_sub_ps(u, z), s));
    cpu::store16(out_bf16 ? FloatType::kBFloat16 : FloatType::kFloat, out, 16 * half, v);
  }
}

// The loop of the vector dequantizers: row(w, tile, j, zero, scale, out_bf16, dst) writes row j
// of `tile`'s 16 for one sub-block, its 32 values.
template <typename Row>
void for_each_dequantized_row(const BlockWeights& w, int64_t b0, int64_t b1, int64_t out_rows,
                              bool out_bf16, void* out, Row row) {
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  const int64_t per_group = w.group_size / kSubK;
  const int64_t elem = out_bf16 ? 2 : 4;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t rows = std::min(kBlockRows, out_rows - b * kBlockRows);
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t at = (b * groups + kb / per_group) * kBlockRows;
      const uint8_t* sub = w.nibbles + (b * kb_count + kb) * kSubBytes;
      for (int64_t r = 0; r < rows; ++r) {
        const float zero = w.zero ? w.zero[at + r] : 8.0f;
        auto* dst = static_cast<char*>(out) + ((b * kBlockRows + r) * w.k + kb * kSubK) * elem;
        row(w, sub + (r / 16) * 256, static_cast<int>(r % 16), zero,
            cpu::load(w.scale_type, w.scale, at + r), out_bf16, dst);
      }
    }
  }
}

// quantize_rows_portable with 16 lanes: the same operations in the same order, so the same bits.
template <FloatType F>
TORCHTPU_AVX512 void quantize_rows_avx512(const void* x, const QuantizedRows& a) {
  const int64_t k = a.k, blocks = k / kSubK;
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512 lim = _mm512_set1_ps(127.0f), neg_lim = _mm512_set1_ps(-127.0f);
  for (int64_t m = 0; m < a.rows; ++m) {
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t at = m * blocks + kb, off = m * k + kb * kSubK;
      const __m512 x0 = cpu::load16<F>(x, off), x1 = cpu::load16<F>(x, off + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      if (amax == 0.0f) {
        std::fill(a.hi + off, a.hi + off + kSubK, 0);
        if (a.lo) std::fill(a.lo + off, a.lo + off + kSubK, 0);
        block_sums(a, at, 0.0f, 0, 0);
        continue;
      }
      const float step = amax / 127.0f, inv = 127.0f / amax;
      const __m512 vstep = _mm512_set1_ps(step), vinv = _mm512_set1_ps(inv);
      const __m512 v254 = _mm512_set1_ps(254.0f);
      __m512i s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
      for (int half = 0; half < 2; ++half) {
        const __m512 v = half ? x1 : x0;
        const __m512 q1 = _mm512_min_ps(
            _mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(v, vinv), kRound), neg_lim), lim);
        const __m512i i1 = _mm512_cvtps_epi32(q1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.hi + off + 16 * half),
                         _mm512_cvtepi32_epi8(i1));
        s1 = _mm512_add_epi32(s1, i1);
        if (!a.lo) continue;
        const __m512 rest = _mm512_sub_ps(v, _mm512_mul_ps(q1, vstep));
        const __m512 q2 = _mm512_min_ps(
            _mm512_max_ps(
                _mm512_roundscale_ps(_mm512_mul_ps(_mm512_mul_ps(rest, vinv), v254), kRound),
                neg_lim),
            lim);
        const __m512i i2 = _mm512_cvtps_epi32(q2);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(a.lo + off + 16 * half),
                         _mm512_cvtepi32_epi8(i2));
        s2 = _mm512_add_epi32(s2, i2);
      }
      block_sums(a, at, step, _mm512_reduce_add_epi32(s1), _mm512_reduce_add_epi32(s2));
    }
  }
}

// The AVX2 tier, for x86-64 CPUs without AVX-512 VNNI. Without vpdpbusd, vpmaddubsw multiplies
// a lane's 4 weight bytes by the 4 activation bytes in pairs (s16; |u·x| ≤ 15·127, so a pair is
// at most 3810 and the 8 pairs of a 32-input sub-block, 30480, still fit) and vpmaddwd adds the
// pairs: the same exact int32 sums as vpdpbusd, from the same starts, and the same f32 epilogue,
// so this tier gives the AVX-512 tier's bits.

TORCHTPU_AVX2 inline __m256 zero_rest8(const uint8_t* zero, int64_t at) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(zero + at));
  return _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), _mm256_set1_ps(8.0f));
}

// `accumulate` with 8 lanes.
template <bool kLo, bool kSymmetric>
TORCHTPU_AVX2 inline __m256 accumulate8(__m256 acc, __m256i i1, __m256i i2, __m256 zero_rest,
                                        __m256 scale, const QuantizedRows& a, int64_t ai) {
  __m256 f1 = _mm256_cvtepi32_ps(i1);
  if constexpr (!kSymmetric) f1 = _mm256_fnmadd_ps(zero_rest, _mm256_set1_ps(a.sum_hi[ai]), f1);
  const __m256 hi = _mm256_mul_ps(f1, _mm256_set1_ps(a.d[ai]));
  if constexpr (!kLo) {
    return _mm256_fmadd_ps(hi, scale, acc);
  } else {
    __m256 f2 = _mm256_cvtepi32_ps(i2);
    if constexpr (!kSymmetric) {
      f2 = _mm256_fnmadd_ps(zero_rest, _mm256_set1_ps(a.sum_lo[ai]), f2);
    }
    return _mm256_fmadd_ps(_mm256_fmadd_ps(f2, _mm256_set1_ps(a.d_lo[ai]), hi), scale, acc);
  }
}

// The int32 sums of 8 outputs over one sub-block: u[i] holds the outputs' unsigned weights for
// inputs 4i..4i+3, x the 32 activation bytes, `start` where the sums begin.
TORCHTPU_AVX2 inline __m256i dot8(const __m256i (&u)[8], const int8_t* x, int32_t start) {
  const auto* d = reinterpret_cast<const int32_t*>(x);
  __m256i p[8];
  for (int i = 0; i < 8; ++i) p[i] = _mm256_maddubs_epi16(u[i], _mm256_set1_epi32(d[i]));
  const __m256i s = _mm256_add_epi16(
      _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
      _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
  return _mm256_add_epi32(_mm256_madd_epi16(s, _mm256_set1_epi16(1)), _mm256_set1_epi32(start));
}

// Half a weight tile (8 outputs: lanes 0-7 or 8-15 of tile t, from `half` = the tile + 32·h) of a
// sub-block, unpacked once, against every row of `a`; acc[m] is row m's 8 sums.
template <FloatType S, int R, bool kLo, bool kSym>
TORCHTPU_AVX2 __attribute__((always_inline)) inline void half_tile_rows(
    const BlockWeights& w, const QuantizedRows& a, const uint8_t* half, int64_t kb, int64_t at,
    float (*acc)[8]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i u[8];
  for (int c = 0; c < 4; ++c) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(half + c * 64));
    u[2 * c] = _mm256_and_si256(x, low4);
    u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(x, 4), low4);
  }
  const int64_t kb_count = w.k / kSubK;
  const __m256 zero = kSym ? _mm256_setzero_ps() : zero_rest8(w.zero, at);
  const __m256 scale = cpu::load8<S>(w.scale, at);
  // Unrolled for every row count: GCC unrolled up to 7 rows but kept 8 a loop, and 8 rows cost
  // 226 µs in L2 against 7 rows' 169 (8-bit activations, this tier forced on Zen 4); unrolled 196.
#pragma GCC unroll 8
  for (int m = 0; m < R; ++m) {
    const int64_t ai = m * kb_count + kb, off = m * a.k + kb * kSubK;
    const __m256i i1 = dot8(u, a.hi + off, a.hi_start[ai]);
    const __m256i i2 = kLo ? dot8(u, a.lo + off, a.lo_start[ai]) : _mm256_setzero_si256();
    _mm256_store_ps(acc[m], accumulate8<kLo, kSym>(_mm256_load_ps(acc[m]), i1, i2, zero, scale,
                                                   a, ai));
  }
}

// R rows (1 to 8) against N blocks side by side (for_block_pairs' streams), sub-block by
// sub-block; every row takes the same operations whatever R is, so it gets the bits it gets alone.
template <FloatType S, int N, int R, bool kLo, bool kSym>
TORCHTPU_AVX2 void gemv_blocks_avx2(const BlockWeights& w, const QuantizedRows& a,
                                    const int64_t (&b)[N], const Output& y) {
  const int64_t kb_count = w.k / kSubK, groups = w.k / w.group_size;
  const int64_t per_group = w.group_size / kSubK;
  alignas(32) float acc[N][kBlockRows / 8][R][8] = {};
  for (int64_t kb = 0; kb < kb_count; ++kb) {
    for (int n = 0; n < N; ++n) {
      const uint8_t* sub = w.nibbles + (b[n] * kb_count + kb) * kSubBytes;
      prefetch_ahead(sub);
      const int64_t at = (b[n] * groups + kb / per_group) * kBlockRows;
      for (int h = 0; h < kBlockRows / 8; ++h) {
        half_tile_rows<S, R, kLo, kSym>(w, a, sub + (h / 2) * 256 + (h % 2) * 32, kb, at + 8 * h,
                                        acc[n][h]);
      }
    }
  }
  for (int n = 0; n < N; ++n) {
    for (int h = 0; h < kBlockRows / 8; ++h) {
      const int64_t column = b[n] * kBlockRows + 8 * h;
      const int64_t count = std::min<int64_t>(8, y.columns - column);
      if (count <= 0) continue;
      for (int m = 0; m < R; ++m) {
        cpu::store8(y.type, y.data, m * y.ld + column, _mm256_load_ps(acc[n][h][m]),
                    static_cast<int>(count));
      }
    }
  }
}

void gemv_avx2(const BlockWeights& w, const QuantizedRows& a, int64_t b0, int64_t b1,
               const Output& y) {
  with_shape(w, a, [&]<FloatType S, int R, bool kLo, bool kSym>() {
    for_block_pairs(b0, b1, [&]<int N>(const int64_t (&blocks)[N]) {
      gemv_blocks_avx2<S, N, R, kLo, kSym>(w, a, blocks, y);
    });
  });
}

// dequantize_row_avx512 with 8 lanes.
TORCHTPU_AVX2 void dequantize_row_avx2(const BlockWeights& w, const uint8_t* tile, int j,
                                       float zero, float scale, bool out_bf16, void* out) {
  const auto* words = reinterpret_cast<const int32_t*>(tile);
  const __m128i x = _mm_set_epi32(words[3 * 16 + j], words[2 * 16 + j], words[16 + j], words[j]);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(x, low4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), low4);
  const __m128i ordered[2] = {_mm_unpacklo_epi32(lo, hi), _mm_unpackhi_epi32(lo, hi)};
  const __m256 z = _mm256_set1_ps(zero), s = _mm256_set1_ps(scale);
  for (int q = 0; q < 4; ++q) {
    const __m128i bytes = q % 2 ? _mm_srli_si128(ordered[q / 2], 8) : ordered[q / 2];
    const __m256 u = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
    const __m256 v = cpu::round8(w.scale_type, _mm256_mul_ps(_mm256_sub_ps(u, z), s));
    cpu::store8(out_bf16 ? FloatType::kBFloat16 : FloatType::kFloat, out, 8 * q, v);
  }
}

// 32 int32 in [-127, 127] (four vectors, inputs in order) stored as bytes at dst.
TORCHTPU_AVX2 inline void store_bytes(int8_t* dst, const __m256i (&q)[4]) {
  // packs_epi32 then packs_epi16 leave the dwords in the order 0 2 4 6 1 3 5 7 of the four
  // vectors' halves: the permutation puts the 32 bytes back in input order.
  const __m256i bytes =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permutevar8x32_epi32(bytes, order));
}

TORCHTPU_AVX2 inline int32_t total(const __m256i (&q)[4]) {
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  int32_t sum = 0;
  for (const int32_t v : lanes) sum += v;
  return sum;
}

// quantize_rows_portable with 8 lanes: the same operations in the same order, so the same bits.
template <FloatType F>
TORCHTPU_AVX2 void quantize_rows_avx2(const void* x, const QuantizedRows& a) {
  const int64_t k = a.k, blocks = k / kSubK;
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m256 lim = _mm256_set1_ps(127.0f), neg_lim = _mm256_set1_ps(-127.0f);
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t m = 0; m < a.rows; ++m) {
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const int64_t at = m * blocks + kb, off = m * k + kb * kSubK;
      __m256 v[4];
      __m256 amax8 = _mm256_setzero_ps();
      for (int q = 0; q < 4; ++q) {
        v[q] = cpu::load8<F>(x, off + 8 * q);
        amax8 = _mm256_max_ps(amax8, _mm256_and_ps(v[q], magnitude));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, amax8);
      const float amax = *std::max_element(lanes, lanes + 8);
      if (amax == 0.0f) {
        std::fill(a.hi + off, a.hi + off + kSubK, 0);
        if (a.lo) std::fill(a.lo + off, a.lo + off + kSubK, 0);
        block_sums(a, at, 0.0f, 0, 0);
        continue;
      }
      const float step = amax / 127.0f, inv = 127.0f / amax;
      const __m256 vstep = _mm256_set1_ps(step), vinv = _mm256_set1_ps(inv);
      const __m256 v254 = _mm256_set1_ps(254.0f);
      __m256i q1[4], q2[4];
      __m256 f1[4];
      for (int q = 0; q < 4; ++q) {
        f1[q] = _mm256_min_ps(
            _mm256_max_ps(_mm256_round_ps(_mm256_mul_ps(v[q], vinv), kRound), neg_lim), lim);
        q1[q] = _mm256_cvtps_epi32(f1[q]);
      }
      store_bytes(a.hi + off, q1);
      if (!a.lo) {
        block_sums(a, at, step, total(q1), 0);
        continue;
      }
      for (int q = 0; q < 4; ++q) {
        const __m256 rest = _mm256_sub_ps(v[q], _mm256_mul_ps(f1[q], vstep));
        q2[q] = _mm256_cvtps_epi32(_mm256_min_ps(
            _mm256_max_ps(
                _mm256_round_ps(_mm256_mul_ps(_mm256_mul_ps(rest, vinv), v254), kRound), neg_lim),
            lim));
      }
      store_bytes(a.lo + off, q2);
      block_sums(a, at, step, total(q1), total(q2));
    }
  }
}

#endif

}  // namespace

void quantize_rows(const void* x, FloatType type, const QuantizedRows& a) {
#if defined(__x86_64__)
  if (cpu::use_avx512()) {
    switch (type) {
      case FloatType::kBFloat16: return quantize_rows_avx512<FloatType::kBFloat16>(x, a);
      case FloatType::kHalf: return quantize_rows_avx512<FloatType::kHalf>(x, a);
      case FloatType::kFloat: return quantize_rows_avx512<FloatType::kFloat>(x, a);
    }
  }
  if (cpu::use_avx2()) {
    switch (type) {
      case FloatType::kBFloat16: return quantize_rows_avx2<FloatType::kBFloat16>(x, a);
      case FloatType::kHalf: return quantize_rows_avx2<FloatType::kHalf>(x, a);
      case FloatType::kFloat: return quantize_rows_avx2<FloatType::kFloat>(x, a);
    }
  }
#endif
  quantize_rows_portable(x, type, a);
}

void gemv_blocks(const BlockWeights& w, const QuantizedRows& a, int64_t b0, int64_t b1,
                 const Output& y) {
#if defined(__x86_64__)
  // Up to 3 rows stay with VNNI: one is bound by memory, and a whole E2B step at 2 rows measured
  // 1.17-1.4x more CPU time through AMX, 4 rows 0.66-0.87x, 8 rows 0.5-0.8x. (Measured against
  // VNNI taking the rows one after another, before gemv_blocks_rows; not yet measured again on a
  // CPU with AMX.) Rows without lo parts stay with VNNI: the AMX kernel's tiles hold both.
  if (a.rows >= 4 && a.rows <= kMaxRows && a.lo == a.hi + a.rows * a.k && cpu::use_amx()) {
    switch (w.scale_type) {
      case FloatType::kBFloat16: return gemv_amx<FloatType::kBFloat16>(w, a, b0, b1, y);
      case FloatType::kHalf: return gemv_amx<FloatType::kHalf>(w, a, b0, b1, y);
      case FloatType::kFloat: return gemv_amx<FloatType::kFloat>(w, a, b0, b1, y);
    }
  }
  if (cpu::use_avx512()) return gemv_avx512(w, a, b0, b1, y);
  if (cpu::use_avx2()) return gemv_avx2(w, a, b0, b1, y);
#endif
  gemv_portable(w, a, b0, b1, y);
}

void dequantize_blocks(const BlockWeights& w, int64_t b0, int64_t b1, int64_t out_rows,
                       bool out_bf16, void* out) {
#if defined(__x86_64__)
  if (cpu::use_avx512()) {
    return for_each_dequantized_row(w, b0, b1, out_rows, out_bf16, out, dequantize_row_avx512);
  }
  if (cpu::use_avx2()) {
    return for_each_dequantized_row(w, b0, b1, out_rows, out_bf16, out, dequantize_row_avx2);
  }
#endif
  dequantize_portable(w, b0, b1, out_rows, out_bf16, out);
}

}  // namespace torchtpu::ops::int4_cpu
