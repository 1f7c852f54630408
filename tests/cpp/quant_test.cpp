// The pack-quantized reader: layout from the format's definition (research/formats.md §1.2, written
// out by hand here), validation with precise errors, config matching and the quantizer's bounds.
// Bit-exactness against the compressed-tensors library is tests/python/test_quant.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "quant/pack_quantized.h"
#include "quant/quantize.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
const std::string kModule = "model.layers.0.mlp.down_proj";

template <typename T>
TensorToWrite raw(const std::string& name, Dtype dtype, std::vector<int64_t> shape,
                  const std::vector<T>& values) {
  TensorToWrite t{name, dtype, std::move(shape), {}};
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  t.bytes.assign(p, p + values.size() * sizeof(T));
  return t;
}

TensorToWrite from_tensor(const std::string& name, const at::Tensor& tensor) {
  const at::Tensor c = tensor.contiguous();
  Dtype d = Dtype::kF32;
  if (c.scalar_type() == at::kInt) d = Dtype::kI32;
  if (c.scalar_type() == at::kLong) d = Dtype::kI64;
  if (c.scalar_type() == at::kBFloat16) d = Dtype::kBF16;
  if (c.scalar_type() == at::kHalf) d = Dtype::kF16;
  TensorToWrite t{name, d, c.sizes().vec(), {}};
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  t.bytes.assign(p, p + c.nbytes());
  return t;
}

std::string config_json(const std::string& weights, const std::string& targets = "[\"Linear\"]",
                        const std::string& ignore = "[\"lm_head\"]") {
  return R"({"model_type": "gemma4_text", "quantization_config": {"quant_method":
      "compressed-tensors", "format": "pack-quantized", "ignore": )" +
         ignore + R"(, "config_groups": {"group_0": {"targets": )" + targets + R"(, "weights": )" +
         weights + "}}}}";
}
const std::string kGroup32 =
    R"({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32})";
const std::string kGroup32Asym =
    R"({"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group", "group_size": 32})";

class QuantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("quant_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the tensors (plus the embed_tokens a checkpoint needs) and config.json.
  void write(std::vector<TensorToWrite> tensors, const std::string& config) {
    tensors.push_back(raw<float>("model.embed_tokens.weight", Dtype::kF32, {2, 2}, {0, 0, 0, 0}));
    write_safetensors((dir_ / "model.safetensors").string(), tensors);
    std::ofstream(dir_ / "config.json") << config;
  }
  PackedInt4 read(std::optional<Checkpoint>* keep) {
    keep->emplace(dir_.string());
    config_ = load_config(dir_.string());
    return read_packed(**keep, kModule, config_.quantization ? &*config_.quantization : nullptr);
  }
  // The FormatError message of reading kModule.
  std::string read_error() {
    std::optional<Checkpoint> ckpt;
    try {
      read(&ckpt);
    } catch (const FormatError& e) {
      return e.what();
    }
    ADD_FAILURE() << "read_packed accepted a corrupt module";
    return "";
  }

  // A consistent symmetric group-32 module [out, in] with all-zero packing and unit scales.
  std::vector<TensorToWrite> module_tensors(int64_t out, int64_t in) {
    return {from_tensor(kModule + ".weight_packed", at::zeros({out, (in + 7) / 8}, at::kInt)),
            from_tensor(kModule + ".weight_scale", at::ones({out, in / 32}, at::kBFloat16)),
            from_tensor(kModule + ".weight_shape", at::tensor({out, in}, at::kLong))};
  }
  void replace(std::vector<TensorToWrite>* tensors, TensorToWrite t) {
    for (auto& x : *tensors) {
      if (x.name == t.name) x = std::move(t);
    }
  }

  fs::path dir_;
  ModelConfig config_;
};

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << message << "\n  lacks: " << p;
}

