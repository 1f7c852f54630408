#include "quant/quantize.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cpu_float.h"
#include "common/errors.h"
#include "common/json_type.h"
#include "io/aten_view.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/implied_shapes.h"
#include "io/safetensors.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

// The compressed-tensors release whose format and arithmetic these checkpoints reproduce.
constexpr const char* kCompressedTensorsVersion = "0.20.1";
constexpr int64_t kTableGroup = 32;
constexpr int64_t kRestShardBytes = int64_t{2} << 30;
constexpr int64_t kTableRowBlock = 2048;  // bounds the f32 temporaries to ~100 MiB at E2B widths
constexpr const char* kFilesToCopy[] = {
    "tokenizer.json",    "tokenizer_config.json", "tokenizer.model",    "special_tokens_map.json",
    "added_tokens.json", "chat_template.jinja",   "chat_template.json", "generation_config.json"};

double dtype_eps(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return 0.0078125;    // torch.finfo(torch.bfloat16).eps
    case at::kHalf: return 0.0009765625;     // torch.finfo(torch.float16).eps
    default: return 1.1920928955078125e-07;  // torch.finfo(torch.float32).eps
  }
}

std::pair<double, double> dtype_range(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return {-3.3895313892515355e+38, 3.3895313892515355e+38};
    case at::kHalf: return {-65504.0, 65504.0};
    default: return {-3.4028234663852886e+38, 3.4028234663852886e+38};
  }
}

// int4 values q in [-8, 7] (int8 [rows, cols]) as pack_to_int32 stores them: q + 8 in nibble
// c % 8 of word c / 8, the last word zero-padded.
at::Tensor pack_cols(const at::Tensor& q) {
  const int64_t rows = q.size(0), cols = q.size(1), words = (cols + 7) / 8;
  at::Tensor u = q.to(at::kLong) + 8;
  if (words * 8 != cols) u = at::constant_pad_nd(u, {0, words * 8 - cols}, 0);
  const auto shifts = at::arange(0, 32, 4, u.options());
  return u.view({rows, words, 8}).bitwise_left_shift(shifts).sum(-1).to(at::kInt);
}

void append_packed(std::vector<TensorToWrite>* out, const std::string& module,
                   const PackedInt4& w) {
  out->push_back(to_write(module + ".weight_packed", w.packed));
  out->push_back(to_write(module + ".weight_scale", w.scale));
  out->push_back(
      to_write(module + ".weight_shape", at::tensor(std::vector<int64_t>{w.out, w.in}, at::kLong)));
  if (w.zero_point.defined()) out->push_back(to_write(module + ".weight_zero_point", w.zero_point));
}

TensorToWrite copy_view(const TensorView& v) {
  TensorToWrite w{v.name, v.dtype, v.shape, {}};
  w.bytes.assign(v.data, v.data + v.nbytes);
  return w;
}

// Rows [r0, r0 + n) of a 2-D view as a host tensor: aliased when aligned, copied otherwise.
at::Tensor view_rows(const TensorView& v, int64_t r0, int64_t n) {
  const auto type = scalar_type(v.dtype);
  const size_t row_bytes = static_cast<size_t>(v.shape[1]) * dtype_size(v.dtype);
  const uint8_t* p = v.data + static_cast<size_t>(r0) * row_bytes;
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(v.dtype) == 0) {
    return at::from_blob(const_cast<uint8_t*>(p), {n, v.shape[1]}, at::TensorOptions().dtype(type));
  }
  auto copy = at::empty({n, v.shape[1]}, at::TensorOptions().dtype(type));
  std::memcpy(copy.data_ptr(), p, static_cast<size_t>(n) * row_bytes);
  return copy;
}

bool is_float(Dtype d) { return d == Dtype::kBF16 || d == Dtype::kF16 || d == Dtype::kF32; }

