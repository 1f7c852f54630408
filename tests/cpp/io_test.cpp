// Checkpoint reading: safetensors validation, checkpoint directories, config.json.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/memory.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "io_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file from a literal header and data buffer, for corrupt layouts.
std::string raw_file(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

// Expects opening `bytes` as a safetensors file to fail with a FormatError whose message names the
// file and contains every one of `parts`.
void expect_format_error(const std::string& bytes, std::vector<std::string> parts) {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  write_bytes(path, bytes);
  try {
    SafetensorsFile f(path);
    FAIL() << "no error for " << path;
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
    for (const auto& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

std::vector<uint8_t> iota_bytes(size_t n, uint8_t start = 1) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i);
  return v;
}

TEST(Safetensors, FileShorterThanEightBytesIsTruncated) {
  expect_format_error(std::string("\x05\x00\x00", 3), {"truncated file", "3 bytes"});
}

TEST(Safetensors, HeaderLengthPastTheEndOfTheFile) {
  std::string f = raw_file("{}", "");
  f[0] = 100;
  expect_format_error(f, {"header length 100 runs past the end of the file (10 bytes)"});
}

TEST(Safetensors, InvalidHeaderJson) {
  expect_format_error(raw_file("{\"a\": ", ""), {"invalid header JSON"});
}

// A header nested a million deep overflowed the stack when its error message dumped the entry
// (found by feeding tests/fuzz/safetensors_fuzz such a header).
TEST(Safetensors, HeaderNestedTooDeepIsRefusedWhileParsing) {
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  expect_format_error(raw_file("{\"w\": " + deep + "}", ""), {"nest deeper than 64 levels"});
  const std::string at_limit = std::string(63, '[') + std::string(63, ']');
  expect_format_error(raw_file("{\"w\": " + at_limit + "}", ""),
                      {"tensor w: entry must be an object"});
}

TEST(Safetensors, HeaderMustBeAnObject) {
  expect_format_error(raw_file("[1, 2]", ""),
                      {"invalid header JSON: expected an object, got array"});
}

TEST(Safetensors, DuplicateTensorNameInHeader) {
  const std::string e = R"({"dtype":"U8","shape":[0],"data_offsets":[0,0]})";
  expect_format_error(raw_file("{\"w\":" + e + ",\"w\":" + e + "}", ""), {"duplicate key \"w\""});
}

TEST(Safetensors, TensorEntryMustBeAnObject) {
  expect_format_error(raw_file(R"({"w": [1]})", ""), {"tensor w: entry must be an object"});
}

TEST(Safetensors, MissingField) {
  expect_format_error(raw_file(R"({"w": {"dtype": "U8", "shape": [1]}})", "x"),
                      {"tensor w: missing field \"data_offsets\""});
}

TEST(Safetensors, NegativeDimension) {
  expect_format_error(
      raw_file(R"({"w": {"dtype": "U8", "shape": [2, -1], "data_offsets": [0, 0]}})", ""),
      {"tensor w: negative dimension -1"});
}

TEST(Safetensors, UnknownDtypeNamesDtypeAndTensor) {
  expect_format_error(
      raw_file(R"({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})", "x"),
      {"tensor w: unknown dtype \"F8_E4M3\""});
}

TEST(Safetensors, MetadataValuesMustBeStrings) {
  expect_format_error(raw_file(R"({"__metadata__": {"format": 1}})", ""),
                      {"__metadata__ value for \"format\" must be a string"});
}

TEST(Safetensors, OffsetsBeginAfterEnd) {
  expect_format_error(
      raw_file(R"({"w": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}})", "xx"),
      {"tensor w: data_offsets begin 2 is greater than end 1"});
}

TEST(Safetensors, OffsetsPastTheBufferAreTruncatedData) {
  expect_format_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", "12345678"),
      {"tensor w: data_offsets [0, 16] out of range: the data buffer has 8 bytes"});
}

TEST(Safetensors, BytesMustMatchDtypeTimesShape) {
  expect_format_error(
      raw_file(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678"),
      {"tensor w: data_offsets span 8 bytes but dtype F32 x shape [3] needs 12 bytes"});
}

TEST(Safetensors, OverlappingTensors) {
  expect_format_error(raw_file(R"({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                   "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
                               "123456"),
                      {"tensor b [2, 6] overlaps tensor a ending at 4"});
}

TEST(Safetensors, GapBetweenTensors) {
  expect_format_error(raw_file(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                   "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})",
                               "123456"),
                      {"gap of 2 bytes before tensor b at offset 4 (after tensor a)"});
}

TEST(Safetensors, GapBeforeTheFirstTensor) {
  expect_format_error(
      raw_file(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}})", "123"),
      {"gap of 1 bytes before tensor a at offset 1"});
}

TEST(Safetensors, TrailingGarbageAfterTheLastTensor) {
  expect_format_error(
      raw_file(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}})", "12345"),
      {"3 trailing bytes after the last tensor (data buffer is 5 bytes, tensors end at 2)"});
}

TEST(Safetensors, MissingFileIsNotFound) {
  TempDir dir;
  EXPECT_THROW(SafetensorsFile(dir / "none.safetensors"), NotFoundError);
}

