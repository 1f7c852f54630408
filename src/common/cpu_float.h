// The float formats the CPU kernels (src/ops, the quantizer) read and write (bf16, IEEE half, f32):
// scalar conversions, each rounding to nearest even as ATen's casts do, and on x86-64 their 16-lane
// AVX-512 and 8-lane AVX2 counterparts, with the run-time switch between the tiers of kernels
// (AVX-512, AVX2, portable). NaN and infinities convert as ATen's casts convert them.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__)
#include <immintrin.h>
#define TORCHTPU_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define TORCHTPU_AVX2 __attribute__((target("avx2,f16c,fma")))
#endif

namespace torchtpu::cpu {

enum class FloatType { kBFloat16, kHalf, kFloat };

inline FloatType float_type(c10::ScalarType t) {
  switch (t) {
    case c10::kBFloat16: return FloatType::kBFloat16;
    case c10::kHalf: return FloatType::kHalf;
    case c10::kFloat: return FloatType::kFloat;
    default: TORCH_CHECK(false, "no CPU kernel format for ", t);
  }
}

// Round to nearest even; NaN is bf16's quiet NaN, as c10::BFloat16 makes it (rounding a NaN's
// bits could carry into the sign: the all-ones NaN that vector code makes would become 0).
inline uint16_t bf16_bits(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// IEEE half through c10::Half: round to nearest even, overflow to infinity, NaN kept.
inline float from_half(uint16_t h) {
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

inline float round_to_half(float f) { return static_cast<float>(c10::Half(f)); }

inline float load(FloatType t, const void* p, int64_t i) {
  switch (t) {
    case FloatType::kBFloat16: return from_bf16(static_cast<const uint16_t*>(p)[i]);
    case FloatType::kHalf: return from_half(static_cast<const uint16_t*>(p)[i]);
    case FloatType::kFloat: return static_cast<const float*>(p)[i];
  }
  return 0.0f;
}

// v rounded to the format t, kept as f32.
inline float round_to(FloatType t, float v) {
  switch (t) {
    case FloatType::kBFloat16: return from_bf16(bf16_bits(v));
    case FloatType::kHalf: return round_to_half(v);
    case FloatType::kFloat: return v;
  }
  return v;
}

inline void store(FloatType t, void* p, int64_t i, float v) {
  switch (t) {
    case FloatType::kBFloat16: static_cast<uint16_t*>(p)[i] = bf16_bits(v); return;
    case FloatType::kHalf: static_cast<uint16_t*>(p)[i] = c10::Half(v).x; return;
    case FloatType::kFloat: static_cast<float*>(p)[i] = v; return;
  }
}

#if defined(__x86_64__)

// 16 values from p + i as f32.
template <FloatType T>
TORCHTPU_AVX512 inline __m512 load16(const void* p, int64_t i) {
  if constexpr (T == FloatType::kFloat) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
  const auto h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i));
  if constexpr (T == FloatType::kHalf) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 f32 rounded to bf16 (as bf16_bits), the bf16 still in the upper half of each 32-bit lane.
TORCHTPU_AVX512 inline __m512i bf16_round(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded,
                                 _mm512_set1_epi32(0x7FC00000));
}

// 16 f32 as 16 packed bf16.
TORCHTPU_AVX512 inline __m256i bf16_pack(__m512 v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round(v), 16));
}

// 16 f32 rounded to the format t, kept as f32 (round_to, 16 lanes).
TORCHTPU_AVX512 inline __m512 round16(FloatType t, __m512 v) {
  switch (t) {
    case FloatType::kBFloat16:
      return _mm512_castsi512_ps(_mm512_and_si512(bf16_round(v), _mm512_set1_epi32(~0xFFFF)));
    case FloatType::kHalf:
      return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    case FloatType::kFloat: return v;
  }
  return v;
}

// The lanes of v that `keep` selects, stored at p + i in the format t.
TORCHTPU_AVX512 inline void store16(FloatType t, void* p, int64_t i, __m512 v,
                                    __mmask16 keep = 0xFFFF) {
  switch (t) {
    case FloatType::kBFloat16:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, keep, bf16_pack(v));
      return;
    case FloatType::kHalf:
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, keep,
                               _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      return;
    case FloatType::kFloat: _mm512_mask_storeu_ps(static_cast<float*>(p) + i, keep, v); return;
  }
}

