#include "quant/pack_quantized.h"

#include <algorithm>
#include <map>
#include <regex>

#include "common/errors.h"
#include "common/shape.h"
#include "io/aten_view.h"

namespace torchtpu {
namespace {

constexpr int64_t kPerWord = 8;  // int4 values per int32 word

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// "model.layers.0.mlp.down_proj.weight_scale in /ckpt/model.safetensors: "
std::string where(const TensorView& v) { return v.name + " in " + v.file + ": "; }

[[noreturn]] void fail(const TensorView& v, const std::string& what) {
  throw FormatError(where(v) + what);
}

void expect_dtype(const TensorView& v, std::initializer_list<Dtype> allowed) {
  if (std::find(allowed.begin(), allowed.end(), v.dtype) != allowed.end()) return;
  std::string names;
  for (Dtype d : allowed) names += std::string(names.empty() ? "" : " or ") + dtype_name(d);
  fail(v, std::string("dtype ") + dtype_name(v.dtype) + " is not supported, expected " + names);
}

bool matches_name(const std::string& module, const std::string& target) {
  if (target.rfind("re:", 0) == 0) {
    std::regex re;
    try {
      re = std::regex(target.substr(3), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw FormatError("quantization_config pattern \"" + target +
                        "\" is not a valid regular "
                        "expression: " +
                        e.what());
    }
    return std::regex_search(module, re, std::regex_constants::match_continuous);
  }
  return target == module;
}

bool matches_class(const std::string& module, const std::string& target) {
  return target == (is_embedding_module(module) ? "Embedding" : "Linear");
}

bool matches(const std::string& module, const std::string& target) {
  return matches_name(module, target) || matches_class(module, target);
}

// The group's column -> group map: g_idx when present, else c / group_size.
at::Tensor column_groups(const PackedInt4& w) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(w.packed.device());
  if (w.g_idx.defined()) return w.g_idx.to(opts);
  return at::arange(w.in, opts).div(w.group_size, "floor");
}

// Unsigned nibbles [n, count] of int32 words [n, words] packed along dim 1.
at::Tensor unpack_cols(const at::Tensor& words, int64_t count) {
  const auto shifts = at::arange(0, 32, 4, words.options());
  return words.unsqueeze(-1)
      .bitwise_right_shift(shifts)
      .bitwise_and(0xF)
      .reshape({words.size(0), -1})
      .narrow(1, 0, count);
}

// Dequantizes rows whose packed words, scales and (unsigned, already unpacked) zero points are
// given. Rounding: (u - z) is an exact small integer and its product with a bf16/f16 scale is exact
// in f32, so rounding the f32 product once to the scale dtype equals compressed-tensors' product
// in the scale dtype; for f32 scales it is the same f32 multiply.
at::Tensor dequantize_block(const PackedInt4& w, const at::Tensor& packed, const at::Tensor& scale,
                            const at::Tensor& zero, const at::Tensor& groups,
                            at::ScalarType dtype) {
  const at::Tensor u = unpack_cols(packed, w.in);
  const at::Tensor centered = zero.defined() ? u - zero.index_select(1, groups) : u - 8;
  const at::Tensor s = scale.index_select(1, groups).to(at::kFloat);
  return (centered.to(at::kFloat) * s).to(scale.scalar_type()).to(dtype);
}

// Zero points [rows.numel(), groups] as unsigned nibbles for the given output rows.
at::Tensor zero_rows(const PackedInt4& w, const at::Tensor& rows) {
  const at::Tensor words = w.zero_point.index_select(0, rows.div(kPerWord, "floor"));
  const at::Tensor shift = rows.remainder(kPerWord).mul(4).to(at::kInt).unsqueeze(1);
  return words.bitwise_right_shift(shift).bitwise_and(0xF);
}

}  // namespace

PackedInt4 PackedInt4::to(const at::Device& device) const {
  PackedInt4 r = *this;
  r.packed = packed.to(device);
  r.scale = scale.to(device);
  if (zero_point.defined()) r.zero_point = zero_point.to(device);
  if (g_idx.defined()) r.g_idx = g_idx.to(device);
  return r;
}

int64_t PackedInt4::nbytes() const {
  int64_t n = packed.nbytes() + scale.nbytes();
  if (zero_point.defined()) n += zero_point.nbytes();
  if (g_idx.defined()) n += g_idx.nbytes();
  return n;
}

bool is_embedding_module(const std::string& module) {
  const size_t dot = module.rfind('.');
  const std::string last = dot == std::string::npos ? module : module.substr(dot + 1);
  return last == "embed_tokens" || last == "embed_tokens_per_layer";
}

const QuantGroup* quant_group_for(const QuantizationConfig& quant, const std::string& module) {
  for (const std::string& ig : quant.ignore) {
    if (matches(module, ig)) return nullptr;
  }
  // compressed-tensors' apply_quantization_config: a target maps to the last group naming it;
  // exact names beat "re:" patterns (the alphabetically first matching pattern wins), which beat
  // class names.
  std::map<std::string, const QuantGroup*> by_target;
  for (const auto& group : quant.groups) {
    for (const std::string& t : group.targets) by_target[t] = &group;
  }
  if (auto it = by_target.find(module); it != by_target.end()) return it->second;
  for (const auto& [target, group] : by_target) {
    if (target.rfind("re:", 0) == 0 && matches_name(module, target)) return group;
  }
  for (const auto& [target, group] : by_target) {
    if (matches_class(module, target)) return group;
  }
  return nullptr;
}

std::string QuantMismatch::summary(const std::string& dir, size_t max_names) const {
  if (empty()) return "";
  auto list = [&](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < max_names; ++i) s += (i ? ", " : "") + v[i];
    if (v.size() > max_names) s += ", ... (" + std::to_string(v.size()) + " in all)";
    return s;
  };
  std::string msg = "checkpoint " + dir +
                    ": quantization_config and tensor names disagree; "
                    "the tensor names win.";
  if (!packed_not_targeted.empty()) {
    msg += " Stored pack-quantized but not covered by quantization_config: " +
           list(packed_not_targeted) + ".";
  }
  if (!targeted_not_packed.empty()) {
    msg += " Covered by quantization_config but stored dense: " + list(targeted_not_packed) + ".";
  }
  return msg;
}