// A vocabulary table as the emb4 twin stores it (quantize_table), ready to write.
std::vector<TensorToWrite> quantize_table(const TensorView& v, const std::string& module) {
  if (v.shape.size() != 2 || !is_float(v.dtype)) {
    throw FormatError(v.name + " in " + v.file + ": a vocabulary table must be a 2-D float tensor");
  }
  std::vector<TensorToWrite> out;
  append_packed(&out, module, torchtpu::quantize_table(view_rows(v, 0, v.shape[0]), module));
  return out;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw NotFoundError("cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  if (!out) throw ValueError("cannot write " + p.string());
}

// The group size a weight of `in` columns is quantized with (-1: the whole row); ValueError
// unless the columns are whole groups.
int64_t check_groups(const std::string& module, int64_t in, int64_t group_size) {
  const int64_t group = group_size == -1 ? in : group_size;
  if (group <= 0 || in % group != 0) {
    throw ValueError(module + ": " + std::to_string(in) +
                     " input columns are not a multiple of the group size " +
                     std::to_string(group_size) + " (compressed-tensors requires whole groups)");
  }
  return group;
}

// Removes what a failed quantize wrote: the output directories, which were empty or absent
// before (prepare_out_dir), are left as they were found.
class OutputsOnFailure {
 public:
  void add(const std::string& dir, bool existed) { dirs_.push_back({dir, existed}); }
  void keep() { dirs_.clear(); }
  ~OutputsOnFailure() {
    for (const auto& [dir, existed] : dirs_) {
      std::error_code ec;
      if (!existed) {
        fs::remove_all(dir, ec);
        continue;
      }
      for (const auto& entry : fs::directory_iterator(dir, ec)) fs::remove_all(entry.path(), ec);
    }
  }

 private:
  std::vector<std::pair<std::string, bool>> dirs_;
};

void prepare_out_dir(const std::string& dir, const std::string& in_dir, const char* what) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec)) {
      throw ValueError(std::string(what) + " " + dir + " exists and is not an empty directory");
    }
    if (fs::equivalent(dir, in_dir, ec)) {
      throw ValueError(std::string(what) + " " + dir + " is the input checkpoint");
    }
  }
  fs::create_directories(dir, ec);
  if (ec) throw ValueError("cannot create " + std::string(what) + " " + dir + ": " + ec.message());
}

ordered_json weights_args(int64_t group_size, bool symmetric) {
  // Keys in the order compressed-tensors writes them (json.dump with sort_keys).
  ordered_json w;
  w["dynamic"] = false;
  w["group_size"] = group_size > 0 ? ordered_json(group_size) : ordered_json(nullptr);
  w["num_bits"] = 4;
  w["observer"] = "minmax";
  w["strategy"] = group_size > 0 ? "group" : "channel";
  w["symmetric"] = symmetric;
  w["type"] = "int";
  return w;
}

ordered_json config_group(const std::vector<std::string>& targets, int64_t group_size,
                          bool symmetric) {
  ordered_json g;
  g["format"] = "pack-quantized";
  g["input_activations"] = nullptr;
  g["output_activations"] = nullptr;
  g["targets"] = targets;
  g["weights"] = weights_args(group_size, symmetric);
  return g;
}

ordered_json quantization_config(const ordered_json& groups,
                                 const std::vector<std::string>& ignore) {
  ordered_json q;
  q["config_groups"] = groups;
  q["format"] = "pack-quantized";
  q["global_compression_ratio"] = nullptr;
  q["ignore"] = ignore;
  q["kv_cache_scheme"] = nullptr;
  q["moe_sparsity_config"] = nullptr;
  q["quant_method"] = "compressed-tensors";
  q["quantization_status"] = "compressed";
  q["sparsity_config"] = ordered_json::object();
  q["transform_config"] = ordered_json::object();
  q["version"] = kCompressedTensorsVersion;
  return q;
}

// The ignore entry for a dense weight outside the text model: its tower,
// "model.vision_tower.x.weight"
// -> "re:model\.vision_tower\..*", or the module itself when the name is too short for a tower.
std::string ignore_entry(const std::string& name, const std::string& module) {
  size_t dot = name.find('.');
  if (dot != std::string::npos) dot = name.find('.', dot + 1);
  if (dot == std::string::npos || dot >= module.size()) return module;
  const std::string head = name.substr(0, dot);
  std::string escaped;
  for (char c : head) {
    if (c == '.') escaped += '\\';
    escaped += c;
  }
  return "re:" + escaped + "\\..*";
}

