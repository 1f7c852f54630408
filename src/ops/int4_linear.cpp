#include "ops/int4_linear.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "ops/int4_cpu.h"

namespace torchtpu::ops {
namespace {

using int4_cpu::kBlockRows;
using int4_cpu::kSubBytes;
using int4_cpu::kSubK;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<int64_t> output_shape(const at::Tensor& x, int64_t out_features) {
  auto shape = x.sizes().vec();
  shape.back() = out_features;
  return shape;
}

PackedInt4 as_packed(const at::Tensor& weight, const at::Tensor& scale,
                     const std::optional<at::Tensor>& zero_point, int64_t group_size,
                     int64_t in_features, int64_t out_features) {
  PackedInt4 p;
  p.module = "torchtpu::int4_linear";
  p.packed = weight;
  p.scale = scale;
  if (zero_point) p.zero_point = *zero_point;
  p.out = out_features;
  p.in = in_features;
  p.group_size = group_size;
  return p;
}

void check_common(const at::Tensor& x, const at::Tensor& scale, int64_t group_size,
                  int64_t out_features, int64_t activation_bits) {
  TORCH_CHECK_VALUE(x.dim() >= 1, "int4_linear: x must have at least one dimension");
  TORCH_CHECK_VALUE(at::isFloatingType(x.scalar_type()),
                    "int4_linear: x must be floating point, got ", x.scalar_type());
  TORCH_CHECK_VALUE(group_size > 0 && out_features > 0,
                    "int4_linear: group_size and out_features must be positive, got ", group_size,
                    " and ", out_features);
  TORCH_CHECK_VALUE(scale.scalar_type() == at::kBFloat16 || scale.scalar_type() == at::kHalf ||
                        scale.scalar_type() == at::kFloat,
                    "int4_linear: scale must be bfloat16, float16 or float32, got ",
                    scale.scalar_type());
  TORCH_CHECK_VALUE(activation_bits == 16 || activation_bits == 8,
                    "int4_linear: activation_bits must be 16 or 8, got ", activation_bits);
}

at::Tensor int4_linear_composite(const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& scale,
                                 const std::optional<at::Tensor>& zero_point, int64_t group_size,
                                 int64_t out_features, int64_t activation_bits) {
  check_common(x, scale, group_size, out_features, activation_bits);
  const int64_t in = x.size(-1);
  TORCH_CHECK_VALUE(weight.scalar_type() == at::kInt,
                    "int4_linear: this device takes compressed-tensors' layout (int32 weight), "
                    "got a ",
                    weight.scalar_type(), " weight (the CPU blocks of int4_repack?)");
  TORCH_CHECK_VALUE(
      weight.dim() == 2 && weight.size(0) == out_features && weight.size(1) == ceil_div(in, 8),
      "int4_linear: weight is ", weight.sizes(), ", expected [", out_features, ", ",
      ceil_div(in, 8), "] for out_features ", out_features, " and x's last dim ", in);
  TORCH_CHECK_VALUE(scale.dim() == 2 && scale.size(0) == out_features &&
                        scale.size(1) == ceil_div(in, group_size),
                    "int4_linear: scale is ", scale.sizes(), ", expected [", out_features, ", ",
                    ceil_div(in, group_size), "]");
  const auto packed = as_packed(weight, scale, zero_point, group_size, in, out_features);
  return at::linear(x, dequantize(packed, x.scalar_type()));
}

at::Tensor int4_linear_meta(const at::Tensor& x, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, int64_t, int64_t out_features,
                            int64_t) {
  return at::empty(output_shape(x, out_features), x.options());
}

int4_cpu::BlockWeights block_weights(const at::Tensor& weight, const at::Tensor& scale,
                                     const std::optional<at::Tensor>& zero_point, int64_t k,
                                     int64_t group_size) {
  int4_cpu::BlockWeights w;
  w.nibbles = weight.data_ptr<uint8_t>();
  w.scale = scale.data_ptr();
  w.zero = zero_point ? zero_point->data_ptr<uint8_t>() : nullptr;
  w.scale_type = cpu::float_type(scale.scalar_type());
  w.k = k;
  w.group_size = group_size;
  return w;
}

// y[r0:r1] = x[r0:r1] · wᵀ through the streaming kernels: rows [r0, r1) quantized once (with lo
// parts for 16-bit activations), the weights read once for all of them. Activations are tiny next
// to the weights; their buffers are reused across calls.
void stream_rows(const int4_cpu::BlockWeights& w, const at::Tensor& x, int64_t r0, int64_t r1,
                 at::Tensor& y, int64_t blocks, int64_t activation_bits) {
  const int64_t m = r1 - r0, k = w.k, blocks_k = k / kSubK, out_features = y.size(-1);
  thread_local std::vector<int8_t> parts;
  thread_local std::vector<float> stats;
  thread_local std::vector<int32_t> starts;
  parts.resize(2 * m * k);
  stats.resize(4 * m * blocks_k);
  starts.resize(2 * m * blocks_k);
  const bool lo = activation_bits == 16;
  int4_cpu::QuantizedRows a;
  a.rows = m;
  a.k = k;
  a.hi = parts.data();
  a.lo = lo ? parts.data() + m * k : nullptr;
  a.d = stats.data();
  a.d_lo = lo ? stats.data() + m * blocks_k : nullptr;
  a.sum_hi = stats.data() + 2 * m * blocks_k;
  a.sum_lo = lo ? stats.data() + 3 * m * blocks_k : nullptr;
  a.hi_start = starts.data();
  a.lo_start = lo ? starts.data() + m * blocks_k : nullptr;
  const auto* first = static_cast<const char*>(x.data_ptr()) + r0 * k * x.element_size();
  int4_cpu::quantize_rows(first, cpu::float_type(x.scalar_type()), a);
  int4_cpu::Output out;
  out.data = static_cast<char*>(y.data_ptr()) + r0 * out_features * y.element_size();
  out.ld = out_features;
  out.columns = out_features;
  out.type = cpu::float_type(y.scalar_type());
  at::parallel_for(0, blocks, 1,
                   [&](int64_t b0, int64_t b1) { int4_cpu::gemv_blocks(w, a, b0, b1, out); });
}

// w's blocks from b0 on as weights of their own (block b0's first output row is their row 0).
int4_cpu::BlockWeights block_range(const int4_cpu::BlockWeights& w, int64_t b0) {
  const int64_t per_block = w.k / w.group_size * kBlockRows;
  auto r = w;
  r.nibbles += b0 * (w.k / kSubK) * kSubBytes;
  const int64_t scale_bytes = w.scale_type == cpu::FloatType::kFloat ? 4 : 2;
  r.scale = static_cast<const char*>(w.scale) + b0 * per_block * scale_bytes;
  if (r.zero) r.zero += b0 * per_block;
  return r;
}

// Bytes of dequantized weights a thread multiplies at a time: they stay in its L2 between
// being written and being read, where the whole dense matrix (4x the int4 bytes at bf16, 8x at
// f32) went to DRAM and back (measured: a 17-token chunk of E2B read 4x slower than 16 rows
// streamed).
constexpr int64_t kDenseTileBytes = int64_t{1} << 20;

// y = x · wᵀ for x [m, k] where the weights are dequantized for the product (prompt chunks, f32
// activations): compressed-tensors' values, as dequantize_blocks writes them, a tile of whole
// blocks at a time per thread, each tile multiplied by oneDNN on that thread. f32 keeps the exact
// dequantized values (the --dtype float32 numerics). oneDNN multiplies bf16 fast only with
// AVX-512 (AMX, AVX512-BF16 or its AVX-512 kernels): below that tier a bf16 product ran 7x slower
// than f32 (Zen 3, 512 x 1536 x 6144), so there the same values are multiplied in f32 and the
// result rounded once.
at::Tensor dequantized_product(const int4_cpu::BlockWeights& w, const at::Tensor& x,
                               int64_t blocks, int64_t out_features) {
  const bool half_width = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  const bool bf16_product = x.scalar_type() == at::kBFloat16 && cpu::use_avx512();
  const auto dense_type = bf16_product ? at::kBFloat16 : at::kFloat;
  const auto product_x = half_width && !cpu::use_avx512() ? x.to(at::kFloat) : x;
  const int64_t m = x.size(0), k = w.k;
  // At most kDenseTileBytes, and small enough that every thread gets a tile.
  const int64_t by_bytes = kDenseTileBytes / (kBlockRows * k * at::elementSize(dense_type));
  const int64_t tile_blocks =
      std::max<int64_t>(1, std::min(by_bytes, ceil_div(blocks, at::get_num_threads())));
  auto y = at::empty({m, out_features}, x.options());
  // The pool's threads run ATen ops under the caller's inference mode (thread-local state that
  // at::parallel_for does not carry): y may be an inference tensor.
  const bool inference = c10::InferenceMode::is_enabled();
  at::parallel_for(0, ceil_div(blocks, tile_blocks), 1, [&](int64_t t0, int64_t t1) {
    const c10::InferenceMode mode(inference);
    auto dense = at::empty({tile_blocks * kBlockRows, k}, x.options().dtype(dense_type));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b0 = t * tile_blocks, b1 = std::min(blocks, b0 + tile_blocks);
      const int64_t row0 = b0 * kBlockRows;
      const int64_t rows = std::min(b1 * kBlockRows, out_features) - row0;
      int4_cpu::dequantize_blocks(block_range(w, b0), 0, b1 - b0, rows, bf16_product,
                                  dense.data_ptr());
      const auto tile = dense.narrow(0, 0, rows).to(product_x.scalar_type());
      y.narrow(1, row0, rows).copy_(at::linear(product_x, tile));
    }
  });
  return y;
}

at::Tensor int4_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                           const std::optional<at::Tensor>& zero_point, int64_t group_size,
                           int64_t out_features, int64_t activation_bits) {
  if (weight.scalar_type() != at::kByte) {
    return int4_linear_composite(x, weight, scale, zero_point, group_size, out_features,
                                 activation_bits);
  }
  check_common(x, scale, group_size, out_features, activation_bits);
  const int64_t k = x.size(-1), blocks = ceil_div(out_features, kBlockRows);
  const int64_t groups = k / group_size;
  TORCH_CHECK_VALUE(k % kSubK == 0 && group_size % kSubK == 0 && k % group_size == 0,
                    "int4_linear: CPU blocks need in_features and group_size multiples of 32, "
                    "got ",
                    k, " and ", group_size);
  TORCH_CHECK_VALUE(weight.dim() == 3 && weight.size(0) == blocks && weight.size(1) == k / kSubK &&
                        weight.size(2) == kSubBytes && weight.is_contiguous(),
                    "int4_linear: CPU blocks are ", weight.sizes(), ", expected contiguous [",
                    blocks, ", ", k / kSubK, ", ", kSubBytes, "] for x's last dim ", k);
  TORCH_CHECK_VALUE(scale.dim() == 3 && scale.size(0) == blocks && scale.size(1) == groups &&
                        scale.size(2) == kBlockRows && scale.is_contiguous(),
                    "int4_linear: CPU block scales are ", scale.sizes(), ", expected [", blocks,
                    ", ", groups, ", ", kBlockRows, "]");
  TORCH_CHECK_VALUE(
      !zero_point || (zero_point->scalar_type() == at::kByte &&
                      zero_point->sizes() == scale.sizes() && zero_point->is_contiguous()),
      "int4_linear: CPU block zero points must be uint8 shaped like the scales");
  const auto w = block_weights(weight, scale, zero_point, k, group_size);

  const auto rows = x.reshape({-1, k});
  const int64_t m = rows.size(0);
  const bool half_width = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  if (m > int4_cpu_streamed_rows() || !half_width) {
    return dequantized_product(w, rows, blocks, out_features).view(output_shape(x, out_features));
  }

  const auto xc = rows.contiguous();
  auto y = at::empty(output_shape(x, out_features), x.options());
  const int64_t passes = ceil_div(m, int4_cpu::kMaxRows);
  for (int64_t p = 0; p < passes; ++p) {
    stream_rows(w, xc, p * m / passes, (p + 1) * m / passes, y, blocks, activation_bits);
  }
  return y;
}