// Tensors packed with no regard for alignment (as some numpy writers do) read back exactly, even
// though their data pointers are unaligned.
TEST(Safetensors, UnalignedTensorsReadCorrectly) {
  const float f[2] = {1.5f, -2.25f};
  const int64_t i64 = -1234567890123LL;
  const uint16_t bf16 = 0x3f80;
  std::string data = "abc";
  data.append(reinterpret_cast<const char*>(f), 8);
  data.append(reinterpret_cast<const char*>(&i64), 8);
  data.append(reinterpret_cast<const char*>(&bf16), 2);
  // Data starts 2 bytes past an 8-byte boundary: f, i and b all land misaligned.
  std::string header = R"({"c":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},)"
                       R"("f":{"dtype":"F32","shape":[2],"data_offsets":[3,11]},)"
                       R"("i":{"dtype":"I64","shape":[],"data_offsets":[11,19]},)"
                       R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[19,21]}})";
  while ((8 + header.size()) % 8 != 2) header += ' ';
  TempDir dir;
  write_bytes(dir / "u.safetensors", raw_file(header, data));
  SafetensorsFile file(dir / "u.safetensors");
  const auto& t = file.tensors();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.at("c").data), 3), "abc");
  float fr[2];
  std::memcpy(fr, t.at("f").data, 8);
  EXPECT_EQ(fr[0], 1.5f);
  EXPECT_EQ(fr[1], -2.25f);
  EXPECT_NE(reinterpret_cast<uintptr_t>(t.at("f").data) % 4, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(t.at("i").data) % 8, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(t.at("b").data) % 2, 0u);
  int64_t ir;
  std::memcpy(&ir, t.at("i").data, 8);
  EXPECT_EQ(ir, i64);
  EXPECT_TRUE(t.at("i").shape.empty());
  EXPECT_EQ(t.at("i").numel(), 1);
  uint16_t br;
  std::memcpy(&br, t.at("b").data, 2);
  EXPECT_EQ(br, 0x3f80);
  EXPECT_EQ(t.at("f").file, dir / "u.safetensors");
}

TEST(Safetensors, EmptyTensorsAndScalars) {
  TempDir dir;
  write_bytes(dir / "e.safetensors",
              raw_file(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                       R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                       R"("z":{"dtype":"I8","shape":[3,0],"data_offsets":[4,4]}})",
                       "1234"));
  SafetensorsFile file(dir / "e.safetensors");
  EXPECT_EQ(file.tensors().at("e").numel(), 0);
  EXPECT_EQ(file.tensors().at("e").nbytes, 0u);
  EXPECT_EQ(file.tensors().at("z").numel(), 0);
  EXPECT_EQ(file.tensors().at("s").numel(), 1);
  EXPECT_EQ(file.tensors().at("s").nbytes, 4u);
}

TEST(Safetensors, DtypeTable) {
  const std::vector<std::pair<std::string, size_t>> expected = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"I16", 2}, {"U16", 2}, {"F16", 2}, {"BF16", 2},
      {"I32", 4},  {"U32", 4}, {"F32", 4}, {"F64", 8}, {"I64", 8}, {"U64", 8}};
  for (const auto& [name, size] : expected) {
    const Dtype d = parse_dtype(name, "here");
    EXPECT_EQ(dtype_name(d), name);
    EXPECT_EQ(dtype_size(d), size);
  }
  EXPECT_THROW(parse_dtype("bf16", "here"), FormatError);
}

TEST(Safetensors, WriteThenReadRoundTrip) {
  TempDir dir;
  const std::vector<TensorToWrite> tensors = {
      {"flag", Dtype::kBool, {3}, {1, 0, 1}},    {"w", Dtype::kBF16, {2, 3}, iota_bytes(12)},
      {"b", Dtype::kF32, {}, iota_bytes(4, 50)}, {"idx", Dtype::kI64, {2}, iota_bytes(16, 100)},
      {"empty", Dtype::kF16, {0}, {}},
  };
  write_safetensors(dir / "rt.safetensors", tensors, {{"format", "pt"}, {"note", "x"}});
  SafetensorsFile file(dir / "rt.safetensors");
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const TensorView& v = file.tensors().at(t.name);
    EXPECT_EQ(v.dtype, t.dtype) << t.name;
    EXPECT_EQ(v.shape, t.shape) << t.name;
    EXPECT_EQ(std::vector<uint8_t>(v.data, v.data + v.nbytes), t.bytes) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u) << t.name;
  }
  std::ifstream in(dir / "rt.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(in.get(), '{');
}

// The loader drops a weight's mapped pages once it has copied them (dequantized, converted,
// moved to a device); the view must still read the same bytes afterwards, its neighbours too.
TEST(Safetensors, ReleasedPagesLeaveTheResidentSetAndReadBackUnchanged) {
  TempDir dir;
  const size_t big = size_t{48} << 20;
  std::vector<uint8_t> big_bytes(big);
  for (size_t i = 0; i < big; ++i) big_bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  write_safetensors(dir / "r.safetensors",
                    {{"before", Dtype::kU8, {5}, iota_bytes(5, 7)},
                     {"big", Dtype::kU8, {static_cast<int64_t>(big)}, big_bytes},
                     {"after", Dtype::kU8, {3}, iota_bytes(3, 90)}});
  SafetensorsFile file(dir / "r.safetensors");
  const TensorView& view = file.tensors().at("big");
  auto checksum = [&] {
    uint64_t sum = 0;
    for (size_t i = 0; i < view.nbytes; ++i) sum = sum * 31 + view.data[i];
    return sum;
  };
  const uint64_t expected = checksum();  // touches every page
  const int64_t touched = resident_bytes();
  release_pages(view);
  const int64_t released = resident_bytes();
  EXPECT_GE(touched - released, static_cast<int64_t>(big) * 3 / 4)
      << "VmRSS " << touched << " -> " << released;
  EXPECT_EQ(checksum(), expected);
  const TensorView& before = file.tensors().at("before");
  const TensorView& after = file.tensors().at("after");
  EXPECT_EQ(std::vector<uint8_t>(before.data, before.data + before.nbytes), iota_bytes(5, 7));
  EXPECT_EQ(std::vector<uint8_t>(after.data, after.data + after.nbytes), iota_bytes(3, 90));
}

TEST(Safetensors, WriteRejectsBytesThatDoNotMatchTheShape) {
  TempDir dir;
  EXPECT_THROW(write_safetensors(dir / "x.safetensors", {{"w", Dtype::kF32, {2}, iota_bytes(4)}}),
               ValueError);
  EXPECT_THROW(write_safetensors(dir / "x.safetensors",
                                 {{"w", Dtype::kU8, {1}, {1}}, {"w", Dtype::kU8, {1}, {1}}}),
               ValueError);
}

// ---- checkpoint directories ----

