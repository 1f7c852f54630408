// LoRA adapters in PEFT's format (adapter_config.json beside adapter_model.safetensors) over the
// text layers' linears. They stay apart from the base weights, which may be int4 (an adapter
// trained on a 4-bit base, QLoRA's way, is served on one): a linear's output y gains
// s · (x·Aᵀ)·Bᵀ, where B already holds PEFT's scaling and s is the row's scale for the adapter
// (llama-server's per-request lora scales), so the rows of one pass may use different adapters,
// or none.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "io/config.h"

namespace torchtpu {

// The linears of a text layer an adapter may adapt.
enum class LoraTarget { kQ, kK, kV, kO, kGate, kUp, kDown, kPerLayerGate, kPerLayerProjection };
constexpr int kLoraTargets = 9;

// Linears that read one input, adapted together (the input is cast to the adapters' dtype once).
enum class LoraGroup { kQkv, kO, kGateUp, kDown, kPerLayerGate, kPerLayerProjection };
constexpr int kLoraGroups = 6;

// One group's adapted linears in one layer: each one's index among the group's outputs (q, k, v;
// gate, up), its A [r, in] and its B [out, r] times the scaling. Empty: the adapter leaves the
// group alone.
struct LoraGroupWeights {
  struct Part {
    int64_t index;
    at::Tensor a, b;
  };
  std::vector<Part> parts;
};

// The dtype adapters are kept and applied in for a model of `dtype` on `device`.
at::ScalarType lora_dtype(at::Device device, at::ScalarType dtype);

class LoraAdapter {
 public:
  // FormatError naming the file and the tensor or field for anything it cannot apply as PEFT
  // would: a module other than the text layers' linears, a missing half, a shape the base
  // model's config does not give. Kept in lora_dtype.
  LoraAdapter(const std::string& dir, const ModelConfig& config, at::Device device,
              at::ScalarType dtype);

  const std::string& dir() const { return dir_; }
  const LoraConfig& config() const { return config_; }
  const LoraGroupWeights& group(int64_t layer, LoraGroup g) const {
    return layers_[layer][static_cast<int>(g)];
  }
  // The modules adapted in some layer, in LoraTarget order ("self_attn.q_proj", ...).
  std::vector<std::string> targets() const;
  int64_t nbytes() const;
  // The adapter file's identity (the safetensors fingerprint digest): a prefix cache keys the
  // states a scaled adapter wrote by it.
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  std::string dir_;
  LoraConfig config_;
  std::vector<std::array<LoraGroupWeights, kLoraGroups>> layers_;
  std::array<bool, kLoraTargets> adapted_{};
  uint64_t fingerprint_ = 0;
};

// A sequence's adapters, resolved when it starts: each one it applies, with its scale (none at 0).
// It holds them: an adapter unloaded meanwhile (Engine::unload_lora) stays until its last
// sequence ends.
struct LoraScale {
  std::shared_ptr<const LoraAdapter> adapter;
  double scale = 0;
};
using LoraScales = std::vector<LoraScale>;

// A forward pass's adapters: each row's scale [rows, adapters.size()] (float on the host) for
// each adapter some row applies. None: the base model for every row.
struct LoraRows {
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  at::Tensor scales;
  bool empty() const { return adapters.empty(); }
};
// The rows of these sequences, in order (nullptr: a row that applies none).
LoraRows lora_rows(const std::vector<const LoraScales*>& rows);
// What a prefix cache's salt gains for a sequence's adapters: "" for none, else their file
// digests and scales, so that states one adapter wrote are reused only under the same adapters
// and scales.
std::string lora_salt(const LoraScales& scales);

// The adapters of one forward pass: those some row scales by other than 0, each with its rows'
// scales [batch, 1, 1] in the adapter's dtype on the device, or, when every row has the same
// scale, that scale alone (`uniform`: no per-row multiply).
struct LoraPass {
  struct Active {
    const LoraAdapter* adapter;
    at::Tensor scales;
    std::optional<double> uniform;
  };
  std::vector<Active> active;

  LoraPass() = default;
  // For a model of `dtype` on `device`; `rows` outlives the pass.
  LoraPass(const LoraRows& rows, at::Device device, at::ScalarType dtype);

  // Adds every active adapter's terms for layer l's group g, of input x, to the group's outputs
  // (in place: they are the linears' own fresh outputs, or disjoint views of one).
  void add(int64_t layer, LoraGroup g, const at::Tensor& x, std::vector<at::Tensor>& outs) const;
  // The same for a group of one linear; returns y.
  at::Tensor add(int64_t layer, LoraGroup g, const at::Tensor& x, at::Tensor y) const;
};

}  // namespace torchtpu
