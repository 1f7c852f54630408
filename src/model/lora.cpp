#include "model/lora.h"

#include <filesystem>
#include <map>
#include <regex>

#include "common/errors.h"
#include "common/shape.h"
#include "io/aten_view.h"
#include "io/safetensors.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;

constexpr std::array<const char*, kLoraTargets> kTargetNames = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
    "mlp.down_proj",    "per_layer_input_gate", "per_layer_projection"};

// [out, in] of layer l's linear t, as config.json gives it.
std::pair<int64_t, int64_t> target_shape(const ModelConfig& c, int64_t l, LoraTarget t) {
  const int64_t H = c.hidden_size, F = c.mlp_width(l), P = c.hidden_size_per_layer_input;
  const int64_t q = c.num_attention_heads * c.layer_head_dim(l);
  const int64_t kv = c.num_key_value_heads * c.layer_head_dim(l);
  switch (t) {
    case LoraTarget::kQ: return {q, H};
    case LoraTarget::kK:
    case LoraTarget::kV: return {kv, H};
    case LoraTarget::kO: return {H, q};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {F, H};
    case LoraTarget::kDown: return {H, F};
    case LoraTarget::kPerLayerGate: return {P, H};
    case LoraTarget::kPerLayerProjection: return {H, P};
  }
  return {0, 0};
}

}  // namespace

const char* lora_target_name(LoraTarget t) { return kTargetNames[static_cast<int>(t)]; }

LoraAdapter::LoraAdapter(const std::string& dir, const ModelConfig& config, at::Device device,
                         at::ScalarType dtype)
    : dir_(dir), config_(load_lora_config(dir)), layers_(config.num_hidden_layers) {
  const fs::path path = fs::path(dir) / "adapter_model.safetensors";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    const bool pickle = fs::is_regular_file(fs::path(dir) / "adapter_model.bin", ec);
    throw FormatError("LoRA adapter " + dir + " has no adapter_model.safetensors" +
                      (pickle ? " (adapter_model.bin, a pickle, is not read: save the adapter "
                                "with PEFT's default safe_serialization=True)"
                              : ""));
  }
  const SafetensorsFile file(path.string());
  // PEFT's names: base_model.model. + the module's path in the model it adapted (a
  // Gemma4ForConditionalGeneration's model.language_model., a Gemma4ForCausalLM's model.) +
  // lora_A / lora_B.
  static const std::regex kName(
      R"(base_model\.model\.model\.(language_model\.)?layers\.(\d+)\.)"
      R"((self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|per_layer_input_gate|)"
      R"(per_layer_projection)\.lora_([AB])\.weight)");
  std::map<std::pair<int64_t, int>, std::array<const TensorView*, 2>> found;
  std::vector<const TensorView*> views;
  for (const auto& [name, view] : file.tensors()) {
    views.push_back(&view);
    std::smatch m;
    if (!std::regex_match(name, m, kName)) {
      throw FormatError("LoRA adapter " + path.string() + " adapts " + name +
                        ", which torchtpu-cpp does not: adapters apply to the text layers' "
                        "q/k/v/o_proj, gate/up/down_proj, per_layer_input_gate and "
                        "per_layer_projection, as lora_A / lora_B pairs");
    }
    const int64_t layer = std::stoll(m[2].str());
    if (layer >= config.num_hidden_layers) {
      throw FormatError("LoRA adapter " + path.string() + " has " + name + " but the model has " +
                        std::to_string(config.num_hidden_layers) + " layers");
    }
    const auto target = std::find(kTargetNames.begin(), kTargetNames.end(), m[3].str());
    found[{layer, static_cast<int>(target - kTargetNames.begin())}][m[5].str() == "B"] = &view;
  }
  fingerprint_ = torchtpu::fingerprint(views);
  if (found.empty()) {
    throw FormatError("LoRA adapter " + path.string() + " holds no lora_A / lora_B tensors");
  }
  for (const auto& [where, pair] : found) {
    const auto [layer, t] = where;
    const auto target = static_cast<LoraTarget>(t);
    const std::string module = "layers." + std::to_string(layer) + "." + kTargetNames[t];
    if (!pair[0] || !pair[1]) {
      throw FormatError("LoRA adapter " + path.string() + " has " + module + "'s lora_" +
                        (pair[0] ? "A" : "B") + " but not its lora_" + (pair[0] ? "B" : "A"));
    }
    const auto [out, in] = target_shape(config, layer, target);
    const TensorView& a = *pair[0];
    const TensorView& b = *pair[1];
    const int64_t rank = a.shape.empty() ? 0 : a.shape[0];
    if (a.shape != std::vector<int64_t>{rank, in} || rank <= 0 ||
        b.shape != std::vector<int64_t>{out, rank}) {
      throw FormatError("LoRA adapter " + path.string() + ": " + module + "'s lora_A is " +
                        shape_str(a.shape) + " and lora_B " + shape_str(b.shape) +
                        " but the model's config.json gives the linear [out, in] = " +
                        shape_str({out, in}) + ", so [r, " + std::to_string(in) + "] and [" +
                        std::to_string(out) + ", r]");
    }
    // Shared layers read their source's K/V: their own k/v projections, adapted or not, are
    // dead weights (Gemma4's forward never computes them).
    if (config.is_shared(layer) && (target == LoraTarget::kK || target == LoraTarget::kV)) {
      continue;
    }
    auto& w = layers_[layer][t];
    // Copies: the file's mapping ends with this constructor.
    w.a = host_tensor(a).to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
    // PEFT multiplies the product by the scaling; folded into B once, in float32.
    w.b = (host_tensor(b).to(at::kFloat) * config_.scaling(rank)).to(device, dtype);
  }
}

std::vector<std::string> LoraAdapter::targets() const {
  std::vector<std::string> out;
  for (int t = 0; t < kLoraTargets; ++t) {
    for (const auto& layer : layers_) {
      if (layer[t].a.defined()) {
        out.push_back(kTargetNames[t]);
        break;
      }
    }
  }
  return out;
}

int64_t LoraAdapter::nbytes() const {
  int64_t n = 0;
  for (const auto& layer : layers_) {
    for (const auto& w : layer) {
      if (w.a.defined()) n += w.a.nbytes() + w.b.nbytes();
    }
  }
  return n;
}

at::Tensor LoraPass::add(int64_t layer, LoraTarget t, const at::Tensor& x, at::Tensor y) const {
  for (const auto& [adapter, scales] : active) {
    const auto& w = adapter->at(layer, t);
    if (!w.a.defined()) continue;
    y = y + at::linear(at::linear(x, w.a) * scales, w.b);
  }
  return y;
}

}  // namespace torchtpu