void write_json(const std::string& path, const json& j) { write_bytes(path, j.dump()); }

TensorToWrite u8(const std::string& name, uint8_t v = 7) { return {name, Dtype::kU8, {1}, {v}}; }

TEST(Checkpoint, SingleFileWithTextPrefix) {
  TempDir dir;
  write_json(dir / "config.json", json::object());
  write_safetensors(dir / "model.safetensors",
                    {u8("model.embed_tokens.weight"), u8("model.norm.weight")});
  Checkpoint ckpt(dir.str());
  EXPECT_EQ(ckpt.prefix(), "model.");
  EXPECT_EQ(ckpt.names(),
            (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  EXPECT_EQ(ckpt.get("model.norm.weight").data[0], 7);
  EXPECT_EQ(ckpt.find("lm_head.weight"), nullptr);
  EXPECT_EQ(ckpt.file_if_exists("tokenizer.json"), "");
  write_bytes(dir / "tokenizer.json", "{}");
  EXPECT_EQ(ckpt.file_if_exists("tokenizer.json"), dir / "tokenizer.json");
}

TEST(Checkpoint, MultimodalPrefix) {
  TempDir dir;
  write_json(dir / "config.json", json::object());
  write_safetensors(dir / "model.safetensors",
                    {u8("model.language_model.embed_tokens.weight"),
                     u8("model.vision_tower.patch.weight"), u8("model.embed_vision.weight")});
  EXPECT_EQ(Checkpoint(dir.str()).prefix(), "model.language_model.");
}

TEST(Checkpoint, NoEmbeddingUnderEitherPrefix) {
  TempDir dir;
  write_json(dir / "config.json", json::object());
  write_safetensors(dir / "model.safetensors", {u8("embed_tokens.weight")});
  try {
    Checkpoint c(dir.str());
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr(dir.str()), HasSubstr("has no model.embed_tokens.weight")));
  }
}

TEST(Checkpoint, MissingTensorNamesTensorAndDir) {
  TempDir dir;
  write_json(dir / "config.json", json::object());
  write_safetensors(dir / "model.safetensors", {u8("model.embed_tokens.weight")});
  Checkpoint ckpt(dir.str());
  try {
    ckpt.get("model.layers.0.mlp.up_proj.weight");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_STREQ(
        e.what(),
        ("checkpoint " + dir.str() + " has no tensor model.layers.0.mlp.up_proj.weight").c_str());
  }
}

TEST(Checkpoint, ConfigJsonMustExist) {
  TempDir dir;
  write_safetensors(dir / "model.safetensors", {u8("model.embed_tokens.weight")});
  EXPECT_THAT([&] { Checkpoint c(dir.str()); },
              ::testing::ThrowsMessage<FormatError>(HasSubstr("has no config.json")));
}

TEST(Checkpoint, NoSafetensorsFiles) {
  TempDir dir;
  write_json(dir / "config.json", json::object());
  EXPECT_THAT(
      [&] { Checkpoint c(dir.str()); },
      ::testing::ThrowsMessage<FormatError>(HasSubstr("no safetensors files in " + dir.str())));
}

TEST(Checkpoint, AllSafetensorsFilesWithoutIndex) {
  TempDir dir;
  write_json(dir / "config.json", json::object());
  write_safetensors(dir / "b.safetensors", {u8("model.norm.weight")});
  write_safetensors(dir / "a.safetensors", {u8("model.embed_tokens.weight")});
  Checkpoint ckpt(dir.str());
  EXPECT_EQ(ckpt.names().size(), 2u);
  EXPECT_EQ(ckpt.get("model.norm.weight").file, dir / "b.safetensors");
  write_safetensors(dir / "c.safetensors", {u8("model.norm.weight")});
  EXPECT_THAT([&] { Checkpoint c(dir.str()); },
              ::testing::ThrowsMessage<FormatError>(
                  AllOf(HasSubstr("tensor model.norm.weight is present in two shards"),
                        HasSubstr(dir / "b.safetensors"), HasSubstr(dir / "c.safetensors"))));
}

// A sharded checkpoint whose shard names follow no pattern (xbill9's per-layer repacks).
class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    write_json(dir / "config.json", json::object());
    write_safetensors(dir / "model-layer-000.safetensors",
                      {u8("model.language_model.layers.0.mlp.up_proj.weight", 1),
                       u8("model.language_model.layers.0.mlp.down_proj.weight", 2)});
    write_safetensors(dir / "rest.safetensors",
                      {u8("model.language_model.embed_tokens.weight", 3)});
    index = {
        {"metadata", {{"total_size", 123}}},
        {"weight_map",
         {{"model.language_model.layers.0.mlp.up_proj.weight", "model-layer-000.safetensors"},
          {"model.language_model.layers.0.mlp.down_proj.weight", "model-layer-000.safetensors"},
          {"model.language_model.embed_tokens.weight", "rest.safetensors"}}}};
    // A stray file the index does not name must not be read.
    write_bytes(dir / "stale.safetensors", "garbage");
  }
  std::string load_error() {
    write_json(dir / "model.safetensors.index.json", index);
    try {
      Checkpoint c(dir.str());
    } catch (const FormatError& e) {
      return e.what();
    }
    return "no error";
  }
  TempDir dir;
  json index;
};

