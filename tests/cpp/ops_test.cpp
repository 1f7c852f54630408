// torchtpu's operators against independent references: a float64 matmul of
// the weights as compressed-tensors dequantizes them, at::linear on those weights, and the
// library's own dequantization (quant/pack_quantized, checked bit for bit against
// compressed-tensors in tests/python/test_quant.py). CTest runs this suite twice: with the CPU's
// best kernel and with TORCHTPU_CPU_ISA=portable.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "ops/argmax.h"
#include "ops/attention.h"
#include "ops/dense_linear.h"
#include "ops/elementwise.h"
#include "ops/int4_linear.h"
#include "ops/rms_norm.h"
#include "quant/pack_quantized.h"
#include "quant/quantize.h"

namespace torchtpu::ops {
namespace {

struct Case {
  int64_t in, out, group;
  bool symmetric;
  at::ScalarType scale_dtype;
};

// Names the case in test names (gtest otherwise prints its bytes, padding included).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.in << "x" << c.out << " g" << c.group << (c.symmetric ? " sym " : " asym ")
      << c10::toString(c.scale_dtype);
}

PackedInt4 random_int4(const Case& c, uint64_t seed) {
  at::manual_seed(seed);
  const auto dense = (at::randn({c.out, c.in}) * 0.05).to(at::kBFloat16);
  return quantize_weight(dense, {c.group, c.symmetric, c.scale_dtype}, "test.linear");
}

at::Tensor random_input(int64_t rows, int64_t in, uint64_t seed) {
  at::manual_seed(seed);
  // Heavy-tailed like real activations: a few channels much larger than the rest.
  auto x = at::randn({rows, in});
  x.narrow(1, 0, std::min<int64_t>(in, 8)).mul_(20.0);
  return x.to(at::kBFloat16);
}

double rms(const at::Tensor& t) { return t.to(at::kDouble).pow(2).mean().sqrt().item<double>(); }

// The E2B linears (research/gemma4-architecture.md): q/k/v/o, gate/up/down (6144 and the shared
// layers' 12288), the per-layer input gate and projection, the per-layer model projection.
class E2BShapes : public ::testing::TestWithParam<Case> {};

TEST_P(E2BShapes, ErrorAgainstFloat64IsAtMostTwiceThatOfBf16Linear) {
  const Case c = GetParam();
  const auto packed = random_int4(c, 1);
  const auto blocks = repack_for_cpu(packed);
  const auto weights = dequantize(packed, at::kBFloat16);
  for (int64_t rows : {1, 3, 8, 16}) {
    const auto x = random_input(rows, c.in, 2 + rows);
    const auto exact = at::linear(x.to(at::kDouble), weights.to(at::kDouble));
    const double ours = rms(int4_linear(x, blocks).to(at::kDouble) - exact);
    const double aten = rms(at::linear(x, weights).to(at::kDouble) - exact);
    std::cout << "in " << c.in << " out " << c.out << " rows " << rows << ": rms error "
              << ours / rms(exact) << " (int4_linear), " << aten / rms(exact)
              << " (at::linear bf16), relative to the output's rms\n";
    EXPECT_LE(ours, 2.0 * aten) << "in " << c.in << " out " << c.out << " rows " << rows
                                << ": int4_linear " << ours << ", at::linear " << aten
                                << ", output rms " << rms(exact);
  }
}

// x as the 8-bit mode reads it, in float64: per row and block of 32, d = max|x| / 127 and
// round-half-even(x / d) · d (llama.cpp's Q8_0 blocks, which the kernel's hi part is).
at::Tensor q8_blocks(const at::Tensor& x) {
  const auto blocks = x.to(at::kDouble).view({x.size(0), -1, 32});
  const auto d = blocks.abs().amax(-1, /*keepdim=*/true) / 127.0;
  const auto q = at::where(d > 0, at::round(blocks / d), at::zeros_like(blocks));
  return (q * d).view(x.sizes());
}

TEST_P(E2BShapes, EightBitActivationsGiveTheProductsOfTheirQ8Blocks) {
  const Case c = GetParam();
  auto blocks = repack_for_cpu(random_int4(c, 1));
  blocks.activation_bits = 8;
  const auto weights = dequantize(random_int4(c, 1), at::kDouble);
  for (int64_t rows : {1, 3, 8, 16}) {
    const auto x = random_input(rows, c.in, 2 + rows);
    const auto exact_q8 = at::linear(q8_blocks(x), weights);
    const double ours = rms(int4_linear(x, blocks).to(at::kDouble) - exact_q8);
    // What rounding the exact products to the bf16 output alone costs.
    const double rounding = rms(exact_q8.to(at::kBFloat16).to(at::kDouble) - exact_q8);
    const double mode = rms(exact_q8 - at::linear(x.to(at::kDouble), weights));
    std::cout << "in " << c.in << " out " << c.out << " rows " << rows << ": 8-bit activations "
              << "cost " << mode / rms(exact_q8) << " of the output's rms; the kernel is "
              << ours / rms(exact_q8) << " from their exact products\n";
    EXPECT_LE(ours, 1.5 * rounding) << "in " << c.in << " out " << c.out << " rows " << rows;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, E2BShapes,
    ::testing::Values(Case{1536, 2048, 32, true, at::kBFloat16},   // q_proj (sliding)
                      Case{1536, 512, 32, true, at::kBFloat16},    // k/v_proj (full)
                      Case{4096, 1536, 32, true, at::kBFloat16},   // o_proj (full)
                      Case{1536, 6144, 32, true, at::kBFloat16},   // gate/up_proj
                      Case{12288, 1536, 32, true, at::kBFloat16},  // down_proj (shared layers)
                      Case{1536, 256, 32, false, at::kBFloat16},   // per_layer_input_gate, asym
                      Case{256, 1536, 32, true, at::kHalf},        // per_layer_projection
                      Case{1536, 8960, 128, true, at::kFloat},     // per_layer_model_projection
                      Case{6144, 1536, 64, false, at::kHalf}));

TEST(Int4Linear, EachStreamedRowMatchesThatRowAlone) {
  // An odd number of blocks (one thread's lone last block), zero points or not, f16 and f32
  // scales, an odd number of 32-input sub-blocks (the AMX kernel alternates two activation tiles
  // by sub-block) in groups of three; each row count from 2 to 8 has a kernel of its own (VNNI,
  // AMX from 4 rows where the CPU has it), and 13 and 16 rows stream the weights in two passes.
  // Both activation widths.
  for (const Case& c : {Case{256, 200, 32, false, at::kBFloat16},
                        Case{384, 320, 128, true, at::kHalf}, Case{288, 130, 96, true, at::kFloat},
                        Case{288, 130, 96, false, at::kBFloat16}}) {
    for (const int64_t bits : {16, 8}) {
      auto blocks = repack_for_cpu(random_int4(c, 3));
      blocks.activation_bits = bits;
      for (const int64_t rows : {2, 3, 4, 5, 6, 7, 8, 13, 16}) {
        const auto x = random_input(rows, c.in, 4 + rows);
        const auto together = int4_linear(x, blocks);
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_TRUE(at::equal(together[r], int4_linear(x.narrow(0, r, 1), blocks)[0]))
              << "in " << c.in << ", " << bits << "-bit activations, row " << r << " of "
              << rows;
        }
      }
    }
  }
}

// A prompt chunk's product where the weights are dequantized for it: compressed-tensors' values
// times x, in bf16 where oneDNN multiplies it fast (the AVX-512 tier), in f32 below it, rounded
// to x's dtype once.
at::Tensor dense_product(const at::Tensor& x, const PackedInt4& packed) {
  if (std::string(int4_cpu_isa()).starts_with("avx512")) {
    return at::linear(x, dequantize(packed, at::kBFloat16));
  }
  return at::linear(x.to(at::kFloat), dequantize(packed, at::kFloat)).to(x.scalar_type());
}

// What a prompt chunk gives: up to int4_cpu_streamed_rows() rows (every chunk on the AVX2 tier,
// whose int8 products beat oneDNN's f32 there) stream the weights, so each row is that row
// streamed alone; longer chunks dequantize (dense_product).
at::Tensor chunk_product(const at::Tensor& x, const PackedInt4& packed, const Int4Weight& blocks) {
  if (x.size(0) > int4_cpu_streamed_rows()) return dense_product(x, packed);
  std::vector<at::Tensor> rows;
  for (int64_t i = 0; i < x.size(0); ++i) rows.push_back(int4_linear(x.narrow(0, i, 1), blocks));
  return at::cat(rows);
}

TEST(Int4Linear, ActivationBitsAreSixteenOrEight) {
  const Case c{64, 40, 32, true, at::kBFloat16};
  const auto packed = random_int4(c, 12);
  const auto x = random_input(1, 64, 13);
  for (auto w : {repack_for_cpu(packed), int4_weight(packed)}) {
    w.activation_bits = 4;
    try {
      int4_linear(x, w);
      FAIL() << "activation_bits 4 was accepted";
    } catch (const c10::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("activation_bits must be 16 or 8, got 4"),
                std::string::npos)
          << e.what();
    }
  }
  // Where the weights are dequantized for a chunk, 8 changes nothing; where chunks stream, each
  // row is its row alone at 8 bits.
  auto blocks = repack_for_cpu(packed);
  blocks.activation_bits = 8;
  const auto chunk = random_input(40, 64, 14);
  EXPECT_TRUE(at::equal(int4_linear(chunk, blocks), chunk_product(chunk, packed, blocks)));
}

