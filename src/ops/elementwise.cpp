#include "ops/elementwise.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/cpu_float.h"

namespace torchtpu::ops {
namespace {

using cpu::FloatType;

// ATen's constants for the tanh approximation (at::native's GeluKernelImpl).
constexpr float kBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);
constexpr float kKappa = 0.044715f;

void check(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK_VALUE(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
                    "gelu_tanh_mul: gate and up must share shape and dtype, got ", gate.sizes(),
                    " ", gate.scalar_type(), " and ", up.sizes(), " ", up.scalar_type());
}

at::Tensor gelu_tanh_mul_composite(const at::Tensor& gate, const at::Tensor& up) {
  check(gate, up);
  return at::gelu(gate, "tanh") * up;
}

at::Tensor gelu_tanh_mul_meta(const at::Tensor& gate, const at::Tensor& up) {
  check(gate, up);
  return at::empty_like(gate);
}

at::Tensor softcap_composite(const at::Tensor& x, double cap,
                             std::optional<at::ScalarType> dtype) {
  auto capped = at::tanh(x / cap) * cap;
  return dtype ? capped.to(*dtype) : capped;
}

at::Tensor softcap_meta(const at::Tensor& x, double, std::optional<at::ScalarType> dtype) {
  return at::empty_like(x, x.options().dtype(dtype.value_or(x.scalar_type())));
}

at::Tensor rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

at::Tensor rope_meta(const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
  return at::empty_like(x);
}

// ATen's expression, operation for operation (its scalar path and its vector path with Sleef's
// tanh give the same bits on this formula).
float gelu(float x) {
  const float cube = x * x * x;
  const float inner = kBeta * (x + kKappa * cube);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

void gelu_mul_portable(FloatType f, const void* gate, const void* up, int64_t i0, int64_t i1,
                       void* out) {
  for (int64_t i = i0; i < i1; ++i) {
    const float g = cpu::round_to(f, gelu(cpu::load(f, gate, i)));
    cpu::store(f, out, i, g * cpu::load(f, up, i));
  }
}

// Values [i0, i1) of one head's d: out = x·cos + rotate_half(x)·sin, rotate_half(x) = [-x2, x1].
void rope_row_portable(FloatType f, const void* x, const void* cos, const void* sin, int64_t d,
                       int64_t i0, int64_t i1, void* out) {
  const int64_t half = d / 2;
  for (int64_t i = i0; i < i1; ++i) {
    const float v = cpu::load(f, x, i);
    const float rotated = i < half ? -cpu::load(f, x, i + half) : cpu::load(f, x, i - half);
    const float a = cpu::round_to(f, v * cpu::load(f, cos, i));
    const float b = cpu::round_to(f, rotated * cpu::load(f, sin, i));
    cpu::store(f, out, i, a + b);
  }
}

#if defined(__x86_64__)
}  // namespace
}  // namespace torchtpu::ops

// Sleef's 1-ulp tanh, the one ATen's vectorized GELU calls (16 lanes in its AVX-512 kernels, 8 in
// its AVX2 ones), exported by libtorch_cpu (declared in torch's sleef.h only for translation units
// compiled with those ISAs enabled).
extern "C" __m512 Sleef_tanhf16_u10(__m512);
extern "C" __m256 Sleef_tanhf8_u10(__m256);

namespace torchtpu::ops {
namespace {

// GELU of 16 values rounded to F: the factor gelu_tanh_mul multiplies `up` by.
template <FloatType F>
TORCHTPU_AVX512 __m512 gelu16(__m512 x) {
  const __m512 beta = _mm512_set1_ps(kBeta), kappa = _mm512_set1_ps(kKappa);
  const __m512 cube = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  // ATen's build contracts x + kappa·x³ into one FMA.
  const __m512 inner = _mm512_mul_ps(beta, _mm512_fmadd_ps(kappa, cube, x));
  return cpu::round16(F, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x),
                                       _mm512_add_ps(_mm512_set1_ps(1.0f), Sleef_tanhf16_u10(inner))));
}

// gelu16 with 8 lanes (ATen's AVX2 build contracts the same way).
template <FloatType F>
TORCHTPU_AVX2 __m256 gelu8(__m256 x) {
  const __m256 beta = _mm256_set1_ps(kBeta), kappa = _mm256_set1_ps(kKappa);
  const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 inner = _mm256_mul_ps(beta, _mm256_fmadd_ps(kappa, cube, x));
  const __m256 half_x = _mm256_mul_ps(_mm256_set1_ps(0.5f), x);
  const __m256 one_plus_tanh = _mm256_add_ps(_mm256_set1_ps(1.0f), Sleef_tanhf8_u10(inner));
  return cpu::round8(F, _mm256_mul_ps(half_x, one_plus_tanh));
}

