#include "model/make_tiny.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "io/safetensors.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* layer_type_name(LayerType t) {
  return t == LayerType::kSliding ? "sliding_attention" : "full_attention";
}

// One tensor to generate: values = mean + std * N(0, 1) (or uniform in [lo, hi]).
struct Recipe {
  std::string name;
  std::vector<int64_t> shape;
  double mean = 0, std = 0;
  bool uniform = false;
  double lo = 0, hi = 0;
};

Dtype file_dtype(const std::string& s) {
  if (s == "f32") return Dtype::kF32;
  if (s == "bf16") return Dtype::kBF16;
  if (s == "f16") return Dtype::kF16;
  throw ValueError("make-tiny: unknown dtype '" + s + "' (expected f32, bf16 or f16)");
}

// Values depend only on the seed and the tensor name, so shard counts and dtypes never change
// what a tensor holds (beyond rounding). Large tensors are generated in row blocks to bound memory.
TensorToWrite generate(const Recipe& r, uint64_t seed, Dtype dtype) {
  const uint64_t name_hash = std::hash<std::string>{}(r.name);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 0x9E3779B97F4A7C15ULL ^ name_hash);
  const auto type = dtype == Dtype::kF32    ? at::kFloat
                    : dtype == Dtype::kBF16 ? at::kBFloat16
                                            : at::kHalf;
  int64_t numel = 1;
  for (auto d : r.shape) numel *= d;
  TensorToWrite out{r.name, dtype, r.shape, std::vector<uint8_t>(numel * dtype_size(dtype))};
  const int64_t block = int64_t{1} << 24;
  for (int64_t begin = 0; begin < numel; begin += block) {
    const int64_t n = std::min(block, numel - begin);
    at::Tensor values = r.uniform ? at::empty({n}, at::kFloat).uniform_(r.lo, r.hi, gen)
                                  : at::empty({n}, at::kFloat).normal_(r.mean, r.std, gen);
    values = values.to(type).contiguous();
    std::memcpy(out.bytes.data() + begin * dtype_size(dtype), values.data_ptr(),
                n * dtype_size(dtype));
  }
  return out;
}

std::vector<Recipe> recipes(const TinySpec& s) {
  const int64_t L = static_cast<int64_t>(s.layer_types.size());
  const int64_t H = s.hidden;
  const std::string& p = s.prefix;
  std::vector<Recipe> all;
  auto linear = [&](const std::string& name, int64_t out, int64_t in) {
    all.push_back({name, {out, in}, 0.0, 1.0 / std::sqrt(static_cast<double>(in))});
  };
  auto norm = [&](const std::string& name, int64_t dim, double mean) {
    all.push_back({name, {dim}, mean, 0.1 * mean});
  };
  // Embedding rows of norm ~4 after the sqrt(hidden) scale spread the logits over a few units:
  // far from the soft-cap, but with clear greedy margins.
  all.push_back({p + "embed_tokens.weight", {s.vocab, H}, 0.0, 4.0 / std::sqrt(double(H))});
  if (s.ple > 0) {
    all.push_back({p + "embed_tokens_per_layer.weight", {s.vocab, L * s.ple}, 0.0, 0.1});
    linear(p + "per_layer_model_projection.weight", L * s.ple, H);
    norm(p + "per_layer_projection_norm.weight", s.ple, 1.0);
  }
  norm(p + "norm.weight", H, 1.0);
  if (s.untied) all.push_back({"lm_head.weight", {s.vocab, H}, 0.0, 4.0 / std::sqrt(double(H))});
  const int64_t first_shared = L - s.shared;
  for (int64_t l = 0; l < L; ++l) {
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    const bool full = s.layer_types[l] == LayerType::kFull;
    const int64_t d = full ? s.global_head_dim : s.head_dim;
    const bool shared = l >= first_shared;
    const int64_t F = s.intermediate * (shared && s.double_wide ? 2 : 1);
    norm(lp + "input_layernorm.weight", H, 1.0);
    // Branch outputs a little louder than the embedding, so layers move the stream.
    norm(lp + "post_attention_layernorm.weight", H, 2.0);
    norm(lp + "pre_feedforward_layernorm.weight", H, 1.0);
    norm(lp + "post_feedforward_layernorm.weight", H, 2.0);
    linear(lp + "self_attn.q_proj.weight", s.heads * d, H);
    norm(lp + "self_attn.q_norm.weight", d, 1.0);
    if (!shared || s.dead_shared_kv) {
      linear(lp + "self_attn.k_proj.weight", s.kv_heads * d, H);
      linear(lp + "self_attn.v_proj.weight", s.kv_heads * d, H);
      // q.k over unit-RMS vectors of dim d has spread sqrt(d); a k_norm near 1/sqrt(d)
      // (the real model's are ~0.06-0.12 at d = 256) keeps the softmax from collapsing.
      norm(lp + "self_attn.k_norm.weight", d, 1.5 / std::sqrt(static_cast<double>(d)));
    }
    linear(lp + "self_attn.o_proj.weight", H, s.heads * d);
    linear(lp + "mlp.gate_proj.weight", F, H);
    linear(lp + "mlp.up_proj.weight", F, H);
    linear(lp + "mlp.down_proj.weight", H, F);
    if (s.ple > 0) {
      linear(lp + "per_layer_input_gate.weight", s.ple, H);
      linear(lp + "per_layer_projection.weight", H, s.ple);
      norm(lp + "post_per_layer_input_norm.weight", H, 1.0);
    }
    Recipe scalar{lp + "layer_scalar", {1}};
    scalar.uniform = true;
    scalar.lo = 0.3;
    scalar.hi = 0.8;
    all.push_back(scalar);
  }
  return all;
}

