#include "io/implied_shapes.h"

#include <algorithm>
#include <utility>

#include "common/errors.h"

namespace torchtpu {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct Factor {
  std::string field;  // as config.json spells it, or a constant ("2")
  int64_t value;
};

// A dimension that is the product of `factors`, its source naming each field and, for one that
// config.json leaves out, that its value is transformers' default.
ImpliedDim product(const ModelConfig& c, const std::vector<Factor>& factors,
                   const std::string& why = "") {
  ImpliedDim d{1, ""};
  std::string names, values;
  std::vector<const Factor*> defaulted;
  for (const Factor& f : factors) {
    d.size *= f.value;
    names += (names.empty() ? "" : " * ") + f.field;
    values += (values.empty() ? "" : " * ") + std::to_string(f.value);
    const auto& absent = c.defaulted_fields;
    if (std::find(absent.begin(), absent.end(), f.field) != absent.end()) defaulted.push_back(&f);
  }
  d.source = names + " = " + (factors.size() > 1 ? values + " = " : "") + std::to_string(d.size);
  if (!why.empty()) d.source += ", " + why;
  for (const Factor* f : defaulted) {
    d.source += factors.size() == 1 ? ", transformers' default"
                                    : ", where " + f->field + " = " + std::to_string(f->value) +
                                          " is transformers' default";
    d.source += ": config.json does not set it";
  }
  return d;
}

// N of "<layer_prefix>N.…", -1 for a name that is not a layer's.
int64_t layer_of(const std::string& name, const std::string& layer_prefix) {
  if (name.rfind(layer_prefix, 0) != 0) return -1;
  const size_t end = name.find('.', layer_prefix.size());
  const std::string digits = name.substr(layer_prefix.size(), end - layer_prefix.size());
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return -1;
  }
  return std::stoll(digits);
}

}  // namespace

std::vector<int64_t> ImpliedTensor::shape() const {
  std::vector<int64_t> s;
  for (const ImpliedDim& d : dims) s.push_back(d.size);
  return s;
}

std::string ImpliedTensor::against(const std::vector<int64_t>& actual) const {
  std::string sources;
  for (size_t i = 0; i < dims.size(); ++i) {
    const bool contradicted = actual.size() != dims.size() || actual[i] != dims[i].size;
    if (!contradicted || dims[i].source.empty()) continue;
    sources += (sources.empty() ? "" : "; ") + dims[i].source;
  }
  return shape_text(shape()) + (sources.empty() ? "" : " (" + sources + ")");
}