TEST(Int4Linear, PromptChunksUseExactlyTheDequantizedWeightsOrStreamEachRow) {
  // 2048 inputs: the dequantized bf16 weights go to oneDNN in tiles of at most 256 outputs, so 600
  // of them are three tiles or more, the last of them a part of a block.
  for (const Case& c : {Case{320, 100, 32, true, at::kBFloat16},
                        Case{128, 64, 64, false, at::kHalf}, Case{96, 48, 32, true, at::kFloat},
                        Case{2048, 600, 64, false, at::kBFloat16}}) {
    const auto packed = random_int4(c, 5);
    const auto blocks = repack_for_cpu(packed);
    // Streamed and, where a chunk can outgrow streaming (not on the AVX2 tier), dequantized.
    std::vector<int64_t> chunks{40};
    if (int4_cpu_streamed_rows() != std::numeric_limits<int64_t>::max()) {
      chunks.push_back(int4_cpu_streamed_rows() + 3);
    }
    for (const int64_t rows : chunks) {
      const auto x = random_input(rows, c.in, 6);
      const auto y = int4_linear(x, blocks), want = chunk_product(x, packed, blocks);
      if (rows <= int4_cpu_streamed_rows()) {
        EXPECT_TRUE(at::equal(y, want)) << "in " << c.in << ", " << rows << " rows";
        continue;
      }
      // oneDNN multiplies the dequantized weights a tile of outputs at a time, and may sum a
      // tile's products in another order than the whole matrix's: each output is the same f32
      // sum up to that order, rounded once to bf16, so at most one step of bf16 (8 significant
      // bits: at most |w|·2⁻⁷) apart; 1e-4 more for outputs near zero, whose steps are tiny.
      const auto w = want.to(at::kDouble);
      const auto step = w.abs() * std::ldexp(1.0, -7);
      const double worst = ((y.to(at::kDouble) - w).abs() - step - 1e-4).max().item<double>();
      EXPECT_LE(worst, 0.0) << "in " << c.in << ", " << rows << " rows";
    }
    // f32 activations keep compressed-tensors' values exactly too (the --dtype float32 numerics),
    // in tiles of at most 128 outputs at 2048 inputs.
    const auto xf = random_input(3, c.in, 7).to(at::kFloat);
    EXPECT_TRUE(at::equal(int4_linear(xf, blocks), at::linear(xf, dequantize(packed, at::kFloat))));
  }
}