// tanh(x / cap) · cap of 16 values, with F's roundings between the steps (storing rounds the last).
template <FloatType F>
TORCHTPU_AVX512 __m512 softcap16(__m512 x, float cap) {
  const __m512 c = _mm512_set1_ps(cap);
  const __m512 scaled = cpu::round16(F, _mm512_div_ps(x, c));
  return _mm512_mul_ps(cpu::round16(F, Sleef_tanhf16_u10(scaled)), c);
}

template <FloatType F>
TORCHTPU_AVX2 __m256 softcap8(__m256 x, float cap) {
  const __m256 c = _mm256_set1_ps(cap);
  const __m256 scaled = cpu::round8(F, _mm256_div_ps(x, c));
  return _mm256_mul_ps(cpu::round8(F, Sleef_tanhf8_u10(scaled)), c);
}

#endif

// A 16-bit format has 65,536 values, so a function of one value is a table: entry u holds the
// bits the running tier's kernel gives the value whose bits are u (computed once by that kernel
// itself, so looking it up gives the same bits as computing it: Sleef's tanh costs ~50 ns per 16
// values, a lookup a few). One entry of padding: a 32-bit gather of entry 65535 stays inside.
// `f` is a functor with the tiers' kernels: avx512 (16 lanes), avx2 (8) and portable (one value).
template <FloatType F, typename Fn>
std::vector<uint16_t> tabulate(Fn f) {
  static_assert(F != FloatType::kFloat);
  std::vector<uint16_t> in(65536), table(65536 + 1);
  for (int64_t u = 0; u < 65536; ++u) in[u] = static_cast<uint16_t>(u);
#if defined(__x86_64__)
  if (cpu::use_avx512()) {
    f.avx512(in.data(), table.data());
    return table;
  }
  if (cpu::use_avx2()) {
    f.avx2(in.data(), table.data());
    return table;
  }
#endif
  for (int64_t u = 0; u < 65536; ++u) cpu::store(F, table.data(), u, f(cpu::load(F, in.data(), u)));
  return table;
}

// GELU rounded to F, and softcap, as tabulate's functors.
template <FloatType F>
struct Gelu {
  float operator()(float x) const { return cpu::round_to(F, gelu(x)); }
#if defined(__x86_64__)
  TORCHTPU_AVX512 void avx512(const uint16_t* in, uint16_t* out) const {
    for (int64_t u = 0; u < 65536; u += 16) {
      cpu::store16(F, out, u, gelu16<F>(cpu::load16<F>(in, u)));
    }
  }
  TORCHTPU_AVX2 void avx2(const uint16_t* in, uint16_t* out) const {
    for (int64_t u = 0; u < 65536; u += 8) {
      cpu::store8(F, out, u, gelu8<F>(cpu::load8<F>(in, u)));
    }
  }
#endif
};

template <FloatType F>
struct Softcap {
  float cap;
  float operator()(float x) const {
    return cpu::round_to(F, std::tanh(cpu::round_to(F, x / cap))) * cap;
  }
#if defined(__x86_64__)
  TORCHTPU_AVX512 void avx512(const uint16_t* in, uint16_t* out) const {
    for (int64_t u = 0; u < 65536; u += 16) {
      cpu::store16(F, out, u, softcap16<F>(cpu::load16<F>(in, u), cap));
    }
  }
  TORCHTPU_AVX2 void avx2(const uint16_t* in, uint16_t* out) const {
    for (int64_t u = 0; u < 65536; u += 8) {
      cpu::store8(F, out, u, softcap8<F>(cpu::load8<F>(in, u), cap));
    }
  }
#endif
};

template <FloatType F>
const uint16_t* gelu_table() {
  static const std::vector<uint16_t> table = tabulate<F>(Gelu<F>{});
  return table.data();
}

// One table per cap a caller has asked for (a model has one).
template <FloatType F>
const uint16_t* softcap_table(float cap) {
  static std::mutex mutex;
  static std::vector<std::pair<float, std::vector<uint16_t>>> tables;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const auto& [c, table] : tables) {
    if (c == cap) return table.data();
  }
  tables.emplace_back(cap, tabulate<F>(Softcap<F>{cap}));
  return tables.back().second.data();
}