TEST_F(ShardedCheckpoint, LoadsThroughTheWeightMap) {
  write_json(dir / "model.safetensors.index.json", index);
  Checkpoint ckpt(dir.str());
  EXPECT_EQ(ckpt.prefix(), "model.language_model.");
  EXPECT_EQ(ckpt.names().size(), 3u);
  const TensorView& up = ckpt.get("model.language_model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.file, dir / "model-layer-000.safetensors");
  EXPECT_EQ(up.data[0], 1);
  EXPECT_EQ(ckpt.get("model.language_model.embed_tokens.weight").data[0], 3);
}

TEST_F(ShardedCheckpoint, TensorListedButMissingFromItsShard) {
  index["weight_map"]["model.language_model.norm.weight"] = "rest.safetensors";
  EXPECT_THAT(load_error(),
              AllOf(HasSubstr("model.safetensors.index.json"),
                    HasSubstr("tensor model.language_model.norm.weight in shard "
                              "rest.safetensors"),
                    HasSubstr(dir / "rest.safetensors"), HasSubstr("does not contain it")));
}

TEST_F(ShardedCheckpoint, TensorInTwoShards) {
  write_safetensors(dir / "rest.safetensors",
                    {u8("model.language_model.embed_tokens.weight", 3),
                     u8("model.language_model.layers.0.mlp.up_proj.weight", 9)});
  EXPECT_THAT(
      load_error(),
      AllOf(HasSubstr("tensor model.language_model.layers.0.mlp.up_proj.weight is present "
                      "in two shards"),
            HasSubstr(dir / "model-layer-000.safetensors"), HasSubstr(dir / "rest.safetensors")));
}

TEST_F(ShardedCheckpoint, ShardHoldsATensorTheIndexDoesNotList) {
  index["weight_map"].erase("model.language_model.layers.0.mlp.down_proj.weight");
  EXPECT_THAT(load_error(),
              AllOf(HasSubstr(dir / "model-layer-000.safetensors"),
                    HasSubstr("holds tensor model.language_model.layers.0.mlp.down_proj.weight"),
                    HasSubstr("does not list")));
}

TEST_F(ShardedCheckpoint, IndexNamesAMissingShard) {
  index["weight_map"]["model.language_model.norm.weight"] = "gone.safetensors";
  EXPECT_THAT(load_error(), HasSubstr("in shard gone.safetensors, which does not exist"));
}

TEST_F(ShardedCheckpoint, ShardNameOutsideTheDirectory) {
  index["weight_map"]["model.language_model.norm.weight"] = "../x.safetensors";
  EXPECT_THAT(load_error(), HasSubstr("not a file name inside the checkpoint directory"));
}

TEST_F(ShardedCheckpoint, IndexWithoutWeightMap) {
  index = {{"metadata", json::object()}};
  EXPECT_THAT(load_error(), HasSubstr("missing the \"weight_map\" object"));
}

TEST_F(ShardedCheckpoint, CorruptShardNamesTheShard) {
  write_bytes(dir / "rest.safetensors", "abc");
  EXPECT_THAT(load_error(), AllOf(HasSubstr(dir / "rest.safetensors"), HasSubstr("truncated")));
}

// ---- config.json ----

// The E2B config.json as the research note (§1) reconstructs it.
json e2b_config() {
  json layer_types = json::array();
  for (int r = 0; r < 7; ++r) {
    for (int i = 0; i < 4; ++i) layer_types.push_back("sliding_attention");
    layer_types.push_back("full_attention");
  }
  json text = {
      {"model_type", "gemma4_text"},
      {"vocab_size", 262144},
      {"hidden_size", 1536},
      {"num_hidden_layers", 35},
      {"num_attention_heads", 8},
      {"num_key_value_heads", 1},
      {"num_global_key_value_heads", nullptr},
      {"head_dim", 256},
      {"global_head_dim", 512},
      {"intermediate_size", 6144},
      {"use_double_wide_mlp", true},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"max_position_embeddings", 131072},
      {"rms_norm_eps", 1e-6},
      {"sliding_window", 512},
      {"layer_types", layer_types},
      {"rope_parameters",
       {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
        {"full_attention",
         {{"rope_type", "proportional"},
          {"rope_theta", 1000000.0},
          {"partial_rotary_factor", 0.25}}}}},
      {"final_logit_softcapping", 30.0},
      {"num_kv_shared_layers", 20},
      {"hidden_size_per_layer_input", 256},
      {"vocab_size_per_layer_input", 262144},
      {"attention_k_eq_v", false},
      {"attention_bias", false},
      {"use_bidirectional_attention", nullptr},
      {"enable_moe_block", false},
      {"tie_word_embeddings", true},
      {"pad_token_id", 0},
      {"eos_token_id", 1},
      {"bos_token_id", 2},
  };
  return {{"model_type", "gemma4"},      {"architectures", {"Gemma4ForConditionalGeneration"}},
          {"tie_word_embeddings", true}, {"eos_token_id", {1, 106}},
          {"image_token_id", 258880},    {"text_config", text}};
}

ModelConfig parse(const json& j) { return parse_config_json(j.dump(), "dir/config.json"); }

// The FormatError message of parsing `j`, which must name the file.
std::string config_error(const json& j) {
  try {
    parse(j);
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("dir/config.json: "));
    return e.what();
  }
  return "no error";
}

TEST(Config, E2BFields) {
  const ModelConfig c = parse(e2b_config());
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.hidden_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 35);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.global_head_dim, 512);
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_TRUE(c.use_double_wide_mlp);
  EXPECT_EQ(c.hidden_size_per_layer_input, 256);
  EXPECT_EQ(c.vocab_size_per_layer_input, 262144);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.final_logit_softcapping, 30.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.num_kv_shared_layers, 20);
  EXPECT_EQ(c.first_shared_layer(), 15);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
  EXPECT_FALSE(c.quantization.has_value());
  EXPECT_EQ(c.rope_sliding.rope_type, "default");
  EXPECT_EQ(c.rope_sliding.theta, 10000.0);
  EXPECT_EQ(c.rope_sliding.partial_rotary_factor, 1.0);
  EXPECT_EQ(c.rope_full.rope_type, "proportional");
  EXPECT_EQ(c.rope_full.theta, 1000000.0);
  EXPECT_EQ(c.rope_full.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rope_full.factor, 1.0);
  for (int64_t l = 0; l < 35; ++l) {
    const bool full = l % 5 == 4;  // full layers at 4, 9, ..., 34
    EXPECT_EQ(c.layer_types[l], full ? LayerType::kFull : LayerType::kSliding) << l;
    EXPECT_EQ(c.layer_head_dim(l), full ? 512 : 256) << l;
    EXPECT_EQ(c.mlp_width(l), l < 15 ? 6144 : 12288) << l;
    EXPECT_EQ(&c.rope(l), full ? &c.rope_full : &c.rope_sliding) << l;
  }
}

