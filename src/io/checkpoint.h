// A checkpoint directory in Hugging Face layout: config.json plus model.safetensors, or shards
// named by model.safetensors.index.json (weight_map; shard names are arbitrary). Tokenizer files
// are optional: a checkpoint without them still serves work in token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace torchtpu {

class Checkpoint {
 public:
  // Opens every shard and checks the index against the shard headers (a tensor the index names
  // must be in that shard; a tensor in two shards is an error).
  explicit Checkpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }

  // Full name as stored ("model.language_model.layers.0.self_attn.q_proj.weight").
  const TensorView* find(const std::string& name) const;
  const TensorView& get(const std::string& name) const;  // FormatError naming the tensor and dir
  std::vector<std::string> names() const;

  // The text-model prefix used in this checkpoint: "model.language_model." or "model.".
  const std::string& prefix() const { return prefix_; }

  // Optional files beside the weights, empty when absent.
  std::string file_if_exists(const std::string& name) const;

  // The weights' identity, for files derived from them (prefix state files): a digest of every
  // tensor's name, dtype, shape and first and last 64 bytes. Checkpoints that differ in a
  // tensor's layout, or in weights that training or fine-tuning changes throughout, differ
  // here; computing it touches a page or two per tensor.
  uint64_t fingerprint() const;

 private:
  std::string dir_;
  std::string prefix_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace torchtpu
