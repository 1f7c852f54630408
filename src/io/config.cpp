#include "io/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "common/errors.h"
#include "common/json_depth.h"
#include "common/json_type.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSliding = "sliding_attention";
constexpr const char* kFull = "full_attention";

// One JSON object of config.json and the dotted path that leads to it ("text_config."), so that
// every message names the file and the field as a user would find it. Defaults are transformers'
// (Gemma4TextConfig in configuration_gemma4.py, transformers 5.24).
class Fields {
 public:
  Fields(const json& obj, std::string path, std::string prefix)
      : obj_(obj), path_(std::move(path)), prefix_(std::move(prefix)) {}

  std::string name(const std::string& key) const { return prefix_ + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw FormatError(path_ + ": " + name(key) + " " + what);
  }
  [[noreturn]] void unsupported(const std::string& key, const json& value,
                                const std::string& why) const {
    fail(key, "= " + value.dump() + " is not supported: " + why);
  }
  bool has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  // The value of `key`, or null: a const operator[] with a missing key reads freed memory.
  const json& at(const std::string& key) const {
    static const json kAbsent;
    const auto it = obj_.find(key);
    return it == obj_.end() ? kAbsent : *it;
  }

  int64_t integer(const std::string& key, int64_t def) const {
    if (!has(key)) return def;
    const json& v = obj_[key];
    if (!v.is_number_integer()) fail(key, "must be an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  int64_t positive(const std::string& key, int64_t def) const {
    const int64_t v = integer(key, def);
    if (v <= 0) fail(key, "must be positive, got " + std::to_string(v));
    return v;
  }
  double number(const std::string& key, double def) const {
    if (!has(key)) return def;
    const json& v = obj_[key];
    if (!v.is_number()) fail(key, "must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool def) const {
    if (!has(key)) return def;
    const json& v = obj_[key];
    if (!v.is_boolean()) fail(key, "must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& def) const {
    if (!has(key)) return def;
    const json& v = obj_[key];
    if (!v.is_string()) fail(key, "must be a string, got " + v.dump());
    return v.get<std::string>();
  }
  // A field that must keep a given value because the model does not implement the others.
  void require_false(const std::string& key, const std::string& why) const {
    if (has(key) && !(obj_[key].is_boolean() && !obj_[key].get<bool>())) {
      unsupported(key, obj_[key], why);
    }
  }
  // An id field that may be an int, a list of ints or null; appends in order without duplicates.
  void append_ids(const std::string& key, std::vector<int64_t>* out) const {
    if (!has(key)) return;
    const json& v = obj_[key];
    auto add = [&](const json& id) {
      if (!id.is_number_integer())
        fail(key, "must be an integer or a list of integers, got " + v.dump());
      const int64_t x = id.get<int64_t>();
      if (std::find(out->begin(), out->end(), x) == out->end()) out->push_back(x);
    };
    if (v.is_array()) {
      for (const json& id : v) add(id);
    } else {
      add(v);
    }
  }

 private:
  const json& obj_;
  std::string path_;
  std::string prefix_;
};

json parse_json(const std::string& text, const std::string& path) {
  json j;
  try {
    j = parse_json_within_depth<json>(text, [&] {
      throw FormatError(path + ": invalid JSON: arrays and objects nest deeper than " +
                        std::to_string(kMaxJsonDepth) + " levels");
    });
  } catch (const json::exception& e) {
    throw FormatError(path + ": invalid JSON: " + json_error_text(e));
  }
  if (!j.is_object()) throw FormatError(path + ": expected a JSON object, got " + j.dump());
  return j;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw NotFoundError("cannot read " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

RopeParams parse_rope(const Fields& rope_parameters, const std::string& layer_type) {
  const json& entry = rope_parameters.at(layer_type);
  if (!entry.is_object())
    rope_parameters.fail(layer_type, "must be an object, got " + entry.dump());
  auto fail = [&](const std::string& key, const std::string& what) {
    rope_parameters.fail(layer_type + "." + key, what);
  };
  auto unsupported = [&](const std::string& key, const json& value, const std::string& why) {
    rope_parameters.unsupported(layer_type + "." + key, value, why);
  };
  for (const auto& [key, value] : entry.items()) {
    if (key != "rope_type" && key != "rope_theta" && key != "partial_rotary_factor" &&
        key != "factor") {
      unsupported(key, value, "unknown RoPE parameter");
    }
  }
  RopeParams p;
  if (!entry.contains("rope_type") || !entry["rope_type"].is_string()) {
    fail("rope_type", "must be a string (\"default\" or \"proportional\")");
  }
  p.rope_type = entry["rope_type"].get<std::string>();
  if (p.rope_type != "default" && p.rope_type != "proportional") {
    unsupported("rope_type", entry["rope_type"],
                "only \"default\" and \"proportional\" RoPE are implemented");
  }
  if (!entry.contains("rope_theta") || !entry["rope_theta"].is_number()) {
    fail("rope_theta", "must be a number");
  }
  p.theta = entry["rope_theta"].get<double>();
  if (!(p.theta > 0)) fail("rope_theta", "must be positive, got " + entry["rope_theta"].dump());
  if (entry.contains("partial_rotary_factor")) {
    const json& v = entry["partial_rotary_factor"];
    if (!v.is_number()) fail("partial_rotary_factor", "must be a number, got " + v.dump());
    p.partial_rotary_factor = v.get<double>();
    if (!(p.partial_rotary_factor > 0 && p.partial_rotary_factor <= 1)) {
      fail("partial_rotary_factor", "must be in (0, 1], got " + v.dump());
    }
    // transformers' default RoPE ignores the factor and rotates every dimension; accepting it
    // would leave the reader of this config guessing which of the two was meant.
    if (p.rope_type == "default" && p.partial_rotary_factor != 1.0) {
      unsupported("partial_rotary_factor", v,
                  "rope_type \"default\" rotates all dimensions (\"proportional\" rotates a part)");
    }
  }
  if (entry.contains("factor")) {
    const json& v = entry["factor"];
    if (!v.is_number() || v.get<double>() != 1.0) {
      unsupported("factor", v, "RoPE scaling factors other than 1 are not implemented");
    }
  }
  return p;
}

QuantizationConfig parse_quantization(const json& q, const std::string& path,
                                      const std::string& prefix) {
  const Fields f(q, path, prefix + ".");
  if (!q.is_object())
    throw FormatError(path + ": " + prefix + " must be an object, got " + q.dump());
  QuantizationConfig out;
  out.quant_method = f.string("quant_method", "");
  if (out.quant_method != "compressed-tensors") {
    f.unsupported("quant_method", q.value("quant_method", json()),
                  "only \"compressed-tensors\" quantization is implemented");
  }
  out.format = f.string("format", "");
  if (f.has("ignore")) {
    const json& ig = f.at("ignore");
    if (!ig.is_array()) f.fail("ignore", "must be a list of strings, got " + ig.dump());
    for (const json& s : ig) {
      if (!s.is_string()) f.fail("ignore", "must be a list of strings, got " + ig.dump());
      out.ignore.push_back(s.get<std::string>());
    }
  }
  if (!f.has("config_groups") || !f.at("config_groups").is_object()) {
    f.fail("config_groups", "must be an object of quantization groups");
  }
  for (const auto& [gname, g] : f.at("config_groups").items()) {
    const std::string gprefix = prefix + ".config_groups." + gname;
    if (!g.is_object()) throw FormatError(path + ": " + gprefix + " must be an object");
    const Fields gf(g, path, gprefix + ".");
    QuantGroup group;
    if (!gf.has("targets") || !gf.at("targets").is_array()) {
      gf.fail("targets", "must be a list of strings");
    }
    for (const json& t : gf.at("targets")) {
      if (!t.is_string())
        gf.fail("targets", "must be a list of strings, got " + gf.at("targets").dump());
      group.targets.push_back(t.get<std::string>());
    }
    if (!gf.has("weights") || !gf.at("weights").is_object()) {
      gf.unsupported("weights", g.value("weights", json()),
                     "only weight quantization groups are implemented");
    }
    const Fields w(gf.at("weights"), path, gprefix + ".weights.");
    group.num_bits = w.positive("num_bits", group.num_bits);
    group.type = w.string("type", group.type);
    group.symmetric = w.boolean("symmetric", group.symmetric);
    group.strategy = w.string("strategy", group.strategy);
    group.group_size = w.integer("group_size", -1);
    if (group.strategy == "group" && group.group_size <= 0) {
      w.fail("group_size", "must be positive for strategy \"group\", got " +
                               gf.at("weights").value("group_size", json()).dump());
    }
    group.actorder = w.string("actorder", "");
    out.groups.push_back(std::move(group));
  }
  return out;
}

// transformers' default when layer_types is absent: every sixth layer full, the last forced full.
std::vector<LayerType> default_layer_types(int64_t n) {
  std::vector<LayerType> types(n);
  for (int64_t i = 0; i < n; ++i) types[i] = (i + 1) % 6 ? LayerType::kSliding : LayerType::kFull;
  if (n > 0) types.back() = LayerType::kFull;
  return types;
}

const char* layer_type_name(LayerType t) { return t == LayerType::kFull ? kFull : kSliding; }

VisionConfig parse_vision(const json& v, const std::string& path) {
  const Fields f(v, path, "vision_config.");
  VisionConfig c;
  const std::string model_type = f.string("model_type", "gemma4_vision");
  if (model_type != "gemma4_vision") {
    f.unsupported("model_type", f.at("model_type"), "expected \"gemma4_vision\"");
  }
  c.hidden_size = f.positive("hidden_size", c.hidden_size);
  c.intermediate_size = f.positive("intermediate_size", c.intermediate_size);
  c.num_hidden_layers = f.positive("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = f.positive("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_key_value_heads);
  c.head_dim = f.positive("head_dim", c.head_dim);
  c.hidden_activation = f.string("hidden_activation", c.hidden_activation);
  c.rms_norm_eps = f.number("rms_norm_eps", c.rms_norm_eps);
  c.pooling_kernel_size = f.positive("pooling_kernel_size", c.pooling_kernel_size);
  c.patch_size = f.positive("patch_size", c.patch_size);
  c.position_embedding_size = f.positive("position_embedding_size", c.position_embedding_size);
  c.use_clipped_linears = f.boolean("use_clipped_linears", c.use_clipped_linears);
  c.standardize = f.boolean("standardize", c.standardize);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    f.fail("num_attention_heads", "= " + std::to_string(c.num_attention_heads) +
                                      " is not a multiple of num_key_value_heads = " +
                                      std::to_string(c.num_key_value_heads));
  }
  // Axial RoPE rotates x on one half of head_dim and y on the other, each in pairs.
  if (c.head_dim % 4 != 0) {
    f.unsupported("head_dim", f.at("head_dim"), "axial RoPE needs a multiple of 4");
  }
  if (!(c.rms_norm_eps > 0))
    f.fail("rms_norm_eps", "must be positive, got " + f.at("rms_norm_eps").dump());
  if (c.hidden_activation != "gelu_pytorch_tanh" && c.hidden_activation != "gelu_tanh") {
    f.unsupported("hidden_activation", f.at("hidden_activation"),
                  "only the tanh-approximated GELU (gelu_pytorch_tanh) is implemented");
  }
  f.require_false("attention_bias", "the vision encoder has no projection biases");
  if (f.has("rope_parameters")) {
    const json& rp = f.at("rope_parameters");
    if (!rp.is_object()) f.fail("rope_parameters", "must be an object, got " + rp.dump());
    const Fields r(rp, path, "vision_config.rope_parameters.");
    for (const auto& [key, value] : rp.items()) {
      if (key != "rope_type" && key != "rope_theta") {
        r.unsupported(key, value, "unknown RoPE parameter for the vision encoder");
      }
    }
    if (r.string("rope_type", "axial") != "axial") {
      r.unsupported("rope_type", r.at("rope_type"), "the vision encoder's RoPE is \"axial\"");
    }
    c.rope_theta = r.number("rope_theta", c.rope_theta);
    if (!(c.rope_theta > 0)) r.fail("rope_theta", "must be positive, got " + rp.dump());
  }
  return c;
}

// audio_config (Gemma4AudioConfig); every value the encoder's shapes or arithmetic depend on is
// checked here, so the tower can trust it.
AudioConfig parse_audio_config(const json& a, const std::string& path) {
  if (!a.is_object()) throw FormatError(path + ": audio_config must be an object, got " + a.dump());
  const Fields f(a, path, "audio_config.");
  const std::string model_type = f.string("model_type", "gemma4_audio");
  if (model_type != "gemma4_audio") {
    f.unsupported("model_type", f.at("model_type"), "expected \"gemma4_audio\"");
  }
  AudioConfig c;
  c.hidden_size = f.positive("hidden_size", c.hidden_size);
  c.num_hidden_layers = f.positive("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = f.positive("num_attention_heads", c.num_attention_heads);
  c.hidden_act = f.string("hidden_act", c.hidden_act);
  c.conv_kernel_size = f.positive("conv_kernel_size", c.conv_kernel_size);
  c.residual_weight = f.number("residual_weight", c.residual_weight);
  c.attention_chunk_size = f.positive("attention_chunk_size", c.attention_chunk_size);
  c.attention_context_left = f.positive("attention_context_left", c.attention_context_left);
  c.attention_context_right = f.integer("attention_context_right", c.attention_context_right);
  c.attention_logit_cap = f.number("attention_logit_cap", c.attention_logit_cap);
  c.attention_invalid_logits_value =
      f.number("attention_invalid_logits_value", c.attention_invalid_logits_value);
  c.use_clipped_linears = f.boolean("use_clipped_linears", c.use_clipped_linears);
  c.rms_norm_eps = f.number("rms_norm_eps", c.rms_norm_eps);
  c.gradient_clipping = f.number("gradient_clipping", c.gradient_clipping);
  c.output_proj_dims = f.positive("output_proj_dims", c.output_proj_dims);

  if (f.has("subsampling_conv_channels")) {
    const json& ch = f.at("subsampling_conv_channels");
    if (!ch.is_array() || ch.size() != 2 || !ch[0].is_number_integer() ||
        !ch[1].is_number_integer() || ch[0].get<int64_t>() <= 0 || ch[1].get<int64_t>() <= 0) {
      f.unsupported("subsampling_conv_channels", ch,
                    "the subsampling stack has exactly two convolutions: two positive channel "
                    "counts");
    }
    c.subsampling_conv_channels[0] = ch[0].get<int64_t>();
    c.subsampling_conv_channels[1] = ch[1].get<int64_t>();
  }
  // transformers sizes input_proj_linear from channels[0] / 4 frequency bins.
  if (c.subsampling_conv_channels[0] % 4 != 0) {
    f.unsupported("subsampling_conv_channels", f.at("subsampling_conv_channels"),
                  "the first channel count must be a multiple of 4");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    f.fail("hidden_size", "= " + std::to_string(c.hidden_size) +
                              " is not a multiple of num_attention_heads = " +
                              std::to_string(c.num_attention_heads));
  }
  if (c.hidden_size % 2 != 0) {
    f.fail("hidden_size", "= " + std::to_string(c.hidden_size) +
                              " must be even (sin and cos halves of the position encoding)");
  }
  if (c.hidden_act != "silu" && c.hidden_act != "gelu_pytorch_tanh") {
    f.unsupported("hidden_act", f.at("hidden_act"),
                  "only \"silu\" and \"gelu_pytorch_tanh\" are implemented");
  }
  if (c.attention_context_right < 0) {
    f.fail("attention_context_right",
           "must be 0 or positive, got " + std::to_string(c.attention_context_right));
  }
  if (!(c.attention_logit_cap > 0)) {
    f.fail("attention_logit_cap", "must be positive, got " + f.at("attention_logit_cap").dump());
  }
  if (!(c.rms_norm_eps > 0)) {
    f.fail("rms_norm_eps", "must be positive, got " + f.at("rms_norm_eps").dump());
  }
  if (!(c.gradient_clipping > 0)) {
    f.fail("gradient_clipping", "must be positive, got " + f.at("gradient_clipping").dump());
  }
  return c;
}

}  // namespace

ModelConfig parse_config_json(const std::string& json_text, const std::string& path) {
  const json root = parse_json(json_text, path);
  const Fields top(root, path, "");
  const std::string model_type = top.string("model_type", "");
  const json* text = &root;
  std::string prefix;
  const bool assistant = model_type == "gemma4_assistant";
  if (model_type == "gemma4" || assistant) {
    if (!top.has("text_config") || !root["text_config"].is_object()) {
      top.fail("text_config", "must be an object for model_type \"" + model_type + "\"");
    }
    text = &root["text_config"];
    prefix = "text_config.";
    const Fields tf(*text, path, prefix);
    const std::string inner = tf.string("model_type", "gemma4_text");
    if (inner != "gemma4_text") {
      tf.unsupported("model_type", (*text)["model_type"], "expected \"gemma4_text\"");
    }
  } else if (model_type != "gemma4_text") {
    top.unsupported("model_type", root.value("model_type", json()),
                    "expected \"gemma4\", \"gemma4_text\" or \"gemma4_assistant\"");
  }
  const Fields f(*text, path, prefix);

  ModelConfig c;
  if (assistant) {
    AssistantConfig a;
    a.backbone_hidden_size = top.positive("backbone_hidden_size", a.backbone_hidden_size);
    a.use_ordered_embeddings = top.boolean("use_ordered_embeddings", a.use_ordered_embeddings);
    a.num_centroids = top.positive("num_centroids", a.num_centroids);
    a.centroid_intermediate_top_k =
        top.positive("centroid_intermediate_top_k", a.centroid_intermediate_top_k);
    c.assistant = a;
  } else if (text != &root) {
    if (top.has("vision_config")) {
      if (!root["vision_config"].is_object())
        top.fail("vision_config", "must be an object or null, got " + root["vision_config"].dump());
      c.vision = parse_vision(root["vision_config"], path);
    }
    for (auto [key, field] :
         {std::pair{"image_token_id", &c.image_token_id},
          std::pair{"boi_token_id", &c.boi_token_id}, std::pair{"eoi_token_id", &c.eoi_token_id}}) {
      *field = root.contains(key) && root[key].is_null() ? -1 : top.integer(key, *field);
    }
  }
  c.text_fields = prefix;
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim",
                          "hidden_size_per_layer_input", "vocab_size_per_layer_input"}) {
    if (!f.has(key)) c.defaulted_fields.push_back(f.name(key));
  }
  if (assistant) {
    for (const char* key : {"backbone_hidden_size", "num_centroids"}) {
      if (!top.has(key)) c.defaulted_fields.push_back(key);
    }
  }
  c.vocab_size = f.positive("vocab_size", 262144);
  c.hidden_size = f.positive("hidden_size", 2304);
  c.intermediate_size = f.positive("intermediate_size", 9216);
  c.num_hidden_layers = f.positive("num_hidden_layers", 30);
  c.num_attention_heads = f.positive("num_attention_heads", 8);
  c.num_key_value_heads = f.positive("num_key_value_heads", 4);
  c.head_dim = f.positive("head_dim", 256);
  c.max_position_embeddings = f.positive("max_position_embeddings", 131072);
  c.sliding_window = f.positive("sliding_window", 512);
  c.hidden_size_per_layer_input = f.integer("hidden_size_per_layer_input", 256);
  // An assistant has no per-layer inputs and writes their table's size as 0.
  c.vocab_size_per_layer_input = assistant ? f.integer("vocab_size_per_layer_input", 0)
                                           : f.positive("vocab_size_per_layer_input", 262144);
  c.use_double_wide_mlp = f.boolean("use_double_wide_mlp", false);
  c.num_kv_shared_layers = f.integer("num_kv_shared_layers", 0);
  // Gemma4AssistantConfig makes every layer shared when the text config names none.
  if (assistant && c.num_kv_shared_layers == 0) c.num_kv_shared_layers = c.num_hidden_layers;
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.final_logit_softcapping = f.number("final_logit_softcapping", 0.0);
  c.hidden_activation = f.string("hidden_activation", "gelu_pytorch_tanh");
  c.bos_token_id = f.integer("bos_token_id", 2);
  c.pad_token_id = f.integer("pad_token_id", 0);
  // null ids (allowed by transformers) read as -1.
  if (text->contains("bos_token_id") && (*text)["bos_token_id"].is_null()) c.bos_token_id = -1;
  if (text->contains("pad_token_id") && (*text)["pad_token_id"].is_null()) c.pad_token_id = -1;

  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    f.fail("num_attention_heads", "= " + std::to_string(c.num_attention_heads) +
                                      " is not a multiple of num_key_value_heads = " +
                                      std::to_string(c.num_key_value_heads));
  }
  if (c.hidden_size_per_layer_input < 0) {
    f.fail("hidden_size_per_layer_input", "must be 0 (no per-layer inputs) or positive, got " +
                                              std::to_string(c.hidden_size_per_layer_input));
  }
  // PLE rows are looked up with the token ids; a table at least as large as the vocabulary is
  // what transformers builds, a smaller one would be indexed out of range.
  if (!assistant && c.hidden_size_per_layer_input > 0 &&
      c.vocab_size_per_layer_input < c.vocab_size) {
    f.unsupported("vocab_size_per_layer_input", c.vocab_size_per_layer_input,
                  "it is smaller than vocab_size = " + std::to_string(c.vocab_size));
  }
  if (!(c.rms_norm_eps > 0))
    f.fail("rms_norm_eps", "must be positive, got " + f.at("rms_norm_eps").dump());
  if (f.has("final_logit_softcapping") && !(c.final_logit_softcapping > 0)) {
    f.fail("final_logit_softcapping",
           "must be positive or null, got " + f.at("final_logit_softcapping").dump());
  }
  if (c.hidden_activation != "gelu_pytorch_tanh" && c.hidden_activation != "gelu_tanh") {
    f.unsupported("hidden_activation", f.at("hidden_activation"),
                  "only the tanh-approximated GELU (gelu_pytorch_tanh) is implemented");
  }
  f.require_false("attention_k_eq_v", "keys equal to values is a feature of the large models");
  f.require_false("enable_moe_block", "mixture-of-experts blocks are not implemented");
  f.require_false("attention_bias", "the text model has no projection biases");
  f.require_false("use_bidirectional_attention", "only causal attention is implemented");

  if (f.has("layer_types")) {
    const json& lt = f.at("layer_types");
    if (!lt.is_array()) f.fail("layer_types", "must be a list, got " + lt.dump());
    if (static_cast<int64_t>(lt.size()) != c.num_hidden_layers) {
      f.fail("layer_types",
             "has " + std::to_string(lt.size()) +
                 " entries but num_hidden_layers = " + std::to_string(c.num_hidden_layers));
    }
    for (size_t i = 0; i < lt.size(); ++i) {
      const std::string field = "layer_types[" + std::to_string(i) + "]";
      if (lt[i] == kSliding) {
        c.layer_types.push_back(LayerType::kSliding);
      } else if (lt[i] == kFull) {
        c.layer_types.push_back(LayerType::kFull);
      } else {
        f.unsupported(field, lt[i], "expected \"sliding_attention\" or \"full_attention\"");
      }
    }
    // transformers silently turns a sliding last layer into a full one; say so instead.
    if (c.layer_types.back() != LayerType::kFull) {
      f.unsupported("layer_types[" + std::to_string(lt.size() - 1) + "]", lt.back(),
                    "the last layer must be \"full_attention\" (transformers forces it)");
    }
  } else {
    c.layer_types = default_layer_types(c.num_hidden_layers);
  }

  if (assistant) {
    // transformers' Gemma4AssistantConfig.validate_architecture, as FormatErrors.
    if (c.hidden_size_per_layer_input != 0) {
      f.unsupported("hidden_size_per_layer_input", c.hidden_size_per_layer_input,
                    "an assistant has no per-layer inputs (0)");
    }
    if (c.use_double_wide_mlp) {
      f.unsupported("use_double_wide_mlp", true, "an assistant's MLPs are all one width");
    }
    if (c.num_kv_shared_layers != c.num_hidden_layers) {
      f.unsupported("num_kv_shared_layers", c.num_kv_shared_layers,
                    "every layer of an assistant reads the target's K/V (num_hidden_layers = " +
                        std::to_string(c.num_hidden_layers) + ")");
    }
    const auto& a = *c.assistant;
    if (a.use_ordered_embeddings &&
        (c.vocab_size % a.num_centroids != 0 || a.centroid_intermediate_top_k > a.num_centroids)) {
      top.fail("num_centroids", "= " + std::to_string(a.num_centroids) +
                                    " must divide text_config.vocab_size = " +
                                    std::to_string(c.vocab_size) +
                                    " and be at least centroid_intermediate_top_k = " +
                                    std::to_string(a.centroid_intermediate_top_k));
    }
  } else if (c.num_kv_shared_layers < 0 || c.num_kv_shared_layers >= c.num_hidden_layers) {
    f.fail("num_kv_shared_layers",
           "= " + std::to_string(c.num_kv_shared_layers) +
               " must be in [0, num_hidden_layers = " + std::to_string(c.num_hidden_layers) + ")");
  }
  for (int64_t l = assistant ? c.num_hidden_layers : c.first_shared_layer();
       l < c.num_hidden_layers; ++l) {
    const auto t = c.layer_types[l];
    bool found = false;
    for (int64_t s = 0; s < c.first_shared_layer(); ++s) found = found || c.layer_types[s] == t;
    if (!found) {
      f.fail("num_kv_shared_layers",
             "= " + std::to_string(c.num_kv_shared_layers) + " leaves shared layer " +
                 std::to_string(l) + " (" + layer_type_name(t) +
                 ") without a non-shared layer of the same type to read K/V from");
    }
  }

  // Head dims and KV heads per layer: the older form has global_head_dim (default 512) and
  // num_global_key_value_heads at the top; transformers >= 5.24 writes per_layer_config
  // {"<layer>": {"head_dim": ..., "num_key_value_heads": ...}} instead and ignores the older keys.
  std::vector<int64_t> head_dims(c.num_hidden_layers), kv_heads(c.num_hidden_layers);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    kv_heads[l] = c.num_key_value_heads;
    head_dims[l] = c.head_dim;
  }
  if (f.has("per_layer_config")) {
    const json& plc = f.at("per_layer_config");
    if (!plc.is_object()) f.fail("per_layer_config", "must be an object keyed by layer index");
    for (const auto& [key, overrides] : plc.items()) {
      const std::string field = "per_layer_config." + key;
      int64_t layer = -1;
      try {
        size_t used = 0;
        layer = std::stoll(key, &used);
        if (used != key.size()) layer = -1;
      } catch (const std::exception&) {
        layer = -1;
      }
      if (layer < 0 || layer >= c.num_hidden_layers) {
        f.fail(field, "is not a layer index in [0, " + std::to_string(c.num_hidden_layers) + ")");
      }
      if (!overrides.is_object()) f.fail(field, "must be an object, got " + overrides.dump());
      const Fields o(overrides, path, prefix + field + ".");
      for (const auto& [attr, value] : overrides.items()) {
        if (attr != "head_dim" && attr != "num_key_value_heads") {
          o.unsupported(attr, value, "only head_dim and num_key_value_heads may vary per layer");
        }
      }
      head_dims[layer] = o.positive("head_dim", c.head_dim);
      kv_heads[layer] = o.positive("num_key_value_heads", c.num_key_value_heads);
    }
  } else {
    const int64_t global_head_dim = f.positive("global_head_dim", 512);
    if (!f.has("global_head_dim")) c.defaulted_fields.push_back(f.name("global_head_dim"));
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (c.layer_types[l] == LayerType::kFull) head_dims[l] = global_head_dim;
    }
    c.global_head_dim = global_head_dim;
    if (f.has("num_global_key_value_heads") &&
        f.integer("num_global_key_value_heads", 0) != c.num_key_value_heads) {
      f.unsupported("num_global_key_value_heads", f.at("num_global_key_value_heads"),
                    "full layers must have num_key_value_heads = " +
                        std::to_string(c.num_key_value_heads) + " KV heads");
    }
  }
  bool have_full = false;
  if (c.global_head_dim == 0) c.global_head_dim = c.head_dim;  // no full layer names one
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string field = f.has("per_layer_config") ? "per_layer_config." + std::to_string(l)
                                                        : std::string("head_dim");
    if (kv_heads[l] != c.num_key_value_heads) {
      f.unsupported(
          field, json{{"num_key_value_heads", kv_heads[l]}},
          "every layer must have num_key_value_heads = " + std::to_string(c.num_key_value_heads));
    }
    if (c.layer_types[l] == LayerType::kSliding) {
      if (head_dims[l] != c.head_dim) {
        f.unsupported(field, json{{"head_dim", head_dims[l]}},
                      "sliding layers must all have head_dim = " + std::to_string(c.head_dim));
      }
    } else if (!have_full) {
      c.global_head_dim = head_dims[l];
      have_full = true;
    } else if (head_dims[l] != c.global_head_dim) {
      f.unsupported(field, json{{"head_dim", head_dims[l]}},
                    "full layers must all have the same head_dim (" +
                        std::to_string(c.global_head_dim) + ")");
    }
    // RoPE rotates dimension j with j + head_dim / 2.
    if (head_dims[l] % 2 != 0) {
      f.unsupported(field, json{{"head_dim", head_dims[l]}}, "RoPE needs an even head_dim");
    }
  }

  if (f.has("rope_parameters")) {
    const json& rp = f.at("rope_parameters");
    if (!rp.is_object()) f.fail("rope_parameters", "must be an object, got " + rp.dump());
    const Fields r(rp, path, prefix + "rope_parameters.");
    for (const auto& [key, value] : rp.items()) {
      if (key != kSliding && key != kFull) {
        f.unsupported("rope_parameters." + key, value,
                      "rope_parameters must be keyed by layer type (\"sliding_attention\", "
                      "\"full_attention\")");
      }
    }
    for (const LayerType t : {LayerType::kSliding, LayerType::kFull}) {
      const std::string name = layer_type_name(t);
      const bool used = std::count(c.layer_types.begin(), c.layer_types.end(), t) > 0;
      if (!r.has(name)) {
        if (used) r.fail(name, "is missing but layer_types uses " + name);
        continue;
      }
      (t == LayerType::kFull ? c.rope_full : c.rope_sliding) = parse_rope(r, name);
    }
  } else {
    c.rope_sliding = RopeParams{"default", 10000.0, 1.0, 1.0};
    c.rope_full = RopeParams{"proportional", 1000000.0, 0.25, 1.0};
  }

  // eos ids: text config first (transformers' default 1 when absent), then the top level.
  if (text->contains("eos_token_id")) {
    f.append_ids("eos_token_id", &c.eos_token_ids);
  } else {
    c.eos_token_ids.push_back(1);
  }
  if (text != &root) top.append_ids("eos_token_id", &c.eos_token_ids);

  if (text != &root && top.has("tie_word_embeddings") && f.has("tie_word_embeddings") &&
      top.boolean("tie_word_embeddings", true) != f.boolean("tie_word_embeddings", true)) {
    top.fail("tie_word_embeddings", "= " + top.at("tie_word_embeddings").dump() +
                                        " contradicts text_config.tie_word_embeddings = " +
                                        f.at("tie_word_embeddings").dump());
  }
  c.tie_word_embeddings = text != &root && top.has("tie_word_embeddings")
                              ? top.boolean("tie_word_embeddings", true)
                              : f.boolean("tie_word_embeddings", true);

  if (text != &root) {
    if (top.has("audio_config")) c.audio = parse_audio_config(root["audio_config"], path);
    auto id = [&](const char* key, int64_t def) {
      return root.contains(key) && root[key].is_null() ? -1 : top.integer(key, def);
    };
    c.audio_token_id = id("audio_token_id", c.audio_token_id);
    c.boa_token_id = id("boa_token_id", c.boa_token_id);
    c.eoa_token_index = id("eoa_token_index", c.eoa_token_index);
  }

  const bool q_top = text != &root && top.has("quantization_config");
  const bool q_text = f.has("quantization_config");
  if (q_top && q_text && root["quantization_config"] != f.at("quantization_config")) {
    top.fail("quantization_config", "differs from text_config.quantization_config");
  }
  if (q_top) {
    c.quantization = parse_quantization(root["quantization_config"], path, "quantization_config");
  } else if (q_text) {
    c.quantization =
        parse_quantization(f.at("quantization_config"), path, prefix + "quantization_config");
  }
  return c;
}