TEST(Int4Linear, CompressedTensorsLayoutRunsTheCompositeOnTheCpu) {
  const Case c{64, 24, 32, false, at::kBFloat16};
  const auto packed = random_int4(c, 7);
  const auto x = random_input(2, c.in, 8).view({1, 2, c.in});
  const auto y = int4_linear(x, int4_weight(packed));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{1, 2, 24}));
  EXPECT_TRUE(at::equal(y, at::linear(x, dequantize(packed, at::kBFloat16))));
}

TEST(Int4Linear, PaddingRowsAndZeroBlocksContributeNothing) {
  const Case c{64, 17, 32, true, at::kBFloat16};
  const auto packed = random_int4(c, 9);
  auto x = random_input(1, c.in, 10);
  x.narrow(1, 0, 32).zero_();
  const auto y = int4_linear(x, repack_for_cpu(packed));
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{1, 17}));
  const auto exact = at::linear(x.to(at::kDouble), dequantize(packed, at::kDouble));
  EXPECT_LT(rms(y.to(at::kDouble) - exact), 1e-2 * rms(exact));
}

TEST(Int4Linear, FusedPartsGiveEachPartsOwnBits) {
  // Parts of 200, 16 and 64 rows: the first two end in padding rows inside the fused weight.
  for (const bool symmetric : {true, false}) {
    std::vector<Int4Weight> parts;
    for (const int64_t out : {200, 16, 64}) {
      parts.push_back(repack_for_cpu(random_int4({96, out, 32, symmetric, at::kBFloat16}, out)));
    }
    const auto fused = fuse_cpu_blocks(parts);
    ASSERT_TRUE(fused.has_value());
    EXPECT_EQ(fused->offsets, (std::vector<int64_t>{0, 256, 320}));
    for (const int64_t rows : {1, 3, 20}) {  // streamed rows, and a chunk through oneDNN
      const auto x = random_input(rows, 96, rows);
      const auto y = int4_linear(x, fused->whole);
      EXPECT_EQ(y.size(1), 384);
      for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_TRUE(at::equal(y.narrow(1, fused->offsets[i], parts[i].out_features),
                              int4_linear(x, parts[i])))
            << "part " << i << ", " << rows << " rows, symmetric " << symmetric;
      }
    }
  }
}

TEST(Int4Linear, OnlyCpuBlocksOfOneShapeAndFormatFuse) {
  const auto a = repack_for_cpu(random_int4({64, 64, 32, true, at::kBFloat16}, 1));
  EXPECT_FALSE(fuse_cpu_blocks({a}).has_value()) << "one part is nothing to fuse";
  for (const Case& other :
       {Case{96, 64, 32, true, at::kBFloat16}, Case{64, 64, 64, true, at::kBFloat16},
        Case{64, 64, 32, false, at::kBFloat16}, Case{64, 64, 32, true, at::kHalf}}) {
    const auto b = repack_for_cpu(random_int4(other, 2));
    EXPECT_FALSE(fuse_cpu_blocks({a, b}).has_value())
        << "in " << other.in << ", group " << other.group << ", symmetric " << other.symmetric;
  }
  const auto layout = int4_weight(random_int4({64, 64, 32, true, at::kBFloat16}, 3));
  EXPECT_FALSE(fuse_cpu_blocks({a, layout}).has_value()) << "compressed-tensors' layout";
}