// The table entry of the value at p + i.
inline uint16_t look_up(const uint16_t* table, const void* p, int64_t i) {
  return table[static_cast<const uint16_t*>(p)[i]];
}

// gelu_tanh_mul and softcap of 16-bit values [i0, i1), one lookup at a time: the tail of the
// vector tiers, and the portable tier's whole (softcap's in the AVX2 tier too: its lookups are
// copies, as fast one at a time).
template <FloatType F>
void gelu_mul_lookup(const void* gate, const void* up, int64_t i0, int64_t i1, void* out) {
  const uint16_t* table = gelu_table<F>();
  for (int64_t i = i0; i < i1; ++i) {
    const uint16_t g = look_up(table, gate, i);
    cpu::store(F, out, i, cpu::load(F, &g, 0) * cpu::load(F, up, i));
  }
}

// O, the output's format, is F or f32 (F's value widened, exactly).
template <FloatType F, FloatType O>
void softcap_lookup(const void* x, float cap, int64_t i0, int64_t i1, void* out) {
  const uint16_t* table = softcap_table<F>(cap);
  for (int64_t i = i0; i < i1; ++i) {
    const uint16_t entry = look_up(table, x, i);
    if constexpr (O == F) {
      static_cast<uint16_t*>(out)[i] = entry;
    } else {
      cpu::store(O, out, i, cpu::load(F, &entry, 0));
    }
  }
}

#if defined(__x86_64__)

// Table entries for the 16 values at p + i, as 16-bit lanes.
TORCHTPU_AVX512 __m256i look_up16(const uint16_t* table, const void* p, int64_t i) {
  const __m512i bits = _mm512_cvtepu16_epi32(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i)));
  return _mm512_cvtepi32_epi16(_mm512_i32gather_epi32(bits, table, 2));
}

template <FloatType F>
TORCHTPU_AVX512 void gelu_mul_avx512(const void* gate, const void* up, int64_t i0, int64_t i1,
                                     void* out) {
  int64_t i = i0;
  if constexpr (F == FloatType::kFloat) {
    for (; i + 16 <= i1; i += 16) {
      cpu::store16(F, out, i, _mm512_mul_ps(gelu16<F>(cpu::load16<F>(gate, i)),
                                            cpu::load16<F>(up, i)));
    }
    gelu_mul_portable(F, gate, up, i, i1, out);
  } else {
    const uint16_t* table = gelu_table<F>();
    for (; i + 16 <= i1; i += 16) {
      const __m256i g = look_up16(table, gate, i);
      cpu::store16(F, out, i, _mm512_mul_ps(cpu::load16<F>(&g, 0), cpu::load16<F>(up, i)));
    }
    gelu_mul_lookup<F>(gate, up, i, i1, out);
  }
}

// gelu_mul_avx512 on 16-bit formats with 8 lanes.
template <FloatType F>
TORCHTPU_AVX2 void gelu_mul_avx2(const void* gate, const void* up, int64_t i0, int64_t i1,
                                 void* out) {
  const uint16_t* table = gelu_table<F>();
  const auto* bits = static_cast<const uint16_t*>(gate);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256i index =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + i)));
    const __m256i g = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), index, 2);
    // An entry is the low half of its gathered lane.
    const __m128i entries = cpu::low_words8(_mm256_and_si256(g, _mm256_set1_epi32(0xFFFF)));
    cpu::store8(F, out, i, _mm256_mul_ps(cpu::load8<F>(&entries, 0), cpu::load8<F>(up, i)));
  }
  gelu_mul_lookup<F>(gate, up, i, i1, out);
}

// For the 16-bit formats only: f32 keeps ATen's own ops (softcap_cpu). O as softcap_lookup's.
template <FloatType F, FloatType O>
TORCHTPU_AVX512 void softcap_avx512(const void* x, float cap, int64_t i0, int64_t i1, void* out) {
  const uint16_t* table = softcap_table<F>(cap);
  int64_t i = i0;
  for (; i + 16 <= i1; i += 16) {
    const __m256i entries = look_up16(table, x, i);
    if constexpr (O == F) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), entries);
    } else {
      cpu::store16(O, out, i, cpu::load16<F>(&entries, 0));
    }
  }
  softcap_lookup<F, O>(x, cap, i, i1, out);
}