TEST(Config, E2BKvSourceMatchesTheResearchNote) {
  const ModelConfig c = parse(e2b_config());
  for (int64_t l = 0; l < 15; ++l) EXPECT_EQ(c.kv_source(l), l);
  for (int64_t l : {15, 16, 17, 18, 20, 21, 22, 23, 25, 26, 27, 28, 30, 31, 32, 33}) {
    EXPECT_EQ(c.kv_source(l), 13) << l;
  }
  for (int64_t l : {19, 24, 29, 34}) EXPECT_EQ(c.kv_source(l), 14) << l;
  EXPECT_THROW(c.kv_source(35), ValueError);
}

TEST(Config, FlattenedTextLayout) {
  json j = e2b_config()["text_config"];
  j["eos_token_id"] = {1, 106};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.num_hidden_layers, 35);
  EXPECT_EQ(c.global_head_dim, 512);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1, 106}));
}

// transformers >= 5.24 writes per-layer head dims instead of global_head_dim.
TEST(Config, PerLayerConfigVariant) {
  json j = e2b_config();
  j["text_config"].erase("global_head_dim");
  j["text_config"].erase("num_global_key_value_heads");
  json plc = json::object();
  for (int l = 4; l < 35; l += 5) {
    plc[(l < 10 ? "0" : "") + std::to_string(l)] = {{"head_dim", 512}};
  }
  j["text_config"]["per_layer_config"] = plc;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.global_head_dim, 512);
  EXPECT_EQ(c.layer_head_dim(4), 512);
  EXPECT_EQ(c.layer_head_dim(3), 256);

  j["text_config"]["per_layer_config"]["09"] = {{"head_dim", 128}};
  EXPECT_THAT(config_error(j),
              AllOf(HasSubstr("text_config.per_layer_config.9"), HasSubstr("{\"head_dim\":128}"),
                    HasSubstr("full layers must all have the same head_dim")));
  j["text_config"]["per_layer_config"] = {{"03", {{"sliding_window", 64}}}};
  EXPECT_THAT(config_error(j), HasSubstr("text_config.per_layer_config.03.sliding_window = 64 is "
                                         "not supported"));
  j["text_config"]["per_layer_config"] = {{"35", {{"head_dim", 64}}}};
  EXPECT_THAT(config_error(j), HasSubstr("per_layer_config.35 is not a layer index in [0, 35)"));
}

// Absent fields take transformers' defaults (Gemma4TextConfig, configuration_gemma4.py).
TEST(Config, DefaultsFollowTransformers) {
  const ModelConfig c = parse({{"model_type", "gemma4_text"}});
  EXPECT_EQ(c.vocab_size, 262144);
  EXPECT_EQ(c.hidden_size, 2304);
  EXPECT_EQ(c.intermediate_size, 9216);
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.num_attention_heads, 8);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.global_head_dim, 512);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_EQ(c.final_logit_softcapping, 0.0);
  EXPECT_EQ(c.hidden_size_per_layer_input, 256);
  EXPECT_EQ(c.num_kv_shared_layers, 0);
  EXPECT_FALSE(c.use_double_wide_mlp);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  for (int64_t l = 0; l < 30; ++l) {
    EXPECT_EQ(c.layer_types[l], (l + 1) % 6 ? LayerType::kSliding : LayerType::kFull) << l;
  }
  EXPECT_EQ(c.rope_full.rope_type, "proportional");
  EXPECT_EQ(c.rope_full.partial_rotary_factor, 0.25);
  EXPECT_EQ(c.rope_full.theta, 1e6);
  EXPECT_EQ(c.rope_sliding.theta, 1e4);
}

// vision_config as transformers 5.24 writes E2B's (Gemma4VisionConfig); null or absent: no tower.
TEST(Config, VisionConfig) {
  json j = e2b_config();
  EXPECT_FALSE(parse(j).vision.has_value());
  j["vision_config"] = nullptr;
  EXPECT_FALSE(parse(j).vision.has_value());
  j["vision_config"] = {{"model_type", "gemma4_vision"},
                        {"hidden_size", 768},
                        {"intermediate_size", 3072},
                        {"num_hidden_layers", 16},
                        {"num_attention_heads", 12},
                        {"num_key_value_heads", 12},
                        {"head_dim", 64},
                        {"hidden_activation", "gelu_pytorch_tanh"},
                        {"rms_norm_eps", 1e-6},
                        {"rope_parameters", {{"rope_theta", 100.0}, {"rope_type", "axial"}}},
                        {"pooling_kernel_size", 3},
                        {"patch_size", 16},
                        {"position_embedding_size", 10240},
                        {"use_clipped_linears", true},
                        {"standardize", false},
                        {"attention_bias", false}};
  j["boi_token_id"] = 255999;
  j["eoi_token_id"] = nullptr;
  const ModelConfig c = parse(j);
  ASSERT_TRUE(c.vision.has_value());
  EXPECT_EQ(c.vision->hidden_size, 768);
  EXPECT_EQ(c.vision->num_hidden_layers, 16);
  EXPECT_EQ(c.vision->head_dim, 64);
  EXPECT_EQ(c.vision->rope_theta, 100.0);
  EXPECT_EQ(c.vision->pooling_kernel_size, 3);
  EXPECT_EQ(c.vision->patch_size, 16);
  EXPECT_EQ(c.vision->position_embedding_size, 10240);
  EXPECT_TRUE(c.vision->use_clipped_linears);
  EXPECT_FALSE(c.vision->standardize);
  EXPECT_EQ(c.image_token_id, 258880);
  EXPECT_EQ(c.boi_token_id, 255999);
  EXPECT_EQ(c.eoi_token_id, -1);

  json bad = j;
  bad["vision_config"]["rope_parameters"]["rope_type"] = "default";
  EXPECT_THAT(config_error(bad), HasSubstr("vision_config.rope_parameters.rope_type = \"default\" "
                                           "is not supported: the vision encoder's RoPE is "
                                           "\"axial\""));
  bad = j;
  bad["vision_config"]["head_dim"] = 66;
  EXPECT_THAT(config_error(bad), HasSubstr("vision_config.head_dim = 66 is not supported: axial "
                                           "RoPE needs a multiple of 4"));
  bad = j;
  bad["vision_config"]["hidden_activation"] = "silu";
  EXPECT_THAT(config_error(bad), HasSubstr("vision_config.hidden_activation = \"silu\" is not "
                                           "supported"));
  bad = j;
  bad["vision_config"]["patch_size"] = 0;
  EXPECT_THAT(config_error(bad), HasSubstr("vision_config.patch_size must be positive, got 0"));
  bad = j;
  bad["vision_config"] = 3;
  EXPECT_THAT(config_error(bad), HasSubstr("vision_config must be an object or null, got 3"));
  bad = j;
  bad["image_token_id"] = "x";
  EXPECT_THAT(config_error(bad), HasSubstr("image_token_id must be an integer, got \"x\""));
}

