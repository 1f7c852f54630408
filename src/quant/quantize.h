// Writing pack-quantized int4 weights the way compressed-tensors does, so that checkpoints made by
// `torchtpu-cpp quantize` and by the library (llm-compressor's min-max observer, then
// PackedQuantizationCompressor) agree bit for bit on the same dense weights.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "quant/pack_quantized.h"

namespace torchtpu {

struct QuantizeSpec {
  int64_t group_size = 32;  // input columns per scale; -1: one scale per output row (channel)
  bool symmetric = true;
  // Dtype the scales are rounded to and stored in; nullopt: the weight's dtype, as
  // compressed-tensors stores them. When set, qparams are computed in f32 and the scales rounded
  // to it (compressed-tensors' QuantizationArgs.scale_dtype).
  std::optional<at::ScalarType> scale_dtype;
};

// Quantizes a 2-D bf16/f16/f32 weight [out, in] with min-max qparams per group
// (calculate_qparams of compressed-tensors 0.20.1: symmetric scale = max(|min|, |max|) / 7.5,
// asymmetric scale = (max - min) / 15 with zp = round(clamp(-8 - min / scale, -8, 7)), ranges
// widened to include 0, zero scales replaced by the dtype's eps), then q = round(clamp(w / scale +
// zp, -8, 7)), all in the weight's dtype. ValueError when `in` is not a multiple of the group size
// (compressed-tensors refuses that too). Result tensors are on the host.
PackedInt4 quantize_weight(const at::Tensor& weight, const QuantizeSpec& spec,
                           const std::string& module);

// A vocabulary table [rows, cols] (host, float) as the emb4 twin holds it: symmetric group-32
// int4 with F16 scales, quantized in row blocks (quantization is row-wise, so blocks give the
// bits of the whole table) to bound the temporaries. ValueError unless cols % 32 == 0.
PackedInt4 quantize_table(const at::Tensor& table, const std::string& module);

struct QuantizeCheckpointOptions {
  int64_t group_size = 32;  // -1: channel strategy
  bool symmetric = true;
  std::string emb4_dir;  // also write the emb4 twin there; "" for none
};

struct QuantizeSummary {
  int64_t quantized = 0;    // linears written pack-quantized
  int64_t dense = 0;        // tensors copied unchanged to the main output
  int64_t emb4_tables = 0;  // int4 vocabulary tables in the emb4 twin
  int64_t out_bytes = 0;    // tensor bytes of the main output
  int64_t emb4_bytes = 0;   // tensor bytes of the emb4 twin
};

// Reads the dense checkpoint `in_dir` and writes `out_dir` (which must not exist or be empty):
//  - pack-quantized: every 2-D `.weight` of the text model (tensors under the checkpoint's text
//    prefix) except the vocabulary tables: q/k/v/o_proj, gate/up/down_proj, per_layer_input_gate,
//    per_layer_projection and per_layer_model_projection in Gemma 4. I32 packing, I64
//    weight_shape, scales in the weight dtype, zero points with `symmetric` false;
//  - unchanged: norms, layer_scalar, embed_tokens, embed_tokens_per_layer, an untied lm_head and
//    any tensor outside the text model (vision/audio towers, added to `ignore`);
//  - config.json with compressed-tensors' quantization_config (group_0 targets "Linear", ignore
//    "lm_head" and the non-text towers, quantization_status "compressed");
//  - tokenizer files, chat_template.jinja and generation_config.json copied when present.
// With emb4_dir, also writes the emb4 twin, a complete checkpoint like the xbill9 "-text-emb4"
// repacks: the same int4 linears, plus embed_tokens, embed_tokens_per_layer and an untied lm_head
// (embed_tokens' table when tied) as symmetric group-32 int4 tables with F16 scales, whose
// config.json adds one config group per table, unties the embeddings and drops "lm_head" from
// `ignore`. Shards hold one decoder layer each (model-layer-NNN) or up to 2 GiB of the rest
// (model-rest-NNN), named by model.safetensors.index.json; one shard is in memory at a time and
// vocabulary tables are quantized in row blocks.
QuantizeSummary quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                    const QuantizeCheckpointOptions& options);

}  // namespace torchtpu