TEST(Int4Linear, MetaTensorsGiveTheShapeOnly) {
  const Case c{64, 40, 32, true, at::kBFloat16};
  const auto blocks = repack_for_cpu(random_int4(c, 11));
  Int4Weight meta = blocks;
  meta.weight = at::empty_like(blocks.weight, at::kMeta);
  meta.scale = at::empty_like(blocks.scale, at::kMeta);
  const auto y =
      int4_linear(at::empty({3, 5, 64}, at::device(at::kMeta).dtype(at::kBFloat16)), meta);
  EXPECT_EQ(y.device().type(), at::kMeta);
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{3, 5, 40}));
}

TEST(Int4Linear, MismatchedShapesNameTheTensorAndTheExpectation) {
  const Case c{64, 40, 32, true, at::kBFloat16};
  const auto packed = random_int4(c, 12);
  const auto blocks = repack_for_cpu(packed);
  const auto x = random_input(1, 96, 13);
  try {
    int4_linear(x, blocks);
    FAIL() << "a 96-wide input was accepted by a 64-wide weight";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("expected contiguous [1, 3, 1024]"), std::string::npos)
        << e.what();
  }
  try {
    int4_linear(x, int4_weight(packed));
    FAIL() << "a 96-wide input was accepted by the composite";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("expected [40, 12]"), std::string::npos) << e.what();
  }
  auto ints = random_input(1, 64, 14).to(at::kInt);
  EXPECT_THROW(int4_linear(ints, blocks), c10::ValueError);
}

TEST(Int4Linear, ActivationOrderingHasNoCpuBlocks) {
  auto packed = random_int4({64, 16, 32, true, at::kBFloat16}, 15);
  EXPECT_TRUE(cpu_blocks_supported(packed));
  packed.g_idx = at::zeros({64}, at::kInt);
  EXPECT_FALSE(cpu_blocks_supported(packed));
  auto narrow = random_int4({48, 16, 48, true, at::kBFloat16}, 16);
  EXPECT_FALSE(cpu_blocks_supported(narrow));
}

}  // namespace
}  // namespace torchtpu::ops

namespace torchtpu::ops {
namespace {

// The ATen ops the composite kernel runs (and the model ran before the operator existed).
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(at::kFloat);
  auto normed = xf * at::pow(xf.pow(2).mean(-1, /*keepdim=*/true) + eps, -0.5);
  if (weight.defined()) normed = normed * weight;
  return normed.to(x.scalar_type());
}

TEST(RmsNorm, CpuKernelMatchesTheAtenFormulaWithinOneRounding) {
  at::manual_seed(21);
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (int64_t width : {256, 1536, 37}) {
      const auto x = (at::randn({3, 5, width}) * 4).to(dtype);
      const auto weight = at::rand({width}) + 0.5;
      for (const auto& w : {weight, at::Tensor()}) {
        const auto ours = rms_norm(x, w, 1e-6).to(at::kDouble);
        const auto aten = rms_norm_aten(x, w, 1e-6).to(at::kDouble);
        // One rounding of the output dtype (2^-8 relative for bf16, 2^-11 f16, f32: 1e-6).
        const double ulp = dtype == at::kBFloat16 ? 1.0 / 256
                           : dtype == at::kHalf   ? 1.0 / 2048
                                                  : 1e-6;
        EXPECT_LE((ours - aten).abs().max().item<double>(), ulp * aten.abs().max().item<double>())
            << c10::toString(dtype) << " width " << width;
      }
    }
  }
}

TEST(RmsNorm, MetaAndOtherDtypesTakeTheComposite) {
  const auto meta =
      rms_norm(at::empty({2, 8}, at::device(at::kMeta).dtype(at::kBFloat16)), at::Tensor(), 1e-6);
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.sizes(), (at::IntArrayRef{2, 8}));
  const auto x = at::randn({4, 16}, at::kDouble);
  EXPECT_TRUE(at::allclose(rms_norm(x, at::Tensor(), 1e-6), rms_norm_aten(x, at::Tensor(), 1e-6)));
}

// The attention formula as ATen ops, written out here independently of the op's composite.
// The formula; with f32_products its products run in f32 and are rounded to q's dtype.
at::Tensor attention_aten(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& qpos, const at::Tensor& kpos, int64_t window,
                          bool f32_products = false) {
  const int64_t B = q.size(0), H = q.size(1), R = q.size(2), T = qpos.size(1), S = k.size(2);
  auto matmul = [&](const at::Tensor& a, const at::Tensor& b) {
    if (!f32_products) return at::matmul(a, b);
    return at::matmul(a.to(at::kFloat), b.to(at::kFloat)).to(q.scalar_type());
  };
  auto scores = matmul(q, k.transpose(2, 3)).view({B, H, R / T, T, S});
  auto key = kpos.view({B, 1, 1, 1, S});
  auto query = qpos.view({B, 1, 1, T, 1});
  auto seen = (key >= 0) & (key <= query);
  if (window > 0) seen = seen & (key > query - window);
  auto probs = at::where(seen, scores, -INFINITY).to(at::kFloat).softmax(-1).to(q.scalar_type());
  return matmul(probs.view({B, H, R, S}), v);
}