TEST(Config, EosIdsUnionWithGenerationConfig) {
  TempDir dir;
  json j = e2b_config();
  j["text_config"]["eos_token_id"] = {106, 1};
  write_json(dir / "config.json", j);
  EXPECT_EQ(load_config(dir.str()).eos_token_ids, (std::vector<int64_t>{106, 1}));
  write_json(dir / "generation_config.json", {{"eos_token_id", {1, 106, 50}}, {"top_k", 64}});
  EXPECT_EQ(load_config(dir.str()).eos_token_ids, (std::vector<int64_t>{106, 1, 50}));
}

// A generation_config.json nested a million deep overflowed the stack (found by feeding
// tests/fuzz/config_fuzz such a file); config.json and it are refused while parsing.
TEST(Config, JsonNestedTooDeepIsRefused) {
  TempDir dir;
  write_json(dir / "config.json", e2b_config());
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  write_bytes(dir / "generation_config.json", R"({"eos_token_id": )" + deep + "}");
  EXPECT_THAT([&] { load_config(dir.str()); },
              ::testing::ThrowsMessage<FormatError>(HasSubstr("nest deeper than 64 levels")));
  EXPECT_THAT([&] { parse_config_json(R"({"vocab_size": )" + deep + "}", "config.json"); },
              ::testing::ThrowsMessage<FormatError>(HasSubstr("nest deeper than 64 levels")));
}

TEST(Config, LoadConfigWithoutConfigJson) {
  TempDir dir;
  EXPECT_THAT([&] { load_config(dir.str()); },
              ::testing::ThrowsMessage<FormatError>(HasSubstr("has no config.json")));
}

TEST(Config, TieWordEmbeddingsFromEitherLevel) {
  json j = e2b_config();
  j.erase("tie_word_embeddings");
  j["text_config"]["tie_word_embeddings"] = false;
  EXPECT_FALSE(parse(j).tie_word_embeddings);
  j["tie_word_embeddings"] = true;
  EXPECT_THAT(config_error(j),
              HasSubstr("tie_word_embeddings = true contradicts text_config.tie_word_embeddings"));
}