// Column c of row r: word c / 8, nibble c % 8 (bits 4i..4i+3), stored as q + 8.
std::vector<int32_t> pack_by_hand(const std::vector<std::vector<int>>& q) {
  std::vector<int32_t> words;
  for (const auto& row : q) {
    for (size_t j = 0; j < (row.size() + 7) / 8; ++j) {
      uint32_t word = 0;
      for (size_t i = 0; i < 8 && 8 * j + i < row.size(); ++i) {
        word |= static_cast<uint32_t>(row[8 * j + i] + 8) << (4 * i);
      }
      words.push_back(static_cast<int32_t>(word));
    }
  }
  return words;
}

TEST_F(QuantTest, DequantizesTheDocumentedNibbleLayoutPerChannel) {
  const std::vector<std::vector<int>> q = {{-8, -7, -1, 0, 1, 2, 6, 7, 3, -3},
                                           {7, 6, 5, 4, 3, 2, 1, 0, -1, -2},
                                           {0, 0, 0, 0, 0, 0, 0, 0, -8, 7}};
  const std::vector<float> scale = {0.5f, 0.25f, 2.0f};
  write({raw<int32_t>(kModule + ".weight_packed", Dtype::kI32, {3, 2}, pack_by_hand(q)),
         raw<float>(kModule + ".weight_scale", Dtype::kF32, {3, 1}, scale),
         raw<int32_t>(kModule + ".weight_shape", Dtype::kI32, {2}, {3, 10})},
        R"({"model_type": "gemma4_text"})");
  std::optional<Checkpoint> ckpt;
  const PackedInt4 w = read(&ckpt);
  EXPECT_EQ(w.group_size, 10);
  const at::Tensor d = dequantize(w, at::kFloat);
  ASSERT_EQ(d.sizes(), (std::vector<int64_t>{3, 10}));
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 10; ++c)
      EXPECT_EQ(d[r][c].item<float>(), q[r][c] * scale[r]) << r << "," << c;
  }
  EXPECT_TRUE(at::equal(dequantize_rows(w, at::tensor({2, 0, 2}, at::kLong), at::kFloat),
                        d.index_select(0, at::tensor({2, 0, 2}, at::kLong))));
}

TEST_F(QuantTest, ZeroPointsArePackedAlongTheOutputDimension) {
  // 9 rows: the zero points of rows 0..7 fill word 0 of the column, row 8 starts word 1.
  std::vector<std::vector<int>> q(9, std::vector<int>(32, 3));
  std::vector<std::vector<int>> zero_cols = {{-8, -4, 0, 1, 2, 3, 7, -1}, {5}};
  std::vector<int32_t> zero_words = pack_by_hand(zero_cols);
  write({raw<int32_t>(kModule + ".weight_packed", Dtype::kI32, {9, 4}, pack_by_hand(q)),
         from_tensor(kModule + ".weight_scale", at::ones({9, 1}, at::kBFloat16)),
         raw<int64_t>(kModule + ".weight_shape", Dtype::kI64, {2}, {9, 32}),
         raw<int32_t>(kModule + ".weight_zero_point", Dtype::kI32, {2, 1}, zero_words)},
        config_json(kGroup32Asym));
  std::optional<Checkpoint> ckpt;
  const at::Tensor d = dequantize(read(&ckpt), at::kFloat);
  const std::vector<int> zero = {-8, -4, 0, 1, 2, 3, 7, -1, 5};
  for (int r = 0; r < 9; ++r) EXPECT_EQ(d[r][31].item<float>(), 3 - zero[r]) << r;
}

TEST_F(QuantTest, PackedWidthNotMatchingWeightShapeNamesTensorAndFile) {
  auto t = module_tensors(4, 64);
  replace(&t, from_tensor(kModule + ".weight_shape", at::tensor({4, 72}, at::kLong)));
  write(t, config_json(kGroup32));
  expect_contains(read_error(), {kModule + ".weight_packed", (dir_ / "model.safetensors").string(),
                                 "shape [4, 8] does not match weight_shape [4, 72]", "[4, 9]"});
}