void check_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw NotFoundError("checkpoint directory " + dir +
                        " is a file: give the directory that holds config.json");
  }
  if (!fs::is_directory(dir, ec)) {
    throw NotFoundError("checkpoint directory " + dir + " does not exist");
  }
  if (!fs::is_regular_file(fs::path(dir) / "config.json", ec)) {
    throw FormatError("checkpoint " + dir + " has no config.json");
  }
}

ModelConfig load_config(const std::string& dir) {
  check_checkpoint_dir(dir);
  const fs::path config_path = fs::path(dir) / "config.json";
  std::error_code ec;
  ModelConfig c = parse_config_json(read_text(config_path.string()), config_path.string());
  const fs::path gen_path = fs::path(dir) / "generation_config.json";
  if (fs::is_regular_file(gen_path, ec)) {
    const json gen = parse_json(read_text(gen_path.string()), gen_path.string());
    Fields(gen, gen_path.string(), "").append_ids("eos_token_id", &c.eos_token_ids);
  }
  return c;
}

double LoraConfig::scaling(int64_t rank) const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(rank))
                    : lora_alpha / static_cast<double>(rank);
}

LoraConfig parse_lora_config_json(const std::string& json_text, const std::string& path) {
  const json root = parse_json(json_text, path);
  const Fields f(root, path, "");
  const std::string type = f.string("peft_type", "");
  if (type != "LORA") {
    f.fail("peft_type", "must be \"LORA\" (a LoRA adapter), got " + f.at("peft_type").dump());
  }
  LoraConfig c;
  c.r = f.positive("r", c.r);
  c.lora_alpha = f.number("lora_alpha", c.lora_alpha);
  c.use_rslora = f.boolean("use_rslora", false);
  c.rank_pattern = !f.at("rank_pattern").is_null() && !f.at("rank_pattern").empty();
  c.base_model = f.string("base_model_name_or_path", "");
  f.require_false("use_dora", "DoRA's magnitude vectors are not applied");
  f.require_false("lora_bias", "LoRA biases are not applied");
  f.require_false("fan_in_fan_out", "the weights must be stored [out, in] as nn.Linear's");
  f.require_false("use_qalora", "QALoRA's pooled inputs are not applied");
  if (f.has("bias") && f.at("bias") != "none") {
    f.unsupported("bias", f.at("bias"), "only \"none\": trained biases are not applied");
  }
  // Non-empty forms of these train or reshape something beside the low-rank terms.
  for (const char* key : {"modules_to_save", "alpha_pattern", "layer_replication",
                          "target_parameters", "trainable_token_indices"}) {
    const json& v = f.at(key);
    if (!v.is_null() && !v.empty()) {
      f.unsupported(key, v,
                    "only the low-rank terms of linears with one lora_alpha are applied");
    }
  }
  return c;
}