// rope_row_portable with 16 lanes while both halves have 16 values left.
template <FloatType F>
TORCHTPU_AVX512 void rope_row_avx512(const void* x, const void* cos, const void* sin, int64_t d,
                                     void* out) {
  const int64_t half = d / 2;
  const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
  int64_t i = 0;
  for (; i + 16 <= half; i += 16) {
    const __m512 lo = cpu::load16<F>(x, i), hi = cpu::load16<F>(x, i + half);
    const __m512 a1 = cpu::round16(F, _mm512_mul_ps(lo, cpu::load16<F>(cos, i)));
    const __m512 b1 = cpu::round16(
        F, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(hi), sign)),
                         cpu::load16<F>(sin, i)));
    cpu::store16(F, out, i, _mm512_add_ps(a1, b1));
    const __m512 a2 = cpu::round16(F, _mm512_mul_ps(hi, cpu::load16<F>(cos, i + half)));
    const __m512 b2 = cpu::round16(F, _mm512_mul_ps(lo, cpu::load16<F>(sin, i + half)));
    cpu::store16(F, out, i + half, _mm512_add_ps(a2, b2));
  }
  // The rest of each half, where d/2 is not a multiple of 16.
  rope_row_portable(F, x, cos, sin, d, i, half, out);
  rope_row_portable(F, x, cos, sin, d, i + half, d, out);
}

// rope_row_avx512 with 8 lanes.
template <FloatType F>
TORCHTPU_AVX2 void rope_row_avx2(const void* x, const void* cos, const void* sin, int64_t d,
                                 void* out) {
  const int64_t half = d / 2;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 lo = cpu::load8<F>(x, i), hi = cpu::load8<F>(x, i + half);
    const __m256 a1 = cpu::round8(F, _mm256_mul_ps(lo, cpu::load8<F>(cos, i)));
    const __m256 b1 =
        cpu::round8(F, _mm256_mul_ps(_mm256_xor_ps(hi, sign), cpu::load8<F>(sin, i)));
    cpu::store8(F, out, i, _mm256_add_ps(a1, b1));
    const __m256 a2 = cpu::round8(F, _mm256_mul_ps(hi, cpu::load8<F>(cos, i + half)));
    const __m256 b2 = cpu::round8(F, _mm256_mul_ps(lo, cpu::load8<F>(sin, i + half)));
    cpu::store8(F, out, i + half, _mm256_add_ps(a2, b2));
  }
  rope_row_portable(F, x, cos, sin, d, i, half, out);
  rope_row_portable(F, x, cos, sin, d, i + half, d, out);
}
#endif

// One row of rope with the widest tier this CPU runs.
template <FloatType F>
void rope_row(const void* x, const void* cos, const void* sin, int64_t d, void* out) {
#if defined(__x86_64__)
  if (cpu::use_avx512()) return rope_row_avx512<F>(x, cos, sin, d, out);
  if (cpu::use_avx2()) return rope_row_avx2<F>(x, cos, sin, d, out);
#endif
  rope_row_portable(F, x, cos, sin, d, 0, d, out);
}

// Runs kernel(F, i0, i1) over the elements of a bf16/f16/f32 tensor in parallel chunks of at
// least 16 Ki elements, F the format as a std::integral_constant: `avx512` where the AVX-512 tier
// runs, `other` elsewhere.
template <typename Avx512, typename Other>
void elementwise(const at::Tensor& like, Avx512 avx512, Other other) {
  const FloatType f = cpu::float_type(like.scalar_type());
  auto run = [f](auto&& kernel, int64_t i0, int64_t i1) {
    switch (f) {
      case FloatType::kBFloat16:
        return kernel(std::integral_constant<FloatType, FloatType::kBFloat16>{}, i0, i1);
      case FloatType::kHalf:
        return kernel(std::integral_constant<FloatType, FloatType::kHalf>{}, i0, i1);
      case FloatType::kFloat:
        return kernel(std::integral_constant<FloatType, FloatType::kFloat>{}, i0, i1);
    }
  };
  at::parallel_for(0, like.numel(), 16384, [&](int64_t i0, int64_t i1) {
    if (cpu::use_avx512()) return run(avx512, i0, i1);
    run(other, i0, i1);
  });
}

bool has_cpu_kernel(const at::Tensor& x) {
  const auto t = x.scalar_type();
  return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat;
}