TEST_F(QuantTest, ScaleShapeNotFittingTheGroupSizeIsAnError) {
  auto t = module_tensors(4, 64);
  replace(&t, from_tensor(kModule + ".weight_scale", at::ones({4, 4}, at::kBFloat16)));
  write(t, config_json(kGroup32));
  expect_contains(read_error(),
                  {kModule + ".weight_scale", "shape [4, 4]", "group size 32", "needs [4, 2]"});
}

TEST_F(QuantTest, ScaleWithWrongRowCountIsAnError) {
  auto t = module_tensors(4, 64);
  replace(&t, from_tensor(kModule + ".weight_scale", at::ones({5, 2}, at::kBFloat16)));
  write(t, config_json(kGroup32));
  expect_contains(read_error(),
                  {kModule + ".weight_scale", "shape [5, 2]", "expected [4, groups]"});
}

TEST_F(QuantTest, ZeroPointInASymmetricConfigIsAnError) {
  auto t = module_tensors(4, 64);
  t.push_back(from_tensor(kModule + ".weight_zero_point", at::zeros({1, 2}, at::kInt)));
  write(t, config_json(kGroup32));
  expect_contains(read_error(),
                  {kModule + ".weight_zero_point", "zero point is stored", "symmetric: true"});
}

TEST_F(QuantTest, AsymmetricConfigWithoutZeroPointIsAnError) {
  write(module_tensors(4, 64), config_json(kGroup32Asym));
  expect_contains(read_error(), {"symmetric: false", kModule + ".weight_zero_point is missing"});
}

TEST_F(QuantTest, ZeroPointOfTheWrongShapeIsAnError) {
  auto t = module_tensors(9, 64);
  t.push_back(from_tensor(kModule + ".weight_zero_point", at::zeros({1, 2}, at::kInt)));
  write(t, config_json(kGroup32Asym));
  expect_contains(read_error(), {kModule + ".weight_zero_point", "shape [1, 2]", "[2, 2]"});
}

TEST_F(QuantTest, WrongDtypesAreErrors) {
  auto t = module_tensors(4, 64);
  replace(&t, from_tensor(kModule + ".weight_scale", at::ones({4, 2}, at::kInt)));
  write(t, config_json(kGroup32));
  expect_contains(read_error(),
                  {kModule + ".weight_scale", "dtype I32 is not supported", "BF16 or F16 or F32"});
  t = module_tensors(4, 64);
  replace(&t, from_tensor(kModule + ".weight_packed", at::zeros({4, 8}, at::kLong)));
  write(t, config_json(kGroup32));
  expect_contains(read_error(), {kModule + ".weight_packed", "dtype I64"});
}

TEST_F(QuantTest, GIdxOutOfRangeIsAnError) {
  auto t = module_tensors(4, 64);
  at::Tensor g_idx = at::arange(64, at::kInt).div(32, "floor").to(at::kInt);
  g_idx[5] = 2;
  t.push_back(from_tensor(kModule + ".weight_g_idx", g_idx));
  write(t, config_json(kGroup32));
  expect_contains(read_error(), {kModule + ".weight_g_idx", "[0, 2]", "outside the 2 groups"});
}

TEST_F(QuantTest, GIdxSelectsTheScaleOfEachColumn) {
  auto t = module_tensors(2, 64);
  std::vector<std::vector<int>> q(2, std::vector<int>(64, 1));
  replace(&t, raw<int32_t>(kModule + ".weight_packed", Dtype::kI32, {2, 8}, pack_by_hand(q)));
  replace(&t, from_tensor(kModule + ".weight_scale",
                          at::tensor({1.0f, 4.0f, 2.0f, 8.0f}).view({2, 2})));
  at::Tensor g_idx = at::zeros({64}, at::kInt);
  g_idx[3] = 1;
  t.push_back(from_tensor(kModule + ".weight_g_idx", g_idx));
  write(t, config_json(kGroup32));
  std::optional<Checkpoint> ckpt;
  const at::Tensor d = dequantize(read(&ckpt), at::kFloat);
  EXPECT_EQ(d[0][3].item<float>(), 4.0f);
  EXPECT_EQ(d[0][40].item<float>(), 1.0f);
  EXPECT_EQ(d[1][3].item<float>(), 8.0f);
}