enum class Kind { kQuantize, kDense, kTable };
struct Item {
  std::string name;
  std::string module;
  Kind kind;
};
struct Shard {
  std::string file;
  std::vector<Item> items;
};

struct Output {
  std::string dir;
  ordered_json weight_map = ordered_json::object();
  int64_t bytes = 0;

  void write(const std::string& file, const std::vector<TensorToWrite>& tensors) {
    write_safetensors((fs::path(dir) / file).string(), tensors);
    for (const auto& t : tensors) {
      weight_map[t.name] = file;
      bytes += static_cast<int64_t>(t.bytes.size());
    }
  }
  void finish(const ordered_json& config, const Checkpoint& in) {
    ordered_json index;
    index["metadata"] = {{"total_size", bytes}};
    index["weight_map"] = weight_map;
    write_text(fs::path(dir) / "model.safetensors.index.json", index.dump(2) + "\n");
    write_text(fs::path(dir) / "config.json", config.dump(2) + "\n");
    for (const char* f : kFilesToCopy) {
      const std::string src = in.file_if_exists(f);
      if (!src.empty()) fs::copy_file(src, fs::path(dir) / f, fs::copy_options::overwrite_existing);
    }
  }
};

}  // namespace

namespace {

// f32 rounded to the compute dtype T, as ATen rounds each op's float result.
template <typename T>
float round_to(float v) {
  return static_cast<float>(static_cast<T>(v));
}

float round_to(at::ScalarType t, float v) {
  switch (t) {
    case at::kBFloat16: return round_to<c10::BFloat16>(v);
    case at::kHalf: return round_to<c10::Half>(v);
    default: return v;
  }
}

// A symmetric int4 weight [out, in] with scales per `group` inputs, words and scales unwritten.
PackedInt4 empty_packed(const std::string& module, int64_t out, int64_t in, int64_t group,
                        at::ScalarType scale_dtype) {
  PackedInt4 w;
  w.module = module;
  w.out = out;
  w.in = in;
  w.group_size = group;
  w.packed = at::empty({out, (in + 7) / 8}, at::kInt);
  w.scale = at::empty({out, in / group}, scale_dtype);
  return w;
}

// How the symmetric case rounds a group's scale: to the compute dtype T, and with a scale dtype,
// clamped to its range and rounded to it; a zero scale becomes the dtype's eps.
struct ScaleRule {
  std::optional<at::ScalarType> scale_dtype;
  float smin = 0.0f, smax = 0.0f, eps = 0.0f;