// The distance in elements between consecutive rows (last-dim vectors) of t, when each row is
// contiguous and the rows are evenly spaced, as in a narrow of a wider tensor (the halves of the
// fused gate/up output); nullopt otherwise.
std::optional<int64_t> row_stride(const at::Tensor& t) {
  const int64_t width = t.dim() ? t.size(-1) : 1;
  if (t.dim() == 0 || (width > 1 && t.stride(-1) != 1)) return std::nullopt;
  std::optional<int64_t> stride;
  int64_t inner_size = 0, inner_stride = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (stride && t.stride(d) != inner_stride * inner_size) return std::nullopt;
    if (!stride) stride = t.stride(d);
    inner_size = t.size(d);
    inner_stride = t.stride(d);
  }
  if (stride && *stride < width) return std::nullopt;
  return stride.value_or(width);
}

// x, or a contiguous copy of it where its rows are not evenly spaced; with its row stride.
std::pair<at::Tensor, int64_t> with_rows(const at::Tensor& x) {
  if (const auto stride = row_stride(x)) return {x, *stride};
  auto copy = x.contiguous();
  return {copy, copy.dim() ? copy.size(-1) : 1};
}

at::Tensor gelu_tanh_mul_cpu(const at::Tensor& gate_in, const at::Tensor& up_in) {
  check(gate_in, up_in);
  if (!has_cpu_kernel(gate_in)) return gelu_tanh_mul_composite(gate_in, up_in);
  // 16-bit rows are read in place (the fused gate/up output's halves need no copies): their
  // results are table entries, the same wherever a row's pieces fall. f32 computes, and matches
  // ATen's bits only in ATen's flat order (its last few values take the scalar tanh), so it is
  // made contiguous; without the AVX-512 tier f32 is ATen's own ops.
  if (gate_in.scalar_type() == at::kFloat && !cpu::use_avx512()) {
    return gelu_tanh_mul_composite(gate_in, up_in);
  }
  const bool f32 = gate_in.scalar_type() == at::kFloat;
  const auto [gate, gate_stride] = with_rows(f32 ? gate_in.contiguous() : gate_in);
  const auto [up, up_stride] = with_rows(f32 ? up_in.contiguous() : up_in);
  auto out = at::empty(gate.sizes(), gate.options());
  const int64_t width = out.dim() ? out.size(-1) : 1, elem = out.element_size();
  const auto* g = static_cast<const char*>(gate.data_ptr());
  const auto* u = static_cast<const char*>(up.data_ptr());
  auto* o = static_cast<char*>(out.data_ptr());
  // Output elements [i0, i1) as pieces that stay inside one row (one piece when both inputs are
  // contiguous).
  auto by_rows = [&](int64_t i0, int64_t i1, auto&& kernel) {
    if (gate_stride == width && up_stride == width) {
      return kernel(g + i0 * elem, u + i0 * elem, i1 - i0, o + i0 * elem);
    }
    for (int64_t i = i0; i < i1;) {
      const int64_t r = i / width, c = i % width, n = std::min(i1 - i, width - c);
      kernel(g + (r * gate_stride + c) * elem, u + (r * up_stride + c) * elem, n, o + i * elem);
      i += n;
    }
  };
  elementwise(
      out,
      [&](auto f, int64_t i0, int64_t i1) {
#if defined(__x86_64__)
        by_rows(i0, i1, [](const void* gp, const void* up_p, int64_t n, void* op) {
          gelu_mul_avx512<decltype(f)::value>(gp, up_p, 0, n, op);
        });
#endif
      },
      [&](auto f, int64_t i0, int64_t i1) {
        if constexpr (decltype(f)::value != FloatType::kFloat) {
          by_rows(i0, i1, [](const void* gp, const void* up_p, int64_t n, void* op) {
#if defined(__x86_64__)
            if (cpu::use_avx2()) return gelu_mul_avx2<decltype(f)::value>(gp, up_p, 0, n, op);
#endif
            gelu_mul_lookup<decltype(f)::value>(gp, up_p, 0, n, op);
          });
        }
      });
  return out;
}