// The 8-lane AVX2 counterparts of load16, round16 and store16 (the same roundings).
template <FloatType T>
TORCHTPU_AVX2 inline __m256 load8(const void* p, int64_t i) {
  if constexpr (T == FloatType::kFloat) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  const auto h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  if constexpr (T == FloatType::kHalf) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The 8 lanes of v, each below 2^16, as 8 packed 16-bit words.
TORCHTPU_AVX2 inline __m128i low_words8(__m256i v) {
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0b1000));
}

TORCHTPU_AVX2 inline __m256i bf16_round8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                                              _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

TORCHTPU_AVX2 inline __m256 round8(FloatType t, __m256 v) {
  switch (t) {
    case FloatType::kBFloat16:
      return _mm256_castsi256_ps(_mm256_and_si256(bf16_round8(v), _mm256_set1_epi32(~0xFFFF)));
    case FloatType::kHalf:
      return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    case FloatType::kFloat: return v;
  }
  return v;
}

// The sum of v's 8 lanes, pairwise as _mm512_reduce_add_ps sums its 16: lanes l + l+4, then
// l + l+2, then the two left. A fixed order: the same lanes always give the same bits.
TORCHTPU_AVX2 inline float reduce_add8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// The first n (at most 8) lanes of v stored at p + i in the format t.
TORCHTPU_AVX2 inline void store8(FloatType t, void* p, int64_t i, __m256 v, int n = 8) {
  __m128i h;
  switch (t) {
    case FloatType::kBFloat16: h = low_words8(_mm256_srli_epi32(bf16_round8(v), 16)); break;
    case FloatType::kHalf:
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      break;
    case FloatType::kFloat:
      if (n == 8) return _mm256_storeu_ps(static_cast<float*>(p) + i, v);
      alignas(32) float f[8];
      _mm256_store_ps(f, v);
      std::copy(f, f + n, static_cast<float*>(p) + i);
      return;
  }
  if (n == 8) return _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p) + i), h);
  alignas(16) uint16_t w[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(w), h);
  std::copy(w, w + n, static_cast<uint16_t*>(p) + i);
}

#endif

// TORCHTPU_CPU_ISA, the tests' switch to run a lesser tier of kernels on this CPU too: "portable",
// "avx2" or "avx512" (no AMX); unset: the best the CPU has.
inline std::string_view forced_isa() {
  const char* forced = std::getenv("TORCHTPU_CPU_ISA");
  return forced ? std::string_view(forced) : std::string_view();
}

// True when the running CPU has AVX2, FMA and F16C and TORCHTPU_CPU_ISA is not "portable": the
// kernels for x86-64 CPUs without AVX-512 (AMD Zen 1-3, Intel before Ice Lake or Alder Lake).
inline bool use_avx2() {
#if defined(__x86_64__)
  static const bool use = [] {
    if (forced_isa() == "portable") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  }();
  return use;
#else
  return false;
#endif
}

// True when use_avx2() holds, the running CPU has AVX-512 F/BW/VL/VNNI and TORCHTPU_CPU_ISA is
// not "avx2".
inline bool use_avx512() {
#if defined(__x86_64__)
  static const bool use = [] {
    if (!use_avx2() || forced_isa() == "avx2") return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return use;
#else
  return false;
#endif
}

// True when use_avx512() holds, the CPU has AMX-INT8, Linux grants this process the tile data
// (a once-per-process request) and TORCHTPU_CPU_ISA is not "avx512".
inline bool use_amx() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool use = [] {
    if (!use_avx512() || forced_isa() == "avx512") return false;
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return use;
#else
  return false;
#endif
}

// "avx512-vnni+amx-int8", "avx512-vnni", "avx2" or "portable": the kernels use_amx(),
// use_avx512() and use_avx2() picked.
inline const char* isa() {
  return use_amx()      ? "avx512-vnni+amx-int8"
         : use_avx512() ? "avx512-vnni"
         : use_avx2()   ? "avx2"
                        : "portable";
}

}  // namespace torchtpu::cpu