  template <typename T>
  float operator()(float amax) const {
    float s = round_to<T>(amax / 7.5f);
    if (scale_dtype) s = round_to<T>(round_to(*scale_dtype, std::clamp(s, smin, smax)));
    return s == 0.0f ? eps : s;
  }
};

// One group: its scale, and u = q + 8 per value.
template <typename T>
float quantize_group_portable(const T* v, int64_t group, const ScaleRule& rule, uint32_t* u) {
  float amax = 0.0f;
  for (int64_t i = 0; i < group; ++i) amax = std::max(amax, std::fabs(static_cast<float>(v[i])));
  const float s = rule.template operator()<T>(amax);
  for (int64_t i = 0; i < group; ++i) {
    const float q = std::clamp(round_to<T>(static_cast<float>(v[i]) / s), -8.0f, 7.0f);
    // Round half to even (at::round) for |q| <= 8: adding 1.5 * 2^23 leaves no fraction.
    u[i] = static_cast<uint32_t>((q + 12582912.0f) - 12582912.0f + 8.0f);
  }
  return s;
}

#if defined(__x86_64__)
template <typename T>
constexpr cpu::FloatType float_type_of() {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return cpu::FloatType::kBFloat16;
  if constexpr (std::is_same_v<T, c10::Half>) return cpu::FloatType::kHalf;
  return cpu::FloatType::kFloat;
}

// quantize_group_portable with 16 lanes (group a multiple of 16): the same roundings.
template <typename T>
TORCHTPU_AVX512 float quantize_group_avx512(const T* v, int64_t group, const ScaleRule& rule,
                                            uint32_t* u) {
  constexpr cpu::FloatType F = float_type_of<T>();
  __m512 m = _mm512_setzero_ps();
  for (int64_t i = 0; i < group; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(cpu::load16<F>(v, i)));
  const float s = rule.template operator()<T>(_mm512_reduce_max_ps(m));
  const __m512 scale = _mm512_set1_ps(s), lo = _mm512_set1_ps(-8.0f), hi = _mm512_set1_ps(7.0f);
  const __m512 eight = _mm512_set1_ps(8.0f);
  for (int64_t i = 0; i < group; i += 16) {
    __m512 q = cpu::round16(F, _mm512_div_ps(cpu::load16<F>(v, i), scale));
    q = _mm512_roundscale_ps(_mm512_min_ps(_mm512_max_ps(q, lo), hi),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm512_storeu_si512(u + i, _mm512_cvtps_epi32(_mm512_add_ps(q, eight)));
  }
  return s;
}
#endif

// The symmetric case of quantize_weight in one pass per group, each step rounded as the ATen ops
// below round it (float arithmetic, result rounded to the compute dtype T): the same bits, without
// the ops' full-size temporaries. It makes --quantize int4 a load step (2.3 billion E2B weights).
template <typename T>
void quantize_symmetric(const at::Tensor& x, int64_t group, const ScaleRule& rule,
                        at::Tensor& packed, at::Tensor& scale_out) {
  const int64_t rows = x.size(0), in = x.size(1), groups = in / group, words = (in + 7) / 8;
  const T* src = x.data_ptr<T>();
  auto* dst = packed.data_ptr<int32_t>();
  std::vector<float> scales(rows * groups);
#if defined(__x86_64__)
  const bool avx512 = cpu::use_avx512() && group % 16 == 0;
#endif
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<uint32_t> u(words * 8, 0);  // pack_to_int32 pads the last word with zero nibbles
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const T* v = src + r * in + g * group;
        float& s = scales[r * groups + g];
#if defined(__x86_64__)
        if (avx512) {
          s = quantize_group_avx512(v, group, rule, u.data() + g * group);
          continue;
        }
#endif
        s = quantize_group_portable(v, group, rule, u.data() + g * group);
      }
      for (int64_t w = 0; w < words; ++w) {
        uint32_t word = 0;
        for (int64_t j = 0; j < 8; ++j) word |= u[8 * w + j] << (4 * j);
        dst[r * words + w] = static_cast<int32_t>(word);
      }
    }
  });
  scale_out.copy_(
      at::from_blob(scales.data(), {rows, groups}, at::kFloat).to(scale_out.scalar_type()));
}

}  // namespace