json config_json(const TinySpec& s) {
  const int64_t L = static_cast<int64_t>(s.layer_types.size());
  json types = json::array();
  for (auto t : s.layer_types) types.push_back(layer_type_name(t));
  json text = {
      {"model_type", "gemma4_text"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"num_hidden_layers", L},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"num_global_key_value_heads", nullptr},
      {"head_dim", s.head_dim},
      {"global_head_dim", s.global_head_dim},
      {"intermediate_size", s.intermediate},
      {"use_double_wide_mlp", s.double_wide},
      {"hidden_size_per_layer_input", s.ple},
      {"vocab_size_per_layer_input", s.vocab},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"max_position_embeddings", 131072},
      {"rms_norm_eps", 1e-6},
      {"sliding_window", s.window},
      {"layer_types", types},
      {"rope_parameters",
       {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
        {"full_attention",
         {{"rope_type", "proportional"},
          {"rope_theta", 1000000.0},
          {"partial_rotary_factor", 0.25}}}}},
      {"final_logit_softcapping", s.softcap},
      {"num_kv_shared_layers", s.shared},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"attention_k_eq_v", false},
      {"enable_moe_block", false},
      {"use_bidirectional_attention", nullptr},
      {"tie_word_embeddings", !s.untied},
      {"pad_token_id", 0},
      {"bos_token_id", 2},
      {"eos_token_id", 1},
      {"dtype", s.dtype == "f32"    ? "float32"
                : s.dtype == "bf16" ? "bfloat16"
                                    : "float16"},
  };
  if (s.prefix == "model.") {
    text["architectures"] = {"Gemma4ForCausalLM"};
    text["eos_token_id"] = {1, 106};
    return text;
  }
  return {{"model_type", "gemma4"},   {"architectures", {"Gemma4ForConditionalGeneration"}},
          {"text_config", text},      {"tie_word_embeddings", !s.untied},
          {"eos_token_id", {1, 106}}, {"dtype", text["dtype"]}};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f) throw FormatError("cannot write " + path.string());
}

}  // namespace

TinySpec tiny_preset(const std::string& name) {
  TinySpec s;
  using enum LayerType;
  if (name == "tiny") {
    // Non-shared S S S F (the last two [sliding, full], as llama.cpp's KV-reuse rule needs),
    // shared S S F.
    s.layer_types = {kSliding, kSliding, kSliding, kFull, kSliding, kSliding, kFull};
    return s;
  }
  if (name == "e2b") {
    s.vocab = 262144;
    s.hidden = 1536;
    s.heads = 8;
    s.kv_heads = 1;
    s.head_dim = 256;
    s.global_head_dim = 512;
    s.intermediate = 6144;
    s.double_wide = true;
    s.ple = 256;
    s.window = 512;
    s.shared = 20;
    s.dtype = "bf16";
    s.shards = 4;
    s.layer_types.clear();
    for (int i = 0; i < 7; ++i) {
      for (int j = 0; j < 4; ++j) s.layer_types.push_back(kSliding);
      s.layer_types.push_back(kFull);
    }
    return s;
  }
  throw ValueError("unknown preset '" + name + "' (expected tiny or e2b)");
}