std::vector<at::Tensor> int4_repack_op(const at::Tensor& weight, const at::Tensor& scale,
                                       const std::optional<at::Tensor>& zero_point,
                                       int64_t group_size, int64_t out_features) {
  const int64_t in = weight.size(1) * 8;
  const auto packed = as_packed(weight, scale, zero_point, group_size, in, out_features);
  TORCH_CHECK_VALUE(cpu_blocks_supported(packed),
                    "int4_repack: CPU blocks need in_features and group_size multiples of 32, "
                    "got ",
                    in, " and ", group_size);
  const auto r = repack_for_cpu(packed);
  std::vector<at::Tensor> out{r.weight, r.scale};
  if (r.zero_point.defined()) out.push_back(r.zero_point);
  return out;
}

// The op handle, looked up once.
const c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const std::optional<at::Tensor>&, int64_t, int64_t,
                                          int64_t)>&
int4_linear_op() {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchtpu::int4_linear", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, int64_t, int64_t, int64_t)>();
  return op;
}

}  // namespace

TORCH_LIBRARY(torchtpu, m) {
  m.def(
      "int4_linear(Tensor x, Tensor weight, Tensor scale, Tensor? zero_point, int group_size, "
      "int out_features, int activation_bits=16) -> Tensor");
  m.def(
      "int4_repack(Tensor weight, Tensor scale, Tensor? zero_point, int group_size, "
      "int out_features) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(torchtpu, CompositeExplicitAutograd, m) {
  m.impl("int4_linear", &int4_linear_composite);
}

TORCH_LIBRARY_IMPL(torchtpu, CPU, m) {
  m.impl("int4_linear", &int4_linear_cpu);
  m.impl("int4_repack", &int4_repack_op);
}

TORCH_LIBRARY_IMPL(torchtpu, Meta, m) { m.impl("int4_linear", &int4_linear_meta); }

int64_t Int4Weight::nbytes() const {
  return weight.nbytes() + scale.nbytes() + (zero_point.defined() ? zero_point.nbytes() : 0);
}

std::string Int4Weight::describe() const {
  const auto s = scale.scalar_type();
  const std::string scales = s == at::kBFloat16 ? "bf16" : s == at::kHalf ? "f16" : "f32";
  std::string text = "int4(g" + std::to_string(group_size) + ", " + scales + " scales";
  if (zero_point.defined()) text += ", zero points";
  text += cpu_blocks() ? std::string(", cpu blocks ") + int4_cpu_isa() : ", compressed-tensors";
  if (cpu_blocks() && activation_bits == 8) text += ", 8-bit activations";
  return text + ")";
}

at::Tensor int4_linear(const at::Tensor& x, const Int4Weight& w) {
  std::optional<at::Tensor> zero;
  if (w.zero_point.defined()) zero = w.zero_point;
  return int4_linear_op().call(x, w.weight, w.scale, zero, w.group_size, w.out_features,
                               w.activation_bits);
}

Int4Weight int4_weight(const PackedInt4& packed) {
  Int4Weight w;
  w.weight = packed.packed;
  w.scale = packed.scale;
  w.zero_point = packed.zero_point;
  w.group_size = packed.group_size;
  w.in_features = packed.in;
  w.out_features = packed.out;
  return w;
}

bool cpu_blocks_supported(const PackedInt4& p) {
  return !p.g_idx.defined() && p.in % kSubK == 0 && p.group_size % kSubK == 0 &&
         p.in % p.group_size == 0;
}

namespace {

// Zeroed bytes for blocks the kernel streams. From 2 MiB up they are mapped on their own, 2 MiB
// aligned and advised into transparent huge pages (THP's common "madvise" mode): a stream then
// needs a TLB entry per 2 MiB instead of per 4 KiB, measured +5-12% read rate on this kernel.
at::Tensor streamed_bytes(at::IntArrayRef shape) {
  const int64_t n = c10::multiply_integers(shape);
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (n >= static_cast<int64_t>(kHuge)) {
    const uintptr_t length = (static_cast<uintptr_t>(n) + 4095) & ~uintptr_t{4095};
    void* raw =
        mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(raw != MAP_FAILED, "int4_repack: cannot map ", n, " bytes for CPU blocks");
    const auto first = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t start = (first + kHuge - 1) & ~(kHuge - 1);
    if (start > first) munmap(raw, start - first);
    munmap(reinterpret_cast<void*>(start + length), first + kHuge - start);
    // Advice only: where the kernel has no THP, the pages stay 4 KiB.
    madvise(reinterpret_cast<void*>(start), length, MADV_HUGEPAGE);
    return at::from_blob(
        reinterpret_cast<void*>(start), shape, [length](void* p) { munmap(p, length); },
        at::TensorOptions().dtype(at::kByte));
  }
#endif
  return at::zeros(shape, at::kByte);
}

}  // namespace

// Rows of x up to which the CPU kernel streams the weights (once per int4_cpu::kMaxRows rows: a
// Batch of 16 sequences reads them twice; a chunk's later passes find a linear's weights in the
// L3 cache); beyond, it dequantizes them tile by tile into bf16 and leaves the product to oneDNN
// (AMX), which wins for long prompt chunks. On E2B shapes with AMX, streaming read 64 tokens 2x
// and 96 tokens 1.35x as fast as the tiles, 128 tokens 0.75x (docs/BENCHMARKS.md).
// The AVX2 tier streams every chunk: without AVX-512 its int8 products beat oneDNN's f32 (and
// bf16 runs 7x slower than that; measured on Zen 3, docs/BENCHMARKS.md).
int64_t int4_cpu_streamed_rows() {
  if (cpu::use_avx512() || !cpu::use_avx2()) return 96;
  return std::numeric_limits<int64_t>::max();
}

std::optional<FusedInt4> fuse_cpu_blocks(const std::vector<Int4Weight>& parts) {
  if (parts.size() < 2) return std::nullopt;
  const auto& first = parts.front();
  for (const auto& p : parts) {
    if (!p.cpu_blocks() || p.in_features != first.in_features || p.group_size != first.group_size ||
        p.scale.scalar_type() != first.scale.scalar_type() ||
        p.zero_point.defined() != first.zero_point.defined() ||
        p.activation_bits != first.activation_bits) {
      return std::nullopt;
    }
  }
  FusedInt4 fused;
  std::vector<at::Tensor> scales, zeros;
  int64_t blocks = 0;
  for (const auto& p : parts) {
    fused.offsets.push_back(blocks * kBlockRows);
    blocks += p.weight.size(0);
    scales.push_back(p.scale);
    if (p.zero_point.defined()) zeros.push_back(p.zero_point);
  }
  auto& w = fused.whole;
  w.group_size = first.group_size;
  w.in_features = first.in_features;
  w.activation_bits = first.activation_bits;
  // The last part's padding rows fall past out_features, as in any single weight.
  w.out_features = fused.offsets.back() + parts.back().out_features;
  w.weight = streamed_bytes({blocks, first.weight.size(1), kSubBytes});
  for (size_t i = 0; i < parts.size(); ++i) {
    w.weight.narrow(0, fused.offsets[i] / kBlockRows, parts[i].weight.size(0))
        .copy_(parts[i].weight);
  }
  w.scale = at::cat(scales, 0);
  if (!zeros.empty()) w.zero_point = at::cat(zeros, 0);
  return fused;
}

Int4Weight repack_for_cpu(const PackedInt4& p) {
  TORCH_CHECK(cpu_blocks_supported(p), "repack_for_cpu: ", p.module, " has no CPU block layout");
  const int64_t blocks = ceil_div(p.out, kBlockRows), kb_count = p.in / kSubK;
  const int64_t groups = p.in / p.group_size, words = p.packed.size(1);
  const auto packed = p.packed.to(at::kCPU).contiguous();
  const auto scale = p.scale.to(at::kCPU).contiguous();
  at::Tensor zero;
  if (p.zero_point.defined()) {
    // Stored zero points are packed 8 per int32 along the output dim: unpack to [out, groups].
    const auto shifts = at::arange(0, 32, 4, at::kInt);
    zero = p.zero_point.to(at::kCPU)
               .t()
               .unsqueeze(-1)
               .bitwise_right_shift(shifts)
               .bitwise_and(0xF)
               .reshape({groups, -1})
               .narrow(1, 0, p.out)
               .t()
               .contiguous();
  }

  Int4Weight r;
  r.group_size = p.group_size;
  r.in_features = p.in;
  r.out_features = p.out;
  r.weight = streamed_bytes({blocks, kb_count, kSubBytes});
  // Padding rows get scale 0 (and the symmetric zero), so they add nothing.
  r.scale = at::zeros({blocks, groups, kBlockRows}, scale.options());
  if (zero.defined()) r.zero_point = at::full({blocks, groups, kBlockRows}, 8, at::kByte);

  const auto* src = packed.data_ptr<int32_t>();
  auto* dst = r.weight.data_ptr<uint8_t>();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      for (int64_t row = 0; row < kBlockRows && b * kBlockRows + row < p.out; ++row) {
        const int32_t* words_of_row = src + (b * kBlockRows + row) * words;
        auto u = [&](int64_t col) { return (words_of_row[col / 8] >> (4 * (col % 8))) & 0xF; };
        const int64_t t = row / 16, j = row % 16;
        for (int64_t kb = 0; kb < kb_count; ++kb) {
          uint8_t* sub = dst + (b * kb_count + kb) * kSubBytes;
          for (int64_t c = 0; c < 4; ++c) {
            for (int64_t i = 0; i < 4; ++i) {
              const int64_t col = kb * kSubK + 8 * c + i;
              sub[((t * 4 + c) * 16 + j) * 4 + i] =
                  static_cast<uint8_t>(u(col) | (u(col + 4) << 4));
            }
          }
        }
      }
    }
  });
  // [out, groups] -> [blocks, groups, 64], padded.
  auto padded_scale = at::zeros({blocks * kBlockRows, groups}, scale.options());
  padded_scale.narrow(0, 0, p.out).copy_(scale);
  r.scale.copy_(padded_scale.view({blocks, kBlockRows, groups}).transpose(1, 2));
  if (zero.defined()) {
    auto padded_zero = at::full({blocks * kBlockRows, groups}, 8, at::kByte);
    padded_zero.narrow(0, 0, p.out).copy_(zero);
    r.zero_point.copy_(padded_zero.view({blocks, kBlockRows, groups}).transpose(1, 2));
  }
  return r;
}

const char* int4_cpu_isa() { return cpu::isa(); }

}  // namespace torchtpu::ops
