// Synthetic Gemma 4 checkpoints in the exact Hugging Face layout, from tiny test configs up to the
// full E2B shapes with random weights (for speed work). Weights are scaled so that logits are
// spread (the soft-cap not saturated) and greedy decoding wanders instead of repeating one token.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"

namespace torchtpu {

struct TinySpec {
  uint64_t seed = 0;
  std::string dtype = "f32";                     // "f32" | "bf16" | "f16"
  std::string prefix = "model.language_model.";  // or "model."
  bool dead_shared_kv = false;  // also write the unused k/v/k_norm of shared layers
  bool untied = false;          // write an lm_head of its own
  int64_t shards = 1;           // > 1: split across files named by model.safetensors.index.json
  std::string tokenizer_dir;    // copy tokenizer.json, tokenizer_config.json, chat_template.jinja

  int64_t vocab = 512;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 1;
  int64_t head_dim = 16;
  int64_t global_head_dim = 32;
  int64_t intermediate = 128;
  bool double_wide = true;
  int64_t ple = 16;
  int64_t window = 8;
  int64_t shared = 3;
  std::vector<LayerType> layer_types;  // default: the tiny or E2B pattern
  double softcap = 30.0;
};

// The two presets: "tiny" (7 layers, S S S F | S S F shared, vocab 512) and "e2b" (35 layers,
// 1536 hidden, 262,144 vocab, exactly the E2B config).
TinySpec tiny_preset(const std::string& name);

// Writes config.json, generation_config.json, the safetensors file(s) and, if given, tokenizer
// files into `out`, which must be missing or an empty directory (ValueError otherwise). Nothing is
// left at `out` when the spec is refused or a write fails.
void make_tiny(const std::string& out, const TinySpec& spec);

}  // namespace torchtpu