PackedInt4 quantize_weight(const at::Tensor& weight, const QuantizeSpec& spec,
                           const std::string& module) {
  if (weight.dim() != 2 || !at::isFloatingType(weight.scalar_type())) {
    throw ValueError(module + ": only 2-D float weights can be quantized, got " +
                     std::string(at::toString(weight.scalar_type())) + " of " +
                     std::to_string(weight.dim()) + " dims");
  }
  const int64_t out = weight.size(0), in = weight.size(1);
  const int64_t group = check_groups(module, in, spec.group_size);
  // Same ATen ops in the same dtypes as compressed-tensors, so every rounding step agrees.
  const at::ScalarType wt = weight.scalar_type();
  const at::ScalarType ct = spec.scale_dtype && *spec.scale_dtype != wt ? at::kFloat : wt;
  if (spec.symmetric && (ct == at::kBFloat16 || ct == at::kHalf || ct == at::kFloat)) {
    const at::Tensor x = weight.cpu().to(ct).contiguous();
    PackedInt4 w = empty_packed(module, out, in, group, spec.scale_dtype.value_or(wt));
    ScaleRule rule{spec.scale_dtype};
    rule.eps = static_cast<float>(dtype_eps(spec.scale_dtype.value_or(ct)));
    if (spec.scale_dtype) {
      const auto [smin, smax] = dtype_range(*spec.scale_dtype);
      rule.smin = static_cast<float>(smin);
      rule.smax = static_cast<float>(smax);
    }
    if (ct == at::kBFloat16) {
      quantize_symmetric<c10::BFloat16>(x, group, rule, w.packed, w.scale);
    } else if (ct == at::kHalf) {
      quantize_symmetric<c10::Half>(x, group, rule, w.packed, w.scale);
    } else {
      quantize_symmetric<float>(x, group, rule, w.packed, w.scale);
    }
    return w;
  }
  const at::Tensor x = weight.cpu().to(ct).contiguous().view({out, in / group, group});
  at::Tensor lo = x.amin(-1), hi = x.amax(-1);
  lo = at::minimum(lo, at::zeros_like(lo));
  hi = at::maximum(hi, at::zeros_like(hi));
  const at::Tensor q_min = at::scalar_tensor(-8.0, at::kFloat);
  const at::Tensor q_max = at::scalar_tensor(7.0, at::kFloat);
  const at::Tensor bit_range = q_max - q_min;
  at::Tensor scale, zero;
  if (spec.symmetric) {
    scale = at::maximum(lo.abs(), hi.abs()) / (bit_range.to(ct) / 2);
  } else {
    scale = (hi - lo) / bit_range.to(ct);
    zero = at::clamp(q_min - lo / scale, q_min, q_max);
  }
  if (spec.scale_dtype) {
    const auto [smin, smax] = dtype_range(*spec.scale_dtype);
    scale = at::clamp(scale, smin, smax).to(*spec.scale_dtype).to(ct);
  }
  const double eps = dtype_eps(spec.scale_dtype.value_or(ct));
  scale = at::where(scale == 0, at::scalar_tensor(eps, scale.options()), scale);
  if (!spec.symmetric) zero = at::round(at::clamp(zero, -128, 127)).to(at::kChar);

  at::Tensor scaled = x / scale.unsqueeze(-1);
  if (zero.defined()) scaled += zero.unsqueeze(-1).to(ct);
  const at::Tensor q =
      at::round(at::clamp(scaled, q_min, q_max)).to(ct).to(at::kChar).view({out, in});

  PackedInt4 w;
  w.module = module;
  w.out = out;
  w.in = in;
  w.group_size = group;
  w.packed = pack_cols(q);
  w.scale = scale.to(spec.scale_dtype.value_or(wt)).contiguous();
  if (zero.defined()) w.zero_point = pack_cols(zero.t().contiguous()).t().contiguous();
  return w;
}

PackedInt4 quantize_table(const at::Tensor& table, const std::string& module) {
  const int64_t rows = table.size(0), cols = table.size(1);
  const QuantizeSpec spec{kTableGroup, true, at::kHalf};
  PackedInt4 w = empty_packed(module, rows, cols, kTableGroup, at::kHalf);
  for (int64_t r = 0; r < rows; r += kTableRowBlock) {
    const int64_t n = std::min(kTableRowBlock, rows - r);
    const PackedInt4 block = quantize_weight(table.narrow(0, r, n), spec, module);
    w.packed.narrow(0, r, n).copy_(block.packed);
    w.scale.narrow(0, r, n).copy_(block.scale);
  }
  return w;
}