TEST_F(QuantTest, Int4TableWithTheWrongRowCountIsAnError) {
  write(module_tensors(10, 64), config_json(kGroup32));
  std::optional<Checkpoint> ckpt;
  const PackedInt4 w = read(&ckpt);
  EXPECT_NO_THROW(expect_shape(w, 10, 64, "vocab_size in config.json"));
  try {
    expect_shape(w, 12, 64, "vocab_size in config.json");
    ADD_FAILURE() << "expect_shape accepted a table of the wrong size";
  } catch (const FormatError& e) {
    expect_contains(e.what(), {kModule, (dir_ / "model.safetensors").string(), "[10, 64]",
                               "expected [12, 64] from vocab_size in config.json"});
  }
}

// A safetensors file with the tensors in the given order and no alignment of the data (our writer
// aligns, other writers such as xbill9's numpy one do not).
void write_in_order(const fs::path& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text;
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
}

TEST_F(QuantTest, UnalignedTensorsAreCopiedAndReadTheSame) {
  const at::Tensor weight = at::randn({16, 64}).to(at::kBFloat16);
  const PackedInt4 q = quantize_weight(weight, {32, false, std::nullopt}, kModule);
  write({}, config_json(kGroup32Asym));
  write_in_order(dir_ / "model.safetensors",
                 {raw<uint8_t>("a.pad", Dtype::kU8, {3}, {1, 2, 3}),
                  from_tensor(kModule + ".weight_packed", q.packed),
                  from_tensor(kModule + ".weight_scale", q.scale),
                  from_tensor(kModule + ".weight_shape", at::tensor({16, 64}, at::kLong)),
                  from_tensor(kModule + ".weight_zero_point", q.zero_point),
                  raw<float>("model.embed_tokens.weight", Dtype::kF32, {1}, {0})});
  std::optional<Checkpoint> ckpt;
  const PackedInt4 w = read(&ckpt);
  EXPECT_NE(reinterpret_cast<uintptr_t>(ckpt->get(kModule + ".weight_packed").data) % 4, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(ckpt->get(kModule + ".weight_scale").data) % 2, 0u);
  EXPECT_TRUE(at::equal(dequantize(w, at::kBFloat16), dequantize(q, at::kBFloat16)));
}

TEST_F(QuantTest, QuantizedWeightsStayWithinHalfAStep) {
  const at::Tensor weight = at::randn({37, 96}, at::kFloat);
  for (const bool symmetric : {true, false}) {
    const PackedInt4 q = quantize_weight(weight, {32, symmetric, std::nullopt}, kModule);
    EXPECT_EQ(q.zero_point.defined(), !symmetric);
    const at::Tensor step = q.scale.repeat_interleave(32, 1);
    const at::Tensor error = (dequantize(q, at::kFloat) - weight).abs();
    EXPECT_TRUE(error.le(step * 0.5001).all().item<bool>()) << "symmetric " << symmetric;
    const at::Tensor rows = at::tensor({36, 0, 8, 8, 17}, at::kLong);
    EXPECT_TRUE(at::equal(dequantize_rows(q, rows, at::kFloat),
                          dequantize(q, at::kFloat).index_select(0, rows)));
  }
}