QuantMismatch quantized_modules_mismatch(const Checkpoint& ckpt, const QuantizationConfig* quant) {
  static const std::string kPacked = ".weight_packed", kDense = ".weight";
  QuantMismatch out;
  for (const std::string& name : ckpt.names()) {
    const auto ends_with = [&](const std::string& suffix) {
      return name.size() > suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(kPacked)) {
      const std::string module = name.substr(0, name.size() - kPacked.size());
      if (quant == nullptr || quant_group_for(*quant, module) == nullptr) {
        out.packed_not_targeted.push_back(module);
      }
    } else if (ends_with(kDense) && quant != nullptr && ckpt.get(name).shape.size() == 2) {
      const std::string module = name.substr(0, name.size() - kDense.size());
      if (quant_group_for(*quant, module) != nullptr) out.targeted_not_packed.push_back(module);
    }
  }
  return out;
}

bool has_packed(const Checkpoint& ckpt, const std::string& module) {
  return ckpt.find(module + ".weight_packed") != nullptr;
}

void release_packed(const Checkpoint& ckpt, const std::string& module) {
  for (const char* part : {".weight_packed", ".weight_scale", ".weight_shape", ".weight_zero_point",
                           ".weight_g_idx"}) {
    if (const TensorView* view = ckpt.find(module + part)) release_pages(*view);
  }
}