at::Tensor softcap_cpu(const at::Tensor& x_in, double cap, std::optional<at::ScalarType> dtype) {
  // f32 tanh in ATen is not the Sleef one (1% of values differ by an ulp): f32 keeps the ATen ops,
  // and so does an output in any format but x's own or f32.
  const auto out_type = dtype.value_or(x_in.scalar_type());
  if (!has_cpu_kernel(x_in) || x_in.scalar_type() == at::kFloat ||
      (out_type != x_in.scalar_type() && out_type != at::kFloat)) {
    return softcap_composite(x_in, cap, dtype);
  }
  const auto x = x_in.contiguous();
  auto out = at::empty(x.sizes(), x.options().dtype(out_type));
  const bool widen = out_type == at::kFloat;
  const auto c = static_cast<float>(cap);
  const void* in = x.data_ptr();
  void* o = out.data_ptr();
  elementwise(
      x,
      [&](auto f, int64_t i0, int64_t i1) {
#if defined(__x86_64__)
        constexpr FloatType F = decltype(f)::value;
        if constexpr (F != FloatType::kFloat) {
          if (widen) return softcap_avx512<F, FloatType::kFloat>(in, c, i0, i1, o);
          softcap_avx512<F, F>(in, c, i0, i1, o);
        }
#endif
      },
      [&](auto f, int64_t i0, int64_t i1) {
        constexpr FloatType F = decltype(f)::value;
        if constexpr (F != FloatType::kFloat) {
          if (widen) return softcap_lookup<F, FloatType::kFloat>(in, c, i0, i1, o);
          softcap_lookup<F, F>(in, c, i0, i1, o);
        }
      });
  return out;
}

at::Tensor rope_cpu(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in) {
  const bool fits = has_cpu_kernel(x_in) && x_in.dim() == 4 && x_in.size(-1) % 2 == 0 &&
                    cos_in.scalar_type() == x_in.scalar_type() &&
                    sin_in.scalar_type() == x_in.scalar_type() &&
                    cos_in.sizes() == sin_in.sizes() &&
                    cos_in.sizes() == at::IntArrayRef{x_in.size(0), x_in.size(1), 1, x_in.size(3)};
  if (!fits) return rope_composite(x_in, cos_in, sin_in);
  const auto x = x_in.contiguous();
  const auto cos = cos_in.contiguous();
  const auto sin = sin_in.contiguous();
  auto out = at::empty_like(x);
  const int64_t heads = x.size(2), d = x.size(3), elem = x.element_size();
  const FloatType f = cpu::float_type(x.scalar_type());
  const auto* xp = static_cast<const char*>(x.data_ptr());
  const auto* cp = static_cast<const char*>(cos.data_ptr());
  const auto* sp = static_cast<const char*>(sin.data_ptr());
  auto* op = static_cast<char*>(out.data_ptr());
  // Rows are one head each (a few hundred values): a thread takes at least 64.
  at::parallel_for(0, x.numel() / d, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t at = r * d * elem, angle = (r / heads) * d * elem;
      const void *row = xp + at, *c = cp + angle, *s = sp + angle;
      switch (f) {
        case FloatType::kBFloat16: rope_row<FloatType::kBFloat16>(row, c, s, d, op + at); break;
        case FloatType::kHalf: rope_row<FloatType::kHalf>(row, c, s, d, op + at); break;
        case FloatType::kFloat: rope_row<FloatType::kFloat>(row, c, s, d, op + at); break;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("gelu_tanh_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("softcap(Tensor x, float cap, ScalarType? dtype=None) -> Tensor");
  m.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchtpu, CompositeExplicitAutograd, m) {
  m.impl("gelu_tanh_mul", &gelu_tanh_mul_composite);
  m.impl("softcap", &softcap_composite);
  m.impl("rope", &rope_composite);
}

TORCH_LIBRARY_IMPL(torchtpu, CPU, m) {
  m.impl("gelu_tanh_mul", &gelu_tanh_mul_cpu);
  m.impl("softcap", &softcap_cpu);
  m.impl("rope", &rope_cpu);
}

TORCH_LIBRARY_IMPL(torchtpu, Meta, m) {
  m.impl("gelu_tanh_mul", &gelu_tanh_mul_meta);
  m.impl("softcap", &softcap_meta);
  m.impl("rope", &rope_meta);
}

at::Tensor gelu_tanh_mul(const at::Tensor& gate, const at::Tensor& up) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("torchtpu::gelu_tanh_mul", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(gate, up);
}

at::Tensor softcap(const at::Tensor& x, double cap, std::optional<at::ScalarType> dtype) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchtpu::softcap", "")
          .typed<at::Tensor(const at::Tensor&, double, std::optional<at::ScalarType>)>();
  return op.call(x, cap, dtype);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchtpu::rope", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>();
  return op.call(x, cos, sin);
}

}  // namespace torchtpu::ops