LoraConfig load_lora_config(const std::string& dir) {
  const fs::path path = fs::path(dir) / "adapter_config.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw NotFoundError("LoRA adapter directory " + dir + " does not exist");
  }
  if (!fs::is_regular_file(path, ec)) {
    throw FormatError("LoRA adapter " + dir +
                      " has no adapter_config.json (a PEFT adapter's directory holds "
                      "adapter_config.json and adapter_model.safetensors)");
  }
  return parse_lora_config_json(read_text(path.string()), path.string());
}

namespace {
void check_layer(const ModelConfig& c, int64_t layer) {
  if (layer < 0 || layer >= c.num_hidden_layers ||
      layer >= static_cast<int64_t>(c.layer_types.size())) {
    throw ValueError("layer " + std::to_string(layer) + " is outside [0, " +
                     std::to_string(c.num_hidden_layers) + ")");
  }
}
}  // namespace

int64_t ModelConfig::kv_source(int64_t layer) const {
  check_layer(*this, layer);
  if (!is_shared(layer)) return layer;
  for (int64_t s = first_shared_layer() - 1; s >= 0; --s) {
    if (layer_types[s] == layer_types[layer]) return s;
  }
  throw ValueError("shared layer " + std::to_string(layer) + " has no source layer");
}

int64_t ModelConfig::layer_head_dim(int64_t layer) const {
  check_layer(*this, layer);
  return layer_types[layer] == LayerType::kFull ? global_head_dim : head_dim;
}

int64_t ModelConfig::mlp_width(int64_t layer) const {
  check_layer(*this, layer);
  return use_double_wide_mlp && is_shared(layer) ? 2 * intermediate_size : intermediate_size;
}

const RopeParams& ModelConfig::rope(int64_t layer) const {
  check_layer(*this, layer);
  return layer_types[layer] == LayerType::kFull ? rope_full : rope_sliding;
}

}  // namespace torchtpu