QuantizeSummary quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                    const QuantizeCheckpointOptions& options) {
  if (options.group_size != -1 && options.group_size <= 0) {
    throw ValueError("--group must be positive or -1 (one scale per output row), got " +
                     std::to_string(options.group_size));
  }
  const Checkpoint ckpt(in_dir);
  const fs::path config_path = fs::path(in_dir) / "config.json";
  if (!fs::is_regular_file(config_path)) {
    throw NotFoundError("checkpoint " + in_dir + " has no config.json");
  }
  const std::string config_text = read_text(config_path);
  ordered_json config;
  try {
    config = ordered_json::parse(config_text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(config_path.string() + ": invalid JSON: " + json_error_text(e));
  }
  const bool has_text_config = config.contains("text_config") && config["text_config"].is_object();
  if (config.contains("quantization_config") ||
      (has_text_config && config["text_config"].contains("quantization_config"))) {
    throw ValueError("checkpoint " + in_dir +
                     " is already quantized (config.json has a "
                     "quantization_config); quantize reads dense bf16/f16/f32 checkpoints");
  }
  const ModelConfig model_config = parse_config_json(config_text, config_path.string());
  const bool emb4 = !options.emb4_dir.empty();
  if (emb4) {
    const fs::path a = fs::weakly_canonical(out_dir), b = fs::weakly_canonical(options.emb4_dir);
    const auto inside = [](const fs::path& dir, const fs::path& p) {
      const auto rel = p.lexically_relative(dir);
      return !rel.empty() && *rel.begin() != "..";
    };
    if (inside(a, b) || inside(b, a)) {
      throw ValueError("--emb4 directory " + options.emb4_dir + " and OUT " + out_dir +
                       " must be apart: each is a checkpoint of its own");
    }
  }

  const std::string& prefix = ckpt.prefix();
  const std::string embed = prefix + "embed_tokens", embed_ple = prefix + "embed_tokens_per_layer";
  const bool tied = ckpt.find("lm_head.weight") == nullptr;

  std::map<int64_t, Shard> layer_shards;
  std::vector<Item> rest;
  std::vector<std::string> ignore{"lm_head"};
  for (const std::string& name : ckpt.names()) {
    const TensorView& v = ckpt.get(name);
    const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    const std::string module = weight ? name.substr(0, name.size() - 7) : name;
    if (name.size() > 14 && name.compare(name.size() - 14, 14, ".weight_packed") == 0) {
      throw ValueError("checkpoint " + in_dir + " already holds pack-quantized tensors (" + name +
                       "); quantize reads dense checkpoints");
    }
    const bool text = name.rfind(prefix, 0) == 0;
    const bool table = weight && (module == embed || module == embed_ple || module == "lm_head");
    Kind kind = Kind::kDense;
    if (table) {
      kind = Kind::kTable;
    } else if (weight && text && v.shape.size() == 2) {
      if (!is_float(v.dtype)) {
        throw FormatError(name + " in " + v.file + ": dtype " + dtype_name(v.dtype) +
                          " cannot be quantized; expected BF16, F16 or F32");
      }
      kind = Kind::kQuantize;
    } else if (weight && !text && v.shape.size() == 2) {
      const std::string pattern = ignore_entry(name, module);
      if (std::find(ignore.begin(), ignore.end(), pattern) == ignore.end()) {
        ignore.push_back(pattern);
      }
    }
    Item item{name, module, kind};
    const std::string layers = prefix + "layers.";
    if (text && name.rfind(layers, 0) == 0) {
      const size_t end = name.find('.', layers.size());
      const std::string digits = name.substr(layers.size(), end - layers.size());
      if (!digits.empty() && std::all_of(digits.begin(), digits.end(), ::isdigit)) {
        layer_shards[std::stoll(digits)].items.push_back(std::move(item));
        continue;
      }
    }
    rest.push_back(std::move(item));
  }

  std::vector<Shard> shards;
  for (auto& [layer, shard] : layer_shards) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-layer-%03lld.safetensors",
                  static_cast<long long>(layer));
    shard.file = file;
    shards.push_back(std::move(shard));
  }
  int64_t rest_bytes = 0;
  for (Item& item : rest) {
    const int64_t n = static_cast<int64_t>(ckpt.get(item.name).nbytes);
    if (shards.empty() || shards.back().file.rfind("model-rest-", 0) != 0 ||
        (rest_bytes > 0 && rest_bytes + n > kRestShardBytes)) {
      char file[64];
      int64_t index = 0;
      for (const Shard& s : shards) index += s.file.rfind("model-rest-", 0) == 0;
      std::snprintf(file, sizeof(file), "model-rest-%03lld.safetensors",
                    static_cast<long long>(index));
      shards.push_back(Shard{file, {}});
      rest_bytes = 0;
    }
    rest_bytes += n;
    shards.back().items.push_back(std::move(item));
  }

  // Before anything is written: the shapes config.json implies, by the loader's own table (a
  // checkpoint the engine would refuse is refused here), then every weight's groups.
  check_implied_tensors(ckpt, model_config);
  for (const Shard& shard : shards) {
    for (const Item& item : shard.items) {
      const auto& shape = ckpt.get(item.name).shape;
      if (item.kind == Kind::kQuantize) check_groups(item.module, shape[1], options.group_size);
      if (item.kind == Kind::kTable && emb4) check_groups(item.module, shape[1], kTableGroup);
    }
  }
  // Added once prepared (found empty or absent): a directory refused is never touched.
  OutputsOnFailure written;
  std::error_code ec;
  bool existed = fs::exists(out_dir, ec);
  prepare_out_dir(out_dir, in_dir, "OUT");
  written.add(out_dir, existed);
  if (emb4) {
    existed = fs::exists(options.emb4_dir, ec);
    prepare_out_dir(options.emb4_dir, in_dir, "--emb4 directory");
    written.add(options.emb4_dir, existed);
  }

  const QuantizeSpec spec{options.group_size, options.symmetric, std::nullopt};
  QuantizeSummary summary;
  Output main_out{out_dir}, emb4_out{options.emb4_dir};
  for (const Shard& shard : shards) {
    std::vector<TensorToWrite> tensors;
    std::vector<std::string> table_names;
    for (const Item& item : shard.items) {
      const TensorView& v = ckpt.get(item.name);
      if (item.kind == Kind::kQuantize) {
        append_packed(&tensors, item.module, quantize_weight(host_tensor(v), spec, item.module));
        ++summary.quantized;
      } else {
        tensors.push_back(copy_view(v));
        ++summary.dense;
        if (item.kind == Kind::kTable) table_names.push_back(item.name);
      }
    }
    main_out.write(shard.file, tensors);
    if (!emb4) continue;

    std::vector<TensorToWrite> twin;
    for (TensorToWrite& t : tensors) {
      if (std::find(table_names.begin(), table_names.end(), t.name) == table_names.end()) {
        twin.push_back(std::move(t));
      }
    }
    tensors.clear();
    tensors.shrink_to_fit();
    for (const Item& item : shard.items) {
      if (item.kind != Kind::kTable) continue;
      for (TensorToWrite& t : quantize_table(ckpt.get(item.name), item.module)) {
        if (tied && item.module == embed) {
          TensorToWrite head = t;
          head.name = "lm_head" + t.name.substr(embed.size());
          twin.push_back(std::move(head));
        }
        twin.push_back(std::move(t));
      }
      summary.emb4_tables += (tied && item.module == embed) ? 2 : 1;
    }
    emb4_out.write(shard.file, twin);
  }
  summary.out_bytes = main_out.bytes;
  summary.emb4_bytes = emb4_out.bytes;

  // quantization_config at the top level, where transformers and vLLM look for it.
  ordered_json groups;
  groups["group_0"] = config_group({"Linear"}, options.group_size, options.symmetric);
  ordered_json out_config = config;
  out_config["quantization_config"] = quantization_config(groups, ignore);
  main_out.finish(out_config, ckpt);
  if (emb4) {
    // Table groups come first: compressed-tensors' model-free dequantizer applies the groups in
    // file order and treats a "Linear" target as matching every tensor.
    ordered_json twin_groups;
    twin_groups["group_embed_tokens_per_layer"] =
        config_group({"re:.*\\.embed_tokens_per_layer$"}, kTableGroup, true);
    twin_groups["group_embed_tokens"] = config_group({"re:.*\\.embed_tokens$"}, kTableGroup, true);
    twin_groups["group_lm_head"] = config_group({"re:^lm_head$"}, kTableGroup, true);
    twin_groups["group_0"] = groups["group_0"];
    std::vector<std::string> twin_ignore;
    for (const std::string& s : ignore) {
      if (s != "lm_head") twin_ignore.push_back(s);
    }
    ordered_json twin_config = config;
    twin_config["tie_word_embeddings"] = false;
    if (has_text_config) twin_config["text_config"]["tie_word_embeddings"] = false;
    twin_config["quantization_config"] = quantization_config(twin_groups, twin_ignore);
    emb4_out.finish(twin_config, ckpt);
  }
  written.keep();
  return summary;
}

}  // namespace torchtpu