struct Ring {
  at::Tensor q, k, v, qpos, kpos;
};

// A ring of `slots` written up to position `last` (wrapped: slot = position % slots), B rows at
// different positions, some slots still empty in the second row.
Ring random_ring(int64_t B, int64_t H, int64_t group, int64_t T, int64_t slots, int64_t d,
                 at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  Ring r;
  r.q = at::randn({B, H, group * T, d}).to(dtype);
  r.k = at::randn({B, H, slots, d}).to(dtype);
  r.v = at::randn({B, H, slots, d}).to(dtype);
  r.kpos = at::full({B, slots}, -1, at::kLong);
  r.qpos = at::empty({B, T}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t last = b == 0 ? slots + 5 : slots / 2;
    for (int64_t p = std::max<int64_t>(0, last - slots + 1); p <= last; ++p) {
      r.kpos[b][p % slots] = p;
    }
    for (int64_t t = 0; t < T; ++t) r.qpos[b][t] = last - (T - 1) + t;
  }
  return r;
}

TEST(Attention, CpuKernelIsAsCloseToFloat64AsTheAtenFormula) {
  struct Shape {
    int64_t B, H, group, T, slots, d, window;
  };
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (const Shape& s : {Shape{1, 1, 8, 1, 64, 256, 0}, Shape{2, 2, 4, 1, 40, 40, 16},
                           Shape{2, 1, 2, 3, 33, 512, 0}, Shape{1, 1, 8, 1, 700, 256, 512}}) {
      const auto r = random_ring(s.B, s.H, s.group, s.T, s.slots, s.d, dtype, 31);
      const auto ours = attention(r.q, r.k, r.v, r.qpos, r.kpos, s.window);
      ASSERT_EQ(ours.sizes(), r.q.sizes());
      ASSERT_EQ(ours.scalar_type(), dtype);
      const auto exact = attention_aten(r.q.to(at::kDouble), r.k.to(at::kDouble),
                                        r.v.to(at::kDouble), r.qpos, r.kpos, s.window);
      const auto aten = attention_aten(r.q, r.k, r.v, r.qpos, r.kpos, s.window);
      const double ours_err = rms(ours.to(at::kDouble) - exact);
      const double aten_err = rms(aten.to(at::kDouble) - exact);
      // f32 roundings are far below the error scale of bf16/f16: allow a small absolute floor.
      EXPECT_LE(ours_err, 1.5 * aten_err + 1e-6 * rms(exact))
          << c10::toString(dtype) << " slots " << s.slots << " d " << s.d << " window " << s.window
          << ": ours " << ours_err << ", aten " << aten_err;
    }
  }
}

// The formula in bf16 on the AVX-512 tier; below it (ATen's bf16 matmuls slow there) with its
// products in f32, rounded to bf16 as a bf16 matmul rounds them.
TEST(Attention, ChunksBeyondTheFusedRowsTakeTheFormula) {
  const auto r = random_ring(1, 1, 2, 12, 64, 64, at::kBFloat16, 5);
  const bool f32_products = !std::string(int4_cpu_isa()).starts_with("avx512");
  EXPECT_TRUE(at::equal(attention(r.q, r.k, r.v, r.qpos, r.kpos, 0),
                        attention_aten(r.q, r.k, r.v, r.qpos, r.kpos, 0, f32_products)));
}

TEST(Attention, MetaShapesAndPreciseErrors) {
  const auto r = random_ring(1, 1, 8, 1, 16, 32, at::kBFloat16, 7);
  const auto meta = attention(r.q.to(at::kMeta), r.k.to(at::kMeta), r.v.to(at::kMeta),
                              r.qpos.to(at::kMeta), r.kpos.to(at::kMeta), 0);
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.sizes(), r.q.sizes());
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              attention(r.q, r.k.narrow(3, 0, 16), r.v, r.qpos, r.kpos, 0);
            }).find("k and v must be [1, 1, S, 32]"),
            std::string::npos);
  EXPECT_NE(message([&] {
              attention(r.q, r.k, r.v, r.qpos, r.kpos.narrow(1, 0, 8), 0);
            }).find("key_pos must be [1, 16], got [1, 8]"),
            std::string::npos);
  const auto empty = at::full_like(r.kpos, -1);
  EXPECT_NE(message([&] {
              attention(r.q, r.k, r.v, r.qpos, empty, 0);
            }).find("a query row at position 21 sees no key"),
            std::string::npos);
}

