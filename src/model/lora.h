// LoRA adapters in PEFT's format (adapter_config.json beside adapter_model.safetensors) over the
// text layers' linears. They stay apart from the base weights, which may be int4 (an adapter
// trained on a 4-bit base, QLoRA's way, is served on one): a linear's output y gains
// s · (x·Aᵀ)·Bᵀ, where B already holds PEFT's scaling and s is the row's scale for the adapter
// (llama-server's per-request lora scales), so the rows of one pass may use different adapters,
// or none.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "io/config.h"

namespace torchtpu {

// The linears of a text layer an adapter may adapt, in LayerWeights' order.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown, kPerLayerGate, kPerLayerProjection };
constexpr int kLoraTargets = 9;
// The module's name within a layer: "self_attn.q_proj", ..., "per_layer_projection".
const char* lora_target_name(LoraTarget t);

// One adapted linear: a [r, in] and b [out, r] times the scaling, in the compute dtype on the
// device; undefined when the adapter leaves the linear alone.
struct LoraWeights {
  at::Tensor a, b;
};

class LoraAdapter {
 public:
  // FormatError naming the file and the tensor or field for anything it cannot apply as PEFT
  // would: a module other than the text layers' linears, a missing half, a shape the base
  // model's config does not give.
  LoraAdapter(const std::string& dir, const ModelConfig& config, at::Device device,
              at::ScalarType dtype);

  const std::string& dir() const { return dir_; }
  const LoraConfig& config() const { return config_; }
  const LoraWeights& at(int64_t layer, LoraTarget t) const {
    return layers_[layer][static_cast<int>(t)];
  }
  // The modules adapted in some layer, in LoraTarget order ("self_attn.q_proj", ...).
  std::vector<std::string> targets() const;
  int64_t nbytes() const;
  // The adapter file's identity (Checkpoint::fingerprint's digest): a prefix cache keys the
  // states a scaled adapter wrote by it.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::string dir_;
  LoraConfig config_;
  std::vector<std::array<LoraWeights, kLoraTargets>> layers_;
  uint64_t fingerprint_ = 0;
};

// The adapters of one forward pass: those some row scales by other than 0, each beside its rows'
// scales [batch, 1, 1] in the compute dtype on the device.
struct LoraPass {
  std::vector<std::pair<const LoraAdapter*, at::Tensor>> active;

  // y (layer l's linear t of input x) plus every active adapter's term.
  at::Tensor add(int64_t layer, LoraTarget t, const at::Tensor& x, at::Tensor y) const;
};

}  // namespace torchtpu