// compressed-tensors' symmetric min-max quantization as ATen ops (its calculate_qparams and
// fake-quantize arithmetic), written out here independently of quantize_weight: q as int8 and
// the scales in their stored dtype.
std::pair<at::Tensor, at::Tensor> symmetric_aten(const at::Tensor& w, int64_t group,
                                                 std::optional<at::ScalarType> scale_dtype) {
  const auto wt = w.scalar_type();
  const auto ct = scale_dtype && *scale_dtype != wt ? at::kFloat : wt;
  const int64_t out = w.size(0), in = w.size(1);
  const auto x = w.to(ct).view({out, in / group, group});
  const auto lo = at::minimum(x.amin(-1), at::zeros({}, ct));
  const auto hi = at::maximum(x.amax(-1), at::zeros({}, ct));
  auto scale = at::maximum(lo.abs(), hi.abs()) / (at::scalar_tensor(15.0).to(ct) / 2);
  const auto store = scale_dtype.value_or(wt);
  if (scale_dtype) {
    const double limit = store == at::kHalf ? 65504.0 : 3.3895313892515355e+38;
    scale = at::clamp(scale, -limit, limit).to(store).to(ct);
  }
  const double eps = store == at::kBFloat16 ? 0.0078125
                     : store == at::kHalf   ? 0.0009765625
                                            : 1.1920928955078125e-07;
  scale = at::where(scale == 0, at::scalar_tensor(eps, scale.options()), scale);
  const auto q = at::round(at::clamp(x / scale.unsqueeze(-1), -8, 7)).to(at::kChar);
  return {q.view({out, in}), scale.to(store)};
}

TEST_F(QuantTest, SymmetricQuantizationHasCompressedTensorsBits) {
  at::manual_seed(11);
  for (auto dtype : {at::kBFloat16, at::kHalf, at::kFloat}) {
    for (std::optional<at::ScalarType> scale_dtype :
         {std::optional<at::ScalarType>(), std::optional(at::kHalf), std::optional(at::kBFloat16),
          std::optional(at::kFloat)}) {
      for (int64_t group : {32, 128, 8}) {
        // Rows of very different magnitudes, a zero group, and exact ties (s · (k + 1/2)).
        auto w = at::randn({24, 256}) * at::pow(10.0, at::arange(-3, 3, 0.25).view({24, 1}));
        w[3].narrow(0, 0, group).zero_();
        w[5] = (at::randint(-8, 7, {256}) + 0.5) * 0.25;
        w = w.to(dtype);
        const PackedInt4 ours = quantize_weight(w, {group, true, scale_dtype}, kModule);
        const auto [q, scale] = symmetric_aten(w, group, scale_dtype);
        const auto nibbles =
            (ours.packed.unsqueeze(-1).bitwise_right_shift(at::arange(0, 32, 4, at::kInt)) & 0xF)
                .view({24, 256}) -
            8;
        const std::string what = std::string(c10::toString(dtype)) + " scales " +
                                 (scale_dtype ? c10::toString(*scale_dtype) : "weight's") +
                                 " group " + std::to_string(group);
        EXPECT_TRUE(at::equal(nibbles.to(at::kChar), q)) << what;
        EXPECT_EQ(ours.scale.scalar_type(), scale.scalar_type()) << what;
        EXPECT_TRUE(at::equal(ours.scale, scale)) << what;
      }
    }
  }
}

TEST_F(QuantTest, QuantizeRefusesPartialGroups) {
  try {
    quantize_weight(at::zeros({4, 48}), {32, true, std::nullopt}, kModule);
    ADD_FAILURE() << "quantized 48 columns in groups of 32";
  } catch (const ValueError& e) {
    expect_contains(e.what(), {kModule, "48 input columns", "group size 32"});
  }
}

QuantizationConfig config_with(std::vector<QuantGroup> groups, std::vector<std::string> ignore) {
  QuantizationConfig c;
  c.quant_method = "compressed-tensors";
  c.format = "pack-quantized";
  c.groups = std::move(groups);
  c.ignore = std::move(ignore);
  return c;
}