TEST(GeluTanhMul, CpuKernelGivesTheAtenOpsBits) {
  at::manual_seed(41);
  // Wide enough to reach the saturated tails on both sides, plus a ragged length.
  const auto gate = at::randn({3, 6151}) * 4;
  const auto up = at::randn({3, 6151});
  const auto exact = at::gelu(gate.to(at::kDouble), "tanh") * up.to(at::kDouble);
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const auto g = gate.to(dtype), u = up.to(dtype);
    const auto ours = gelu_tanh_mul(g, u);
    const auto aten = at::gelu(g, "tanh") * u;
    if (std::string(int4_cpu_isa()) != "portable") {
      EXPECT_TRUE(at::equal(ours, aten)) << c10::toString(dtype);
    } else {
      // The portable kernel's std::tanh against ATen's vectorized one: as close to float64.
      const double ours_err = rms(ours.to(at::kDouble) - exact);
      const double aten_err = rms(aten.to(at::kDouble) - exact);
      EXPECT_LE(ours_err, 1.01 * aten_err) << c10::toString(dtype);
    }
  }
  // Rows read in place give the same values: a strided up (the per-layer input's slice), the two
  // halves of a fused gate/up output ([2, 3, 2·6151], batch and time dims), and rows that are not
  // evenly spaced (a transpose), which are copied first.
  const auto wide = at::randn({3, 2, 6151}).to(at::kBFloat16);
  const auto g = gate.to(at::kBFloat16);
  EXPECT_TRUE(at::equal(gelu_tanh_mul(g, wide.select(1, 1)),
                        gelu_tanh_mul(g, wide.select(1, 1).contiguous())));
  const auto fused = (at::randn({2, 3, 2 * 6151}) * 4).to(at::kBFloat16);
  const auto g2 = fused.narrow(-1, 0, 6151), u2 = fused.narrow(-1, 6151, 6151);
  EXPECT_TRUE(at::equal(gelu_tanh_mul(g2, u2), gelu_tanh_mul(g2.contiguous(), u2.contiguous())));
  const auto square = at::randn({64, 64}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(gelu_tanh_mul(square.t(), square),
                        gelu_tanh_mul(square.t().contiguous(), square)));
}

// Every value of a 16-bit format once, NaNs and infinities included.
at::Tensor every_value(at::ScalarType dtype) {
  return at::arange(-32768, 32768, at::kInt).to(at::kShort).view(dtype);
}

// Same bits, or NaN in both (the two may carry different NaN payloads); with the portable kernel
// (std::tanh, not Sleef's) the finite values within a rounding.
void expect_aten_values(const at::Tensor& ours, const at::Tensor& aten, const char* what) {
  if (std::string(int4_cpu_isa()) == "portable") {
    const auto finite = at::isfinite(aten);
    EXPECT_TRUE(at::allclose(ours.masked_select(finite).to(at::kDouble),
                             aten.masked_select(finite).to(at::kDouble), 1e-2, 1e-6))
        << what << " " << c10::toString(ours.scalar_type());
    return;
  }
  const auto same = at::eq(ours.view(at::kShort), aten.view(at::kShort)) |
                    (at::isnan(ours) & at::isnan(aten));
  const int64_t differ = same.logical_not().sum().item<int64_t>();
  EXPECT_EQ(differ, 0) << what << " " << c10::toString(ours.scalar_type()) << ": " << differ
                       << " of " << ours.numel() << " inputs differ";
}

// The 16-bit kernels look their results up in a table of the whole domain (elementwise.cpp), so
// every input is checked, not a sample.
TEST(GeluTanhMul, EverySixteenBitInputGivesTheAtenOpsBits) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto x = every_value(dtype);
    const auto up = at::randn({x.numel()}).to(dtype);
    expect_aten_values(gelu_tanh_mul(x, up), at::gelu(x, "tanh") * up, "gelu_tanh_mul");
  }
}

TEST(Softcap, EverySixteenBitInputGivesTheAtenOpsBits) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    for (double cap : {30.0, 50.0}) {
      const auto x = every_value(dtype);
      expect_aten_values(softcap(x, cap), at::tanh(x / cap) * cap, "softcap");
    }
  }
}

TEST(Softcap, CpuKernelGivesTheAtenOpsBits) {
  at::manual_seed(43);
  // Logits far inside and far beyond the cap, and a ragged length.
  const auto logits = at::randn({2, 262147}) * 40;
  const auto exact = at::tanh(logits.to(at::kDouble) / 30.0) * 30.0;
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const auto x = logits.to(dtype);
    const auto ours = softcap(x, 30.0);
    const auto aten = at::tanh(x / 30.0) * 30.0;
    if (std::string(int4_cpu_isa()) != "portable") {
      EXPECT_TRUE(at::equal(ours, aten)) << c10::toString(dtype);
    } else {
      EXPECT_LE(rms(ours.to(at::kDouble) - exact), 1.01 * rms(aten.to(at::kDouble) - exact))
          << c10::toString(dtype);
    }
  }
  const auto meta = softcap(at::empty({2, 8}, at::kMeta), 30.0);
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.sizes(), (at::IntArrayRef{2, 8}));
}

// Same values, or NaN in both.
bool same_or_both_nan(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         (at::eq(a, b) | (at::isnan(a) & at::isnan(b))).all().item<bool>();
}

