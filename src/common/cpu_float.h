// The float formats the CPU kernels (src/ops, the quantizer) read and write (bf16, IEEE half, f32):
// scalar conversions, each rounding to nearest even as ATen's casts do, and on x86-64 their 16-lane
// AVX-512 counterparts, with the run-time switch between the AVX-512 kernels and the portable
// ones. Values are finite (weights, scales, activations, scores: NaN is not preserved).
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

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

inline float from_half(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = sign | ((exp + 112) << 23) | (man << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// f32 rounded to the nearest half value (within half's range), still as f32.
inline float round_to_half(float f) {
  if (f == 0.0f) return f;
  int e;
  std::frexp(f, &e);
  const int ulp_exp = std::max(e - 11, -24);
  return std::ldexp(std::nearbyint(std::ldexp(f, -ulp_exp)), ulp_exp);
}

// The bits of a value already rounded by round_to_half.
inline uint16_t half_bits(float h) {
  uint16_t sign = std::signbit(h) ? 0x8000 : 0;
  const float a = std::fabs(h);
  if (a < std::ldexp(1.0f, -14)) return sign | static_cast<uint16_t>(std::ldexp(a, 24));
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  return sign | static_cast<uint16_t>((e + 14) << 10) |
         static_cast<uint16_t>(std::ldexp(m, 11) - 1024.0f);
}

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
    case FloatType::kHalf: static_cast<uint16_t*>(p)[i] = half_bits(round_to_half(v)); return;
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

#endif

// True when the running CPU has AVX-512 F/BW/VL/VNNI and TORCHTPU_CPU_ISA is not "portable" (the
// switch the tests use to run the portable kernels on this CPU too).
inline bool use_avx512() {
#if defined(__x86_64__)
  static const bool use = [] {
    const char* forced = std::getenv("TORCHTPU_CPU_ISA");
    if (forced && std::string_view(forced) == "portable") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return use;
#else
  return false;
#endif
}

// True when use_avx512() holds, the CPU has AMX-INT8, Linux grants this process the tile data
// (a once-per-process request) and TORCHTPU_CPU_ISA is not "avx512" (the tests' switch to run
// the AVX-512 kernels alone on a CPU with AMX).
inline bool use_amx() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool use = [] {
    const char* forced = std::getenv("TORCHTPU_CPU_ISA");
    if (!use_avx512() || (forced && std::string_view(forced) == "avx512")) return false;
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return use;
#else
  return false;
#endif
}

// "avx512-vnni+amx-int8", "avx512-vnni" or "portable": the kernels use_amx() and use_avx512()
// picked.
inline const char* isa() {
  return use_amx() ? "avx512-vnni+amx-int8" : use_avx512() ? "avx512-vnni" : "portable";
}

}  // namespace torchtpu::cpu