TEST(QuantGroupFor, FollowsCompressedTensorsPrecedence) {
  QuantGroup linear, regex_b, regex_a, exact, embedding;
  linear.targets = {"Linear"};
  regex_b = regex_a = exact = embedding = linear;
  regex_b.targets = {"re:.*mlp\\.(gate|up)_proj$"};
  regex_a.targets = {"re:.*\\.mlp\\..*"};
  exact.targets = {"model.layers.0.mlp.up_proj"};
  embedding.targets = {"Embedding"};
  const auto c =
      config_with({linear, regex_b, regex_a, exact, embedding}, {"lm_head", "re:.*vision.*"});
  EXPECT_EQ(quant_group_for(c, "model.layers.0.self_attn.q_proj"), &c.groups[0]);
  EXPECT_EQ(quant_group_for(c, "model.layers.0.mlp.up_proj"), &c.groups[3]);
  // Both patterns match; "re:.*\.mlp\..*" sorts first, as compressed-tensors orders them.
  EXPECT_EQ(quant_group_for(c, "model.layers.0.mlp.gate_proj"), &c.groups[2]);
  EXPECT_EQ(quant_group_for(c, "model.embed_tokens"), &c.groups[4]);
  EXPECT_EQ(quant_group_for(c, "model.embed_tokens_per_layer"), &c.groups[4]);
  EXPECT_EQ(quant_group_for(c, "lm_head"), nullptr);
  EXPECT_EQ(quant_group_for(c, "model.vision_tower.fc"), nullptr);
  // re: patterns are anchored at the start like Python's re.match.
  const auto anchored = config_with({regex_b}, {});
  EXPECT_EQ(quant_group_for(config_with({[] {
                                          QuantGroup g;
                                          g.targets = {"re:mlp"};
                                          return g;
                                        }()},
                                        {}),
                            "model.layers.0.mlp.up_proj"),
            nullptr);
  EXPECT_EQ(quant_group_for(anchored, "model.layers.0.mlp.up_proj"), &anchored.groups[0]);
}

TEST(QuantGroupFor, InvalidPatternIsAFormatError) {
  QuantGroup g;
  g.targets = {"re:(unclosed"};
  EXPECT_THROW(quant_group_for(config_with({g}, {}), "x"), FormatError);
}

TEST_F(QuantTest, MismatchReportNamesBothDirections) {
  auto t = module_tensors(4, 64);
  t.push_back(from_tensor("model.layers.0.self_attn.q_proj.weight", at::zeros({4, 64})));
  t.push_back(from_tensor("model.norm.weight", at::zeros({64})));
  write(t, config_json(kGroup32, R"(["model.layers.0.self_attn.q_proj"])"));
  const Checkpoint ckpt(dir_.string());
  const ModelConfig config = load_config(dir_.string());
  const QuantMismatch m = quantized_modules_mismatch(ckpt, &*config.quantization);
  EXPECT_EQ(m.packed_not_targeted, std::vector<std::string>{kModule});
  EXPECT_EQ(m.targeted_not_packed, std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
  expect_contains(m.summary(dir_.string()),
                  {dir_.string(), "tensor names win", kModule, "self_attn.q_proj"});
  EXPECT_EQ(quantized_modules_mismatch(ckpt, nullptr).packed_not_targeted.size(), 1u);
}

TEST_F(QuantTest, ConsistentCheckpointHasNoMismatch) {
  auto t = module_tensors(4, 64);
  t.push_back(from_tensor("model.layers.0.input_layernorm.weight", at::zeros({64})));
  write(t, config_json(kGroup32));
  const Checkpoint ckpt(dir_.string());
  const ModelConfig config = load_config(dir_.string());
  const QuantMismatch m = quantized_modules_mismatch(ckpt, &*config.quantization);
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.summary(dir_.string()), "");
}

}  // namespace
}  // namespace torchtpu