PackedInt4 read_packed(const Checkpoint& ckpt, const std::string& module,
                       const QuantizationConfig* quant) {
  const TensorView& packed = ckpt.get(module + ".weight_packed");
  const TensorView& scale = ckpt.get(module + ".weight_scale");
  const TensorView& shape = ckpt.get(module + ".weight_shape");
  const TensorView* zero = ckpt.find(module + ".weight_zero_point");
  const TensorView* g_idx = ckpt.find(module + ".weight_g_idx");

  expect_dtype(packed, {Dtype::kI32});
  expect_dtype(scale, {Dtype::kBF16, Dtype::kF16, Dtype::kF32});
  expect_dtype(shape, {Dtype::kI32, Dtype::kI64});
  if (shape.shape != std::vector<int64_t>{2}) {
    fail(shape, "shape " + shape_str(shape.shape) + " is not [2] = [out, in]");
  }
  const at::Tensor shape_values = host_tensor(shape).to(at::kLong);
  const int64_t out = shape_values[0].item<int64_t>();
  const int64_t in = shape_values[1].item<int64_t>();
  if (out <= 0 || in <= 0) {
    fail(shape, "holds [" + std::to_string(out) + ", " + std::to_string(in) +
                    "], expected positive [out, in]");
  }
  const std::vector<int64_t> packed_expect{out, ceil_div(in, kPerWord)};
  if (packed.shape != packed_expect) {
    fail(packed, "shape " + shape_str(packed.shape) + " does not match weight_shape [" +
                     std::to_string(out) + ", " + std::to_string(in) + "], which packs to " +
                     shape_str(packed_expect) + " (8 int4 values per int32)");
  }
  if (scale.shape.size() != 2 || scale.shape[0] != out || scale.shape[1] < 1) {
    fail(scale, "shape " + shape_str(scale.shape) + " does not fit weight_shape [" +
                    std::to_string(out) + ", " + std::to_string(in) + "]: expected [" +
                    std::to_string(out) + ", groups]");
  }
  const int64_t groups = scale.shape[1];

  const QuantGroup* group = quant ? quant_group_for(*quant, module) : nullptr;
  int64_t group_size = 0;
  bool symmetric = zero == nullptr;
  if (group != nullptr) {
    const std::string cfg = "quantization_config of " + ckpt.dir();
    if (group->num_bits != 4) {
      fail(packed, cfg + " says num_bits " + std::to_string(group->num_bits) +
                       "; only 4-bit pack-quantized weights are implemented");
    }
    if (group->strategy == "channel") {
      group_size = in;
    } else if (group->strategy == "group") {
      group_size = group->group_size;
    } else {
      fail(packed, cfg + " says strategy \"" + group->strategy +
                       "\"; only \"group\" and \"channel\" are implemented");
    }
    if (groups != ceil_div(in, group_size)) {
      fail(scale, "shape " + shape_str(scale.shape) + " does not fit " + cfg + ": strategy " +
                      group->strategy + " with group size " + std::to_string(group_size) +
                      " over " + std::to_string(in) + " columns needs [" + std::to_string(out) +
                      ", " + std::to_string(ceil_div(in, group_size)) + "]");
    }
    symmetric = group->symmetric;
    if (symmetric && zero != nullptr) {
      fail(*zero, "a zero point is stored but " + cfg + " says symmetric: true");
    }
    if (!symmetric && zero == nullptr) {
      fail(packed, cfg + " says symmetric: false but " + module + ".weight_zero_point is missing");
    }
  } else if (g_idx == nullptr) {
    if (in % groups != 0) {
      fail(scale, "shape " + shape_str(scale.shape) + " does not split " + std::to_string(in) +
                      " columns into equal groups, and no quantization_config group covers " +
                      module + " to give the group size");
    }
    group_size = in / groups;
  } else {
    group_size = ceil_div(in, groups);
  }

  PackedInt4 w;
  w.module = module;
  w.file = packed.file;
  w.out = out;
  w.in = in;
  w.group_size = group_size;
  w.packed = host_tensor(packed);
  w.scale = host_tensor(scale);
  if (!symmetric) {
    expect_dtype(*zero, {Dtype::kI32});
    const std::vector<int64_t> zero_expect{ceil_div(out, kPerWord), groups};
    if (zero->shape != zero_expect) {
      fail(*zero, "shape " + shape_str(zero->shape) + " does not match " + shape_str(zero_expect) +
                      " (8 int4 values per int32 along the " + std::to_string(out) +
                      " output rows, one column per scale group)");
    }
    w.zero_point = host_tensor(*zero);
  }
  if (g_idx != nullptr) {
    expect_dtype(*g_idx, {Dtype::kI32});
    if (g_idx->shape != std::vector<int64_t>{in}) {
      fail(*g_idx, "shape " + shape_str(g_idx->shape) + " is not [" + std::to_string(in) +
                       "] (one group index per input column)");
    }
    w.g_idx = host_tensor(*g_idx);
    const int64_t lo = w.g_idx.min().item<int64_t>(), hi = w.g_idx.max().item<int64_t>();
    if (lo < 0 || hi >= groups) {
      fail(*g_idx, "holds group indices in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], outside the " + std::to_string(groups) + " groups of weight_scale");
    }
  }
  return w;
}

void expect_shape(const PackedInt4& w, int64_t out, int64_t in, const std::string& expected) {
  if (w.out == out && w.in == in) return;
  throw FormatError(w.module + " in " + (w.file.empty() ? std::string("memory") : w.file) +
                    ": int4 table is [" + std::to_string(w.out) + ", " + std::to_string(w.in) +
                    "] (weight_shape), expected [" + std::to_string(out) + ", " +
                    std::to_string(in) + "] from " + expected);
}

at::Tensor dequantize(const PackedInt4& w, at::ScalarType dtype) {
  const at::Tensor groups = column_groups(w);
  at::Tensor zero;
  if (w.zero_point.defined()) {
    zero = unpack_cols(w.zero_point.t().contiguous(), w.out).t();
  }
  // Row blocks bound the int32/f32 temporaries to ~64 MiB each whatever the matrix size.
  const int64_t block = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(w.in, 1));
  if (w.out <= block) return dequantize_block(w, w.packed, w.scale, zero, groups, dtype);
  auto result = at::empty({w.out, w.in}, w.scale.options().dtype(dtype));
  for (int64_t r = 0; r < w.out; r += block) {
    const int64_t n = std::min(block, w.out - r);
    result.narrow(0, r, n).copy_(
        dequantize_block(w, w.packed.narrow(0, r, n), w.scale.narrow(0, r, n),
                         zero.defined() ? zero.narrow(0, r, n) : zero, groups, dtype));
  }
  return result;
}

at::Tensor dequantize_rows(const PackedInt4& w, const at::Tensor& rows, at::ScalarType dtype) {
  const at::Tensor idx = rows.to(at::kLong).reshape({-1});
  const at::Tensor zero = w.zero_point.defined() ? zero_rows(w, idx) : at::Tensor();
  return dequantize_block(w, w.packed.index_select(0, idx), w.scale.index_select(0, idx), zero,
                          column_groups(w), dtype);
}

}  // namespace torchtpu
