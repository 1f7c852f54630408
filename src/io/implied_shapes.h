// The tensors config.json implies for a Gemma 4 checkpoint's text model (and an assistant's own):
// one table that the loader reads each tensor's shape from and `quantize` holds a whole
// checkpoint against, so the rule "this config implies these shapes" is written once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace torchtpu {

struct ImpliedDim {
  int64_t size = 0;
  // The fields it comes from, as config.json spells them: "text_config.num_attention_heads *
  // text_config.head_dim = 2 * 32 = 64"; "" for a constant.
  std::string source;
};

struct ImpliedTensor {
  std::vector<ImpliedDim> dims;
  bool required = true;  // false: may be absent (a tied lm_head, a KV-shared layer's dead K/V)

  std::vector<int64_t> shape() const;
  // "[64, 72] (text_config.hidden_size = 72)": the shape, and the sources of the dimensions
  // `actual` contradicts (all of them when the ranks differ).
  std::string against(const std::vector<int64_t>& actual) const;
};

// Every tensor config.json implies, keyed by its name in a checkpoint whose text tensors are under
// `prefix` ("model.language_model." or "model."; "lm_head.weight" and an assistant's own tensors
// have none). Dense names (".weight"); a pack-quantized weight's [out, in] is the same.
std::map<std::string, ImpliedTensor> implied_tensors(const ModelConfig& config,
                                                     const std::string& prefix);

// FormatError naming the tensor, its file, its shape and the config fields it contradicts,
// unless `view` has the implied shape.
void expect_implied_shape(const TensorView& view, const ImpliedTensor& implied);

// The whole of `ckpt` against `config`, as FormatErrors: every required tensor present, every
// implied one shaped as implied, and no tensor under the text prefix that the config does not
// imply (more layers than num_hidden_layers, per-layer inputs the config has none of). Tensors
// outside the text prefix (the vision and audio towers) are the towers' own to check.
void check_implied_tensors(const Checkpoint& ckpt, const ModelConfig& config);

}  // namespace torchtpu
