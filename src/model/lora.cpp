#include "model/lora.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>

#include "common/errors.h"
#include "common/shape.h"
#include "io/aten_view.h"
#include "io/implied_shapes.h"
#include "io/safetensors.h"
#include "ops/dense_linear.h"

namespace torchtpu {
namespace {

namespace fs = std::filesystem;

constexpr std::array<const char*, kLoraTargets> kTargetNames = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
    "mlp.down_proj",    "per_layer_input_gate", "per_layer_projection"};

// Each group's linears and their index among its outputs.
const std::array<std::vector<std::pair<LoraTarget, int64_t>>, kLoraGroups> kGroups = {{
    {{LoraTarget::kQ, 0}, {LoraTarget::kK, 1}, {LoraTarget::kV, 2}},
    {{LoraTarget::kO, 0}},
    {{LoraTarget::kGate, 0}, {LoraTarget::kUp, 1}},
    {{LoraTarget::kDown, 0}},
    {{LoraTarget::kPerLayerGate, 0}},
    {{LoraTarget::kPerLayerProjection, 0}},
}};

}  // namespace

// float32 on the CPU: its bf16 products of these thin shapes run several times slower than f32's
// where it lacks AMX (on Zen 3, a rank-16 B of 2,048 rows times one row: 47 µs in bf16, 13 in
// f32), and an adapter is small beside the weights.
at::ScalarType lora_dtype(at::Device device, at::ScalarType dtype) {
  return device.is_cpu() ? at::kFloat : dtype;
}

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
  // Each adapted linear's A and scaled B in f32, by layer and target, before they are grouped.
  std::vector<std::array<std::pair<at::Tensor, at::Tensor>, kLoraTargets>> pairs(
      config.num_hidden_layers);
  const auto implied = implied_tensors(config, "");  // each linear's [out, in]
  for (const auto& [where, pair] : found) {
    const auto [layer, t] = where;
    const auto target = static_cast<LoraTarget>(t);
    const std::string module = "layers." + std::to_string(layer) + "." + kTargetNames[t];
    if (!pair[0] || !pair[1]) {
      throw FormatError("LoRA adapter " + path.string() + " has " + module + "'s lora_" +
                        (pair[0] ? "A" : "B") + " but not its lora_" + (pair[0] ? "B" : "A"));
    }
    const auto linear = implied.find(module + ".weight");
    if (linear == implied.end()) {
      throw FormatError("LoRA adapter " + path.string() + " adapts " + module +
                        ", which the model does not have: its config.json gives no per-layer "
                        "inputs (hidden_size_per_layer_input 0)");
    }
    const std::vector<int64_t> shape = linear->second.shape();
    const int64_t out = shape[0], in = shape[1];
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
    if (!config_.rank_pattern && rank != config_.r) {
      throw FormatError("LoRA adapter " + path.string() + ": " + module + "'s lora_A is " +
                        shape_str(a.shape) + ", rank " + std::to_string(rank) +
                        ", but its adapter_config.json gives r " + std::to_string(config_.r) +
                        " and no rank_pattern");
    }
    // Integer tensors' bits would pass for weights, and their values as f32 are not the terms.
    expect_floating(a);
    expect_floating(b);
    // Shared layers read their source's K/V: their own k/v projections, adapted or not, are
    // dead weights (Gemma4's forward never computes them).
    if (config.is_shared(layer) && (target == LoraTarget::kK || target == LoraTarget::kV)) {
      continue;
    }
    adapted_[t] = true;
    // Copies (to() into f32 copies whatever the file holds): the mapping ends with this
    // constructor. PEFT multiplies the product by the scaling; folded into B once.
    pairs[layer][t] = {host_tensor(a).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true),
                       host_tensor(b).to(at::kFloat) * config_.scaling(rank)};
    for (const auto& [part, values] :
         {std::pair{"A", &pairs[layer][t].first}, std::pair{"B", &pairs[layer][t].second}}) {
      if (!at::isfinite(*values).all().item<bool>()) {
        throw FormatError("LoRA adapter " + path.string() + ": " + module + "'s lora_" + part +
                          " holds a value that is not finite");
      }
    }
  }
  const auto stored = lora_dtype(device, dtype);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    for (int g = 0; g < kLoraGroups; ++g) {
      for (const auto& [target, index] : kGroups[g]) {
        const auto& [a, b] = pairs[l][static_cast<int>(target)];
        if (!a.defined()) continue;
        layers_[l][g].parts.push_back({index, a.to(device, stored), b.to(device, stored)});
      }
    }
  }
}