// The head asks for f32 logits: the 16-bit kernels' results widened, every input once; other
// formats and f32 inputs take the composite, the ATen ops' result converted.
TEST(Softcap, AnF32OutputIsTheSixteenBitResultWidened) {
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto x = every_value(dtype);
    const auto wide = softcap(x, 30.0, at::kFloat);
    EXPECT_EQ(wide.scalar_type(), at::kFloat);
    EXPECT_TRUE(same_or_both_nan(wide, softcap(x, 30.0).to(at::kFloat))) << c10::toString(dtype);
    const auto rows = at::randn({3, 1000}).mul(40).to(dtype).narrow(1, 1, 999);
    EXPECT_TRUE(same_or_both_nan(softcap(rows, 50.0, at::kFloat),
                                 softcap(rows.contiguous(), 50.0).to(at::kFloat)));
  }
  const auto x = at::randn({2, 100}) * 40;
  EXPECT_TRUE(at::equal(softcap(x, 30.0, at::kFloat), at::tanh(x / 30.0) * 30.0));
  const auto b = x.to(at::kBFloat16);
  EXPECT_TRUE(at::equal(softcap(b, 30.0, at::kHalf), (at::tanh(b / 30.0) * 30.0).to(at::kHalf)));
  EXPECT_TRUE(at::equal(softcap(b, 30.0, at::kBFloat16), softcap(b, 30.0)));
  const auto meta = softcap(at::empty({2, 8}, at::kMeta).to(at::kBFloat16), 30.0, at::kFloat);
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.scalar_type(), at::kFloat);
  EXPECT_EQ(meta.sizes(), (at::IntArrayRef{2, 8}));
}

void expect_aten_argmax(const at::Tensor& x, const std::string& what) {
  const auto ours = argmax_last(x);
  const auto aten = at::argmax(x, -1);
  EXPECT_EQ(ours.scalar_type(), at::kLong) << what;
  EXPECT_TRUE(ours.sizes() == aten.sizes() && at::equal(ours, aten))
      << what << ": ours " << ours.flatten().slice(0, 0, 8) << ", ATen's "
      << aten.flatten().slice(0, 0, 8);
}

TEST(Argmax, RandomRowsGiveAtensIndices) {
  at::manual_seed(53);
  // Logits of E2B's vocabulary, a ragged width over several pieces, rows shorter than a vector.
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {8, 262144}, {1, 262147}, {3, 65537}, {4, 17}, {5, 15}, {2, 3, 40}, {1}, {0, 5}}) {
    expect_aten_argmax(at::randn(shape), "randn " + c10::str(at::IntArrayRef(shape)));
  }
  const auto wide = at::randn({300, 6});
  expect_aten_argmax(wide.t(), "transposed");
  expect_aten_argmax(at::randn({3, 1000}).to(at::kBFloat16), "bf16");
}

// Equal maxima anywhere (one lane, other lanes, other pieces, the tail): the first wins, as for
// ATen; and where there is a NaN, the first NaN.
TEST(Argmax, TiesGiveTheFirstIndexAndNanWins) {
  const int64_t width = 262147;  // 8 pieces of about 32 Ki values, and a tail of 3
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<std::vector<std::pair<int64_t, float>>> rows = {
      {{5, 7.0f}, {21, 7.0f}},             // two lanes' first vectors
      {{40000, 7.0f}, {100, 7.0f}},        // the first piece before the second
      {{262146, 7.0f}},                    // the tail alone
      {{262145, 7.0f}, {3, 7.0f}},         // the tail and the first vector
      {{70000, 7.0f}, {70016, 7.0f}},      // one lane, twice
      {{9, nan}, {2, 7.0f}},               // a NaN after the maximum
      {{200000, nan}, {150000, nan}},      // NaNs in two pieces
      {{262146, nan}, {5, inf}},           // a NaN in the tail
      {{0, 7.0f}, {1, 7.0f}},              // the very first value
  };
  auto x = at::randn({static_cast<int64_t>(rows.size()), width});
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const auto& [at_index, value] : rows[r]) x[r][at_index] = value;
  }
  expect_aten_argmax(x, "ties and NaNs");
  expect_aten_argmax(at::full({2, 1000}, -inf), "all -inf");
  auto zeros = at::zeros({1, 100});
  zeros[0][0] = -0.0f;
  expect_aten_argmax(zeros, "-0 before +0");
  expect_aten_argmax(at::full({1, 33}, nan), "all NaN");
}

TEST(Argmax, EmptyRowsAndMetaAsAten) {
  EXPECT_THROW(argmax_last(at::empty({3, 0})), c10::Error);
  EXPECT_THROW(at::argmax(at::empty({3, 0}), -1), c10::Error);
  const auto meta = argmax_last(at::empty({4, 262144}, at::kMeta));
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.scalar_type(), at::kLong);
  EXPECT_EQ(meta.sizes(), (at::IntArrayRef{4}));
}