namespace {

// make_tiny's files, into `dir`, which exists and is empty.
void write_tiny(const fs::path& dir, const TinySpec& spec) {
  if (spec.prefix != "model.language_model." && spec.prefix != "model.") {
    throw ValueError("make-tiny: --prefix must be model.language_model. or model., got '" +
                     spec.prefix + "'");
  }
  if (spec.layer_types.empty()) throw ValueError("make-tiny: a checkpoint needs at least 1 layer");
  if (spec.shared >= static_cast<int64_t>(spec.layer_types.size()) || spec.shared < 0) {
    throw ValueError("make-tiny: --shared " + std::to_string(spec.shared) +
                     " must be below the layer count " + std::to_string(spec.layer_types.size()));
  }
  if (spec.shards < 1) throw ValueError("make-tiny: --shards must be at least 1");
  const Dtype dtype = file_dtype(spec.dtype);
  write_text(dir / "config.json", config_json(spec).dump(2) + "\n");
  write_text(dir / "generation_config.json", json{{"bos_token_id", 2},
                                                  {"eos_token_id", {1, 106, 50}},
                                                  {"pad_token_id", 0},
                                                  {"do_sample", true},
                                                  {"temperature", 1.0},
                                                  {"top_k", 64},
                                                  {"top_p", 0.95}}
                                                     .dump(2) +
                                                 "\n");
  // Parse what we wrote through the loader's own validation: a spec the engine would refuse is
  // refused here, before gigabytes are written.
  load_config(dir.string());

  const auto all = recipes(spec);
  int64_t total = 0;
  std::vector<int64_t> sizes;
  for (const auto& r : all) {
    int64_t n = static_cast<int64_t>(dtype_size(dtype));
    for (auto d : r.shape) n *= d;
    sizes.push_back(n);
    total += n;
  }
  // Contiguous runs of roughly total / shards bytes; one shard is written and freed at a time.
  const int64_t target = (total + spec.shards - 1) / spec.shards;
  std::vector<std::vector<size_t>> shards(1);
  int64_t filled = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (filled >= target && static_cast<int64_t>(shards.size()) < spec.shards) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(i);
    filled += sizes[i];
  }
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = spec.shards == 1
                                 ? "model.safetensors"
                                 : "weights-part" + std::to_string(s + 1) + ".safetensors";
    std::vector<TensorToWrite> tensors;
    for (size_t i : shards[s]) {
      tensors.push_back(generate(all[i], spec.seed, dtype));
      weight_map[all[i].name] = file;
    }
    write_safetensors((dir / file).string(), tensors);
  }
  if (spec.shards > 1) {
    write_text(
        dir / "model.safetensors.index.json",
        json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
  }
  if (!spec.tokenizer_dir.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
      const fs::path from = fs::path(spec.tokenizer_dir) / name;
      if (fs::exists(from)) {
        fs::copy_file(from, dir / name, fs::copy_options::overwrite_existing);
      }
    }
  }
}

}  // namespace

void make_tiny(const std::string& out, const TinySpec& spec) {
  // The files of another checkpoint left beside the new ones (an index naming other shards) would
  // be read in their place.
  fs::path target(out);
  if (!target.has_filename()) target = target.parent_path();
  std::error_code ec;
  if (fs::exists(target, ec) && (!fs::is_directory(target, ec) || !fs::is_empty(target, ec))) {
    throw ValueError("make-tiny: OUT " + out + " exists and is not an empty directory");
  }
  // Written beside OUT and moved into place whole: a refused spec or a failed write leaves nothing
  // that looks like a checkpoint.
  fs::path staging = target;
  staging += ".tmp-" + std::to_string(getpid());
  fs::remove_all(staging, ec);
  try {
    fs::create_directories(staging);
    write_tiny(staging, spec);
    fs::rename(staging, target);
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace torchtpu