std::vector<std::string> LoraAdapter::targets() const {
  std::vector<std::string> out;
  for (int t = 0; t < kLoraTargets; ++t) {
    if (adapted_[t]) out.push_back(kTargetNames[t]);
  }
  return out;
}

int64_t LoraAdapter::nbytes() const {
  int64_t n = 0;
  for (const auto& layer : layers_) {
    for (const auto& group : layer) {
      for (const auto& part : group.parts) n += part.a.nbytes() + part.b.nbytes();
    }
  }
  return n;
}

LoraRows lora_rows(const std::vector<const LoraScales*>& rows) {
  LoraRows out;
  for (const auto* row : rows) {
    if (!row) continue;
    for (const auto& [adapter, scale] : *row) {
      if (std::find(out.adapters.begin(), out.adapters.end(), adapter) == out.adapters.end()) {
        out.adapters.push_back(adapter);
      }
    }
  }
  if (out.empty()) return out;
  const auto columns = static_cast<int64_t>(out.adapters.size());
  out.scales = at::zeros({static_cast<int64_t>(rows.size()), columns}, at::kFloat);
  auto* p = out.scales.data_ptr<float>();
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r]) continue;
    for (const auto& [adapter, scale] : *rows[r]) {
      const auto a = std::find(out.adapters.begin(), out.adapters.end(), adapter);
      p[static_cast<int64_t>(r) * columns + (a - out.adapters.begin())] =
          static_cast<float>(scale);
    }
  }
  return out;
}

std::string lora_salt(const LoraScales& scales) {
  // By file digest, so that the order the adapters were named in does not matter.
  std::vector<std::pair<uint64_t, double>> applied;
  for (const auto& [adapter, scale] : scales) applied.emplace_back(adapter->fingerprint(), scale);
  std::sort(applied.begin(), applied.end());
  std::string salt;
  for (const auto& [fingerprint, scale] : applied) {
    char part[64];
    std::snprintf(part, sizeof part, "lora %016llx*%.17g;",
                  static_cast<unsigned long long>(fingerprint), scale);
    salt += part;
  }
  return salt;
}

LoraPass::LoraPass(const LoraRows& rows, at::Device device, at::ScalarType dtype) {
  if (rows.empty()) return;
  const auto& lora = rows.scales;
  TORCH_CHECK(lora.dim() == 2 && lora.size(1) == static_cast<int64_t>(rows.adapters.size()) &&
                  lora.is_cpu() && lora.scalar_type() == at::kFloat,
              "LoraRows' scales must be float [rows, ", rows.adapters.size(),
              "] on the host, got ", lora.sizes());
  for (size_t a = 0; a < rows.adapters.size(); ++a) {
    const auto scales = lora.select(1, static_cast<int64_t>(a)).contiguous();
    const float* s = scales.data_ptr<float>();
    const int64_t n = scales.numel();
    if (std::all_of(s, s + n, [](float v) { return v == 0; })) continue;
    const LoraAdapter* adapter = rows.adapters[a].get();
    if (std::all_of(s, s + n, [&](float v) { return v == s[0]; })) {
      active.push_back({adapter, at::Tensor(), static_cast<double>(s[0])});
      continue;
    }
    active.push_back(
        {adapter, scales.to(device, lora_dtype(device, dtype)).view({-1, 1, 1}), std::nullopt});
  }
}

void LoraPass::add(int64_t layer, LoraGroup g, const at::Tensor& x,
                   std::vector<at::Tensor>& outs) const {
  at::Tensor input;  // x in the adapters' dtype, cast once for all of them
  for (const auto& [adapter, scales, uniform] : active) {
    const auto& parts = adapter->group(layer, g).parts;
    if (parts.empty()) continue;
    if (!input.defined()) input = x.to(parts[0].a.scalar_type());
    for (const auto& part : parts) {
      // torchtpu::dense_linear: at float32 on the CPU a row's sums do not depend on the rows
      // beside it, so a batch's rows keep the tokens they get alone.
      auto t = ops::dense_linear(input, part.a);
      if (!uniform) t = t * scales;
      outs[part.index].add_(ops::dense_linear(t, part.b), uniform.value_or(1.0));
    }
  }
}

at::Tensor LoraPass::add(int64_t layer, LoraGroup g, const at::Tensor& x, at::Tensor y) const {
  std::vector<at::Tensor> outs{std::move(y)};
  add(layer, g, x, outs);
  return std::move(outs[0]);
}

}  // namespace torchtpu