std::map<std::string, ImpliedTensor> implied_tensors(const ModelConfig& c,
                                                     const std::string& prefix) {
  const std::string& t = c.text_fields;
  auto field = [&](const std::string& key, int64_t value) {
    return product(c, {{t + key, value}});
  };
  const ImpliedDim H = field("hidden_size", c.hidden_size);
  const ImpliedDim one{1, ""};
  std::map<std::string, ImpliedTensor> out;
  auto add = [&](const std::string& name, std::vector<ImpliedDim> dims, bool required = true) {
    out[name] = ImpliedTensor{std::move(dims), required};
  };

  const int64_t L = c.num_hidden_layers, P = c.hidden_size_per_layer_input;
  const Factor layers{t + "num_hidden_layers", L};
  const Factor ple{t + "hidden_size_per_layer_input", P};
  for (int64_t l = 0; l < L; ++l) {
    const std::string lp = prefix + "layers." + std::to_string(l) + ".";
    const Factor d = c.layer_types[l] == LayerType::kFull
                         ? Factor{t + "global_head_dim", c.layer_head_dim(l)}
                         : Factor{t + "head_dim", c.layer_head_dim(l)};
    const ImpliedDim q = product(c, {{t + "num_attention_heads", c.num_attention_heads}, d});
    const ImpliedDim kv = product(c, {{t + "num_key_value_heads", c.num_key_value_heads}, d});
    const ImpliedDim F =
        c.mlp_width(l) == c.intermediate_size
            ? field("intermediate_size", c.intermediate_size)
            : product(c, {{"2", 2}, {t + "intermediate_size", c.intermediate_size}},
                      "on a KV-shared layer with " + t + "use_double_wide_mlp");
    for (const char* norm : {"input_layernorm", "post_attention_layernorm",
                             "pre_feedforward_layernorm", "post_feedforward_layernorm"}) {
      add(lp + norm + ".weight", {H});
    }
    add(lp + "self_attn.q_proj.weight", {q, H});
    add(lp + "self_attn.q_norm.weight", {product(c, {d})});
    // A KV-shared layer reads its source's K/V: its own k/v/k_norm, in the published checkpoint
    // and absent from re-saved ones, are dead weights that may be left out.
    const bool own_kv = !c.is_shared(l);
    add(lp + "self_attn.k_proj.weight", {kv, H}, own_kv);
    add(lp + "self_attn.v_proj.weight", {kv, H}, own_kv);
    add(lp + "self_attn.k_norm.weight", {product(c, {d})}, own_kv);
    add(lp + "self_attn.o_proj.weight", {H, q});
    add(lp + "mlp.gate_proj.weight", {F, H});
    add(lp + "mlp.up_proj.weight", {F, H});
    add(lp + "mlp.down_proj.weight", {H, F});
    if (P > 0) {
      add(lp + "per_layer_input_gate.weight", {product(c, {ple}), H});
      add(lp + "per_layer_projection.weight", {H, product(c, {ple})});
      add(lp + "post_per_layer_input_norm.weight", {H});
    }
    add(lp + "layer_scalar", {one});
  }
  add(prefix + "norm.weight", {H});
  const ImpliedDim vocab = field("vocab_size", c.vocab_size);
  add(prefix + "embed_tokens.weight", {vocab, H});
  add("lm_head.weight", {vocab, H}, !c.tie_word_embeddings);
  if (P > 0) {
    add(prefix + "per_layer_model_projection.weight", {product(c, {layers, ple}), H});
    add(prefix + "per_layer_projection_norm.weight", {product(c, {ple})});
    add(prefix + "embed_tokens_per_layer.weight",
        {field("vocab_size_per_layer_input", c.vocab_size_per_layer_input),
         product(c, {layers, ple})});
  }
  if (c.assistant) {
    const auto& a = *c.assistant;
    const Factor backbone{"backbone_hidden_size", a.backbone_hidden_size};
    add("pre_projection.weight", {H, product(c, {{"2", 2}, backbone})});
    add("post_projection.weight", {product(c, {backbone}), H});
    if (a.use_ordered_embeddings) {
      add("masked_embedding.centroids.weight",
          {product(c, {{"num_centroids", a.num_centroids}}), H});
      add("masked_embedding.token_ordering", {vocab});
    }
  }
  return out;
}

void expect_implied_shape(const TensorView& view, const ImpliedTensor& implied) {
  if (view.shape != implied.shape()) {
    throw FormatError("tensor " + view.name + " in " + view.file + " has shape " +
                      shape_text(view.shape) + " but config.json implies " +
                      implied.against(view.shape));
  }
}

void check_implied_tensors(const Checkpoint& ckpt, const ModelConfig& config) {
  const std::string& prefix = ckpt.prefix();
  const auto implied = implied_tensors(config, prefix);
  const std::string layers =
      config.text_fields + "num_hidden_layers = " + std::to_string(config.num_hidden_layers);
  const std::string layer_prefix = prefix + "layers.";
  const std::vector<std::string> names = ckpt.names();
  int64_t last_layer = -1;
  for (const std::string& name : names) {
    last_layer = std::max(last_layer, layer_of(name, layer_prefix));
  }
  for (const auto& [name, tensor] : implied) {
    if (const TensorView* view = ckpt.find(name)) {
      expect_implied_shape(*view, tensor);
    } else if (tensor.required) {
      std::string why;
      if (layer_of(name, layer_prefix) > last_layer) {
        why = " (" + layers + "; the checkpoint " +
              (last_layer < 0 ? "has no layers)"
                              : "ends at layer " + std::to_string(last_layer) + ")");
      }
      throw FormatError("checkpoint " + ckpt.dir() + " has no tensor " + name +
                        ", which config.json implies" + why);
    }
  }
  for (const std::string& name : names) {
    if (name.rfind(prefix, 0) != 0 || implied.count(name)) continue;
    const TensorView& view = ckpt.get(name);
    std::string why;
    if (layer_of(name, layer_prefix) >= config.num_hidden_layers) {
      why = " (" + layers + ")";
    } else if (name.find("per_layer") != std::string::npos &&
               config.hidden_size_per_layer_input == 0) {
      why = " (" + config.text_fields + "hidden_size_per_layer_input = 0: no per-layer inputs)";
    }
    throw FormatError("checkpoint " + ckpt.dir() + " has tensor " + name + " " +
                      shape_text(view.shape) + " in " + view.file +
                      ", which config.json does not imply" + why);
  }
}

}  // namespace torchtpu