// Every row of a call gets the bits it gets alone, whatever the rows beside it, the call's shape or
// the threads: a Batch's float32 promise rests on it. Shapes: a tile's width and the vectors'
// length met exactly, and not (ragged outputs, inputs short of a vector), and E2B's MLP.
TEST(DenseLinear, EachRowHasTheBitsItHasAlone) {
  at::manual_seed(59);
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{
           {64, 256}, {100, 7}, {33, 5}, {7, 3}, {1536, 640}}) {
    const auto w = at::randn({n, k});
    const auto x = at::randn({133, k});
    std::vector<at::Tensor> rows;
    for (int64_t m = 0; m < x.size(0); ++m) rows.push_back(dense_linear(x.narrow(0, m, 1), w));
    const auto alone = at::cat(rows);
    std::vector<int64_t> counts = {133, 64};
    for (int64_t m = 1; m <= 40; ++m) counts.push_back(m);
    for (const int64_t m : counts) {
      EXPECT_TRUE(at::equal(dense_linear(x.narrow(0, 0, m), w), alone.narrow(0, 0, m)))
          << "k " << k << " n " << n << ", " << m << " rows";
    }
    const int threads = at::get_num_threads();
    at::set_num_threads(1);
    EXPECT_TRUE(at::equal(dense_linear(x, w), alone)) << "k " << k << " n " << n << ", 1 thread";
    at::set_num_threads(threads);
    EXPECT_TRUE(at::equal(dense_linear(x.view({7, 19, k}), w), alone.view({7, 19, n})))
        << "k " << k << " n " << n << ", [7, 19, k]";
  }
}

// Within float32's bound for any order of summation, k·2⁻²⁴·Σ|x·w| per output, of the float64
// product.
TEST(DenseLinear, WithinFloat32sBoundOfTheFloat64Product) {
  at::manual_seed(61);
  for (const auto& [k, n] : std::vector<std::pair<int64_t, int64_t>>{
           {64, 256}, {100, 7}, {33, 5}, {7, 3}, {1536, 640}}) {
    const auto w = at::randn({n, k}), x = at::randn({9, k});
    const auto exact = at::linear(x.to(at::kDouble), w.to(at::kDouble));
    const auto bound = at::linear(x.abs().to(at::kDouble), w.abs().to(at::kDouble)) *
                       (static_cast<double>(k) * std::ldexp(1.0, -24));
    const auto err = (dense_linear(x, w).to(at::kDouble) - exact).abs();
    EXPECT_TRUE((err <= bound).all().item<bool>())
        << "k " << k << " n " << n << ": worst error over bound "
        << (err / bound).max().item<double>();
  }
  const auto x = at::randn({3, 16}), w = at::randn({4, 16});
  const auto t = at::randn({16, 3}).t();  // a transposed input, made contiguous by the kernel
  EXPECT_TRUE(at::allclose(dense_linear(t, w), at::linear(t, w), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(dense_linear(x, w.t().contiguous().t()), at::linear(x, w), 1e-5, 1e-5));
}

// Other dtypes, empty shapes and Meta are at::linear's; so is a mismatched shape's error.
TEST(DenseLinear, OtherDtypesAndShapesAreAtensLinear) {
  const auto x = at::randn({5, 40}).to(at::kBFloat16), w = at::randn({6, 40}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(dense_linear(x, w), at::linear(x, w)));
  EXPECT_EQ(dense_linear(at::randn({0, 40}), at::randn({6, 40})).sizes(), (at::IntArrayRef{0, 6}));
  EXPECT_EQ(dense_linear(at::randn({2, 40}), at::randn({0, 40})).sizes(), (at::IntArrayRef{2, 0}));
  EXPECT_THROW(dense_linear(at::randn({2, 40}), at::randn({6, 41})), c10::Error);
  EXPECT_THROW(at::linear(at::randn({2, 40}), at::randn({6, 41})), c10::Error);
  const auto meta =
      dense_linear(at::empty({4, 1536}, at::kMeta), at::empty({6144, 1536}, at::kMeta));
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.sizes(), (at::IntArrayRef{4, 6144}));
}

TEST(Rope, CpuKernelGivesTheAtenOpsBits) {
  at::manual_seed(47);
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (int64_t d : {256, 512, 40}) {
      const auto x = at::randn({2, 3, 8, d}).to(dtype);
      const auto angles = at::randn({2, 3, 1, d}) * 3;
      const auto cos = angles.cos().to(dtype), sin = angles.sin().to(dtype);
      const int64_t half = d / 2;
      const auto rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
      EXPECT_TRUE(at::equal(rope(x, cos, sin), x * cos + rotated * sin))
          << c10::toString(dtype) << " d " << d;
    }
  }
  const auto x = at::randn({1, 2, 4, 64}).to(at::kBFloat16);
  const auto meta =
      rope(x.to(at::kMeta), x.narrow(2, 0, 1).to(at::kMeta), x.narrow(2, 0, 1).to(at::kMeta));
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.sizes(), x.sizes());
}

TEST(GeluTanhMul, MetaShapesAndPreciseErrors) {
  const auto meta = gelu_tanh_mul(at::empty({2, 8}, at::kMeta), at::empty({2, 8}, at::kMeta));
  EXPECT_EQ(meta.device().type(), at::kMeta);
  EXPECT_EQ(meta.sizes(), (at::IntArrayRef{2, 8}));
  try {
    gelu_tanh_mul(at::zeros({2, 8}), at::zeros({2, 9}));
    ADD_FAILURE() << "mismatched shapes were accepted";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(
        std::string(e.what_without_backtrace())
            .find("gate and up must share shape and dtype, got [2, 8] Float and [2, 9] Float"),
        std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
}  // namespace torchtpu::ops