TEST(Config, QuantizationConfig) {
  json j = e2b_config();
  j["quantization_config"] = {{"quant_method", "compressed-tensors"},
                              {"format", "pack-quantized"},
                              {"config_groups",
                               {{"group_0",
                                 {{"targets", {"Linear"}},
                                  {"weights",
                                   {{"num_bits", 4},
                                    {"type", "int"},
                                    {"symmetric", true},
                                    {"strategy", "group"},
                                    {"group_size", 32},
                                    {"actorder", nullptr}}}}}}},
                              {"ignore", {"lm_head", "re:.*vision.*"}}};
  ModelConfig c = parse(j);
  ASSERT_TRUE(c.quantization.has_value());
  EXPECT_EQ(c.quantization->format, "pack-quantized");
  ASSERT_EQ(c.quantization->groups.size(), 1u);
  EXPECT_EQ(c.quantization->groups[0].targets, (std::vector<std::string>{"Linear"}));
  EXPECT_EQ(c.quantization->groups[0].group_size, 32);
  EXPECT_EQ(c.quantization->groups[0].strategy, "group");
  EXPECT_EQ(c.quantization->groups[0].actorder, "");
  EXPECT_EQ(c.quantization->ignore, (std::vector<std::string>{"lm_head", "re:.*vision.*"}));

  // The text-only repacks keep it inside the flattened config.
  json flat = e2b_config()["text_config"];
  flat["quantization_config"] = j["quantization_config"];
  flat["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel";
  flat["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = nullptr;
  c = parse(flat);
  EXPECT_EQ(c.quantization->groups[0].group_size, -1);

  j["quantization_config"]["quant_method"] = "gptq";
  EXPECT_THAT(config_error(j),
              HasSubstr("quantization_config.quant_method = \"gptq\" is not supported"));
}

struct BadConfig {
  const char* name;
  std::function<void(json&)> edit;  // edits text_config of the E2B config
  std::string message;
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, NamesFieldAndValue) {
  json j = e2b_config();
  GetParam().edit(j["text_config"]);
  EXPECT_THAT(config_error(j), HasSubstr(GetParam().message));
}

const BadConfig kBadConfigs[] = {
    {"UnknownRopeType",
     [](json& t) { t["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; },
     "text_config.rope_parameters.full_attention.rope_type = \"yarn\" is not supported"},
    {"RopeScalingFactor",
     [](json& t) { t["rope_parameters"]["sliding_attention"]["factor"] = 8.0; },
     "text_config.rope_parameters.sliding_attention.factor = 8.0 is not supported"},
    {"RopeMissingTheta",
     [](json& t) { t["rope_parameters"]["sliding_attention"].erase("rope_theta"); },
     "text_config.rope_parameters.sliding_attention.rope_theta must be a number"},
    {"RopePartialFactorOnDefault",
     [](json& t) { t["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 0.5; },
     "text_config.rope_parameters.sliding_attention.partial_rotary_factor = 0.5 is not supported"},
    {"RopeUnknownKey", [](json& t) { t["rope_parameters"]["full_attention"]["beta_fast"] = 32; },
     "text_config.rope_parameters.full_attention.beta_fast = 32 is not supported"},
    {"RopeMissingLayerType", [](json& t) { t["rope_parameters"].erase("full_attention"); },
     "text_config.rope_parameters.full_attention is missing but layer_types uses full_attention"},
    {"RopeNotKeyedByLayerType",
     [](json& t) {
       t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
     },
     "text_config.rope_parameters.rope_theta = 10000.0 is not supported"},
    {"LayerTypesLengthMismatch", [](json& t) { t["layer_types"].erase(0); },
     "text_config.layer_types has 34 entries but num_hidden_layers = 35"},
    {"LayerTypeUnknown", [](json& t) { t["layer_types"][3] = "chunked_attention"; },
     "text_config.layer_types[3] = \"chunked_attention\" is not supported"},
    {"LastLayerSliding", [](json& t) { t["layer_types"][34] = "sliding_attention"; },
     "text_config.layer_types[34] = \"sliding_attention\" is not supported: the last layer must"},
    {"UnknownModelType", [](json& t) { t["model_type"] = "gemma3_text"; },
     "text_config.model_type = \"gemma3_text\" is not supported"},
    {"GlobalKvHeads", [](json& t) { t["num_global_key_value_heads"] = 2; },
     "text_config.num_global_key_value_heads = 2 is not supported"},
    {"KEqV", [](json& t) { t["attention_k_eq_v"] = true; },
     "text_config.attention_k_eq_v = true is not supported"},
    {"Moe", [](json& t) { t["enable_moe_block"] = true; },
     "text_config.enable_moe_block = true is not supported"},
    {"AttentionBias", [](json& t) { t["attention_bias"] = true; },
     "text_config.attention_bias = true is not supported"},
    {"Bidirectional", [](json& t) { t["use_bidirectional_attention"] = "vision"; },
     "text_config.use_bidirectional_attention = \"vision\" is not supported"},
    {"Activation", [](json& t) { t["hidden_activation"] = "silu"; },
     "text_config.hidden_activation = \"silu\" is not supported"},
    {"PleVocabSmaller", [](json& t) { t["vocab_size_per_layer_input"] = 1000; },
     "text_config.vocab_size_per_layer_input = 1000 is not supported"},
    // The default, when the field is absent, named by its value: the message read freed memory
    // before (found by tests/fuzz/config_fuzz).
    {"PleVocabDefaultSmaller",
     [](json& t) {
       t.erase("vocab_size_per_layer_input");
       t["vocab_size"] = 300000;
     },
     "text_config.vocab_size_per_layer_input = 262144 is not supported"},
    {"HeadsNotMultipleOfKvHeads",
     [](json& t) {
       t["num_attention_heads"] = 6;
       t["num_key_value_heads"] = 4;
     },
     "text_config.num_attention_heads = 6 is not a multiple of num_key_value_heads = 4"},
    {"NonPositiveSize", [](json& t) { t["hidden_size"] = 0; },
     "text_config.hidden_size must be positive, got 0"},
    {"SizeNotAnInteger", [](json& t) { t["head_dim"] = 256.5; },
     "text_config.head_dim must be an integer, got 256.5"},
    {"OddHeadDim", [](json& t) { t["head_dim"] = 255; },
     "text_config.head_dim = {\"head_dim\":255} is not supported: RoPE needs an even head_dim"},
    {"TooManySharedLayers", [](json& t) { t["num_kv_shared_layers"] = 35; },
     "text_config.num_kv_shared_layers = 35 must be in [0, num_hidden_layers = 35)"},
    {"SharedLayerWithoutSource", [](json& t) { t["num_kv_shared_layers"] = 31; },
     "text_config.num_kv_shared_layers = 31 leaves shared layer 4 (full_attention) without a "
     "non-shared layer of the same type"},
    {"SoftcapZero", [](json& t) { t["final_logit_softcapping"] = 0.0; },
     "text_config.final_logit_softcapping must be positive or null, got 0.0"},
    {"EosNotAnInteger",
     [](json& t) {
       t["eos_token_id"] = {1, "x"};
     },
     "text_config.eos_token_id must be an integer or a list of integers"},
};

INSTANTIATE_TEST_SUITE_P(Config, BadConfigTest, ::testing::ValuesIn(kBadConfigs),
                         [](const auto& info) { return std::string(info.param.name); });

// audio_config as transformers writes Gemma4AudioConfig() (E2B's encoder) beside the text config.
json audio_config() {
  return {{"model_type", "gemma4_audio"},
          {"hidden_size", 1024},
          {"num_hidden_layers", 12},
          {"num_attention_heads", 8},
          {"hidden_act", "silu"},
          {"subsampling_conv_channels", {128, 32}},
          {"conv_kernel_size", 5},
          {"residual_weight", 0.5},
          {"attention_chunk_size", 12},
          {"attention_context_left", 13},
          {"attention_context_right", 0},
          {"attention_logit_cap", 50.0},
          {"attention_invalid_logits_value", -1e9},
          {"use_clipped_linears", true},
          {"rms_norm_eps", 1e-6},
          {"gradient_clipping", 1e10},
          {"output_proj_dims", 1536},
          {"initializer_range", 0.02}};
}

TEST(Config, AudioConfigAndTokenIds) {
  json j = e2b_config();
  EXPECT_FALSE(parse(j).audio.has_value());
  j["audio_config"] = audio_config();
  j["audio_config"]["attention_context_right"] = 2;
  j["audio_config"]["hidden_act"] = "gelu_pytorch_tanh";
  j["audio_token_id"] = 7;
  j["boa_token_id"] = nullptr;
  const ModelConfig c = parse(j);
  ASSERT_TRUE(c.audio.has_value());
  const AudioConfig& a = *c.audio;
  EXPECT_EQ(a.hidden_size, 1024);
  EXPECT_EQ(a.num_hidden_layers, 12);
  EXPECT_EQ(a.num_attention_heads, 8);
  EXPECT_EQ(a.head_dim(), 128);
  EXPECT_EQ(a.hidden_act, "gelu_pytorch_tanh");
  EXPECT_EQ(a.subsampling_conv_channels[0], 128);
  EXPECT_EQ(a.subsampling_conv_channels[1], 32);
  EXPECT_EQ(a.conv_kernel_size, 5);
  EXPECT_EQ(a.residual_weight, 0.5);
  EXPECT_EQ(a.attention_chunk_size, 12);
  EXPECT_EQ(a.attention_context_left, 13);
  EXPECT_EQ(a.attention_context_right, 2);
  EXPECT_EQ(a.attention_logit_cap, 50.0);
  EXPECT_EQ(a.attention_invalid_logits_value, -1e9);
  EXPECT_TRUE(a.use_clipped_linears);
  EXPECT_EQ(a.rms_norm_eps, 1e-6);
  EXPECT_EQ(a.gradient_clipping, 1e10);
  EXPECT_EQ(a.output_proj_dims, 1536);
  EXPECT_EQ(c.audio_token_id, 7);
  EXPECT_EQ(c.boa_token_id, -1);
  EXPECT_EQ(c.eoa_token_index, 258883);
}

TEST(Config, AudioConfigErrorsNameTheField) {
  auto error = [](const char* key, const json& value) {
    json j = e2b_config();
    j["audio_config"] = audio_config();
    j["audio_config"][key] = value;
    return config_error(j);
  };
  EXPECT_THAT(error("hidden_act", "relu"),
              HasSubstr("audio_config.hidden_act = \"relu\" is not supported: only \"silu\""));
  EXPECT_THAT(error("subsampling_conv_channels", {128, 32, 8}),
              HasSubstr("audio_config.subsampling_conv_channels = [128,32,8] is not supported: "
                        "the subsampling stack has exactly two convolutions"));
  EXPECT_THAT(error("subsampling_conv_channels", {30, 32}),
              HasSubstr("first channel count must be a multiple of 4"));
  EXPECT_THAT(error("num_attention_heads", 3),
              HasSubstr("audio_config.hidden_size = 1024 is not a multiple of "
                        "num_attention_heads = 3"));
  EXPECT_THAT(error("attention_chunk_size", 0),
              HasSubstr("audio_config.attention_chunk_size must be positive, got 0"));
  EXPECT_THAT(error("attention_context_right", -1),
              HasSubstr("audio_config.attention_context_right must be 0 or positive, got -1"));
  EXPECT_THAT(error("use_clipped_linears", "yes"),
              HasSubstr("audio_config.use_clipped_linears must be true or false"));
  EXPECT_THAT(error("model_type", "whisper"),
              HasSubstr("audio_config.model_type = \"whisper\" is not supported"));
  json j = e2b_config();
  j["audio_config"] = 3;
  EXPECT_THAT(config_error(j), HasSubstr("audio_config must be an object, got 3"));
}

TEST(Config, TopLevelErrors) {
  EXPECT_THAT(config_error({{"model_type", "llama"}}),
              HasSubstr("model_type = \"llama\" is not supported: expected \"gemma4\", "
                        "\"gemma4_text\" or \"gemma4_assistant\""));
  EXPECT_THAT(config_error({{"model_type", "gemma4"}}),
              HasSubstr("text_config must be an object for model_type \"gemma4\""));
  try {
    parse_config_json("{\"model_type\": ", "dir/config.json");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_THAT(e.what(), HasSubstr("dir/config.json: invalid JSON"));
  }
}

// PEFT's adapter_config.json: the scaling of a module of rank r, and what cannot be applied.
TEST(LoraConfig, ScalingIsAlphaOverRankOrOverItsRootWithRsLora) {
  LoraConfig c = parse_lora_config_json(
      R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "base_model_name_or_path": "g"})", "a");
  EXPECT_EQ(c.r, 16);
  EXPECT_DOUBLE_EQ(c.scaling(16), 2.0);
  EXPECT_DOUBLE_EQ(c.scaling(4), 8.0);  // a rank_pattern module: its own rank, the same alpha
  EXPECT_EQ(c.base_model, "g");
  c = parse_lora_config_json(R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32,
                                 "use_rslora": true, "modules_to_save": null, "bias": "none",
                                 "alpha_pattern": {}, "use_dora": false})",
                             "a");
  EXPECT_DOUBLE_EQ(c.scaling(16), 8.0);
}

TEST(LoraConfig, WhatCannotBeAppliedIsRefusedByField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"peft_type": "PREFIX_TUNING"})", "peft_type must be \"LORA\""},
      {R"({"peft_type": "LORA", "r": -2})", "r must be positive, got -2"},
      {R"({"peft_type": "LORA", "lora_alpha": "x"})", "lora_alpha must be a number"},
      {R"({"peft_type": "LORA", "use_dora": true})", "use_dora = true is not supported: DoRA"},
      {R"({"peft_type": "LORA", "bias": "lora_only"})", "bias = \"lora_only\" is not supported"},
      {R"({"peft_type": "LORA", "modules_to_save": ["lm_head"]})",
       "modules_to_save = [\"lm_head\"] is not supported"},
      {R"({"peft_type": "LORA", "alpha_pattern": {"q_proj": 4}})", "alpha_pattern"},
      {R"([1, 2])", "expected a JSON object"},
  };
  for (const auto& [text, words] : cases) {
    try {
      parse_lora_config_json(text, "dir/adapter_config.json");
      ADD_FAILURE() << "no error for " << text;
    } catch (const FormatError& e) {
      EXPECT_THAT(e.what(), HasSubstr("dir/adapter_config.json: "));
      EXPECT_THAT(e.what(), HasSubstr(words)) << text;
    }
  }
}

}  // namespace
}  // namespace torchtpu
