// config.json of a Gemma 4 text model, parsed into a plain struct and validated. Accepts the
// published multimodal layout (model_type "gemma4" with "text_config") and the flattened
// text-only one ("gemma4_text"). Anything unsupported is a FormatError naming field and value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchtpu {

enum class LayerType { kSliding, kFull };

// rope_parameters for one layer type. "default" rotates all of head_dim; "proportional" rotates
// the first partial_rotary_factor of the frequency pairs with exponents over the full head dim.
struct RopeParams {
  std::string rope_type = "default";  // "default" | "proportional"
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  double factor = 1.0;
};

// compressed-tensors quantization_config, as far as the loader needs it (group strategy, int4).
struct QuantGroup {
  std::vector<std::string> targets;  // exact names, "re:" regexes, or class names ("Linear")
  int64_t num_bits = 4;
  std::string type = "int";  // "int" | "float"
  bool symmetric = true;
  std::string strategy = "group";  // "group" | "channel"
  int64_t group_size = 32;         // -1 for channel
  std::string actorder;            // "" | "group" | ...
};
struct QuantizationConfig {
  std::string quant_method;  // "compressed-tensors"
  std::string format;        // "pack-quantized"
  std::vector<QuantGroup> groups;
  std::vector<std::string> ignore;
};

// vision_config of a multimodal checkpoint (Gemma4VisionConfig): the image encoder's shape.
// Patches of patch_size^2 pixels are embedded, encoded and pooled by pooling_kernel_size^2 into
// soft tokens.
struct VisionConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 16;
  int64_t num_attention_heads = 12;
  int64_t num_key_value_heads = 12;
  int64_t head_dim = 64;
  std::string hidden_activation = "gelu_pytorch_tanh";
  double rms_norm_eps = 1e-6;
  double rope_theta = 100.0;  // rope_parameters: "axial" (x on the first half, y on the second)
  int64_t pooling_kernel_size = 3;
  int64_t patch_size = 16;
  int64_t position_embedding_size = 10240;  // rows of each of the x and y position tables
  bool use_clipped_linears = false;         // linears clamp inputs and outputs to stored bounds
  bool standardize = false;                 // soft tokens get (x - std_bias) * std_scale
};

// audio_config: the Gemma 4 audio encoder (Gemma4AudioConfig; defaults are transformers').
struct AudioConfig {
  int64_t hidden_size = 1024;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 8;
  std::string hidden_act = "silu";  // "silu" | "gelu_pytorch_tanh"
  int64_t subsampling_conv_channels[2] = {128, 32};
  int64_t conv_kernel_size = 5;  // the light conv's causal depthwise kernel
  double residual_weight = 0.5;  // feed-forward output scale before the residual add
  int64_t attention_chunk_size = 12;
  int64_t attention_context_left = 13;  // includes the query's own position
  int64_t attention_context_right = 0;
  double attention_logit_cap = 50.0;
  double attention_invalid_logits_value = -1e9;
  bool use_clipped_linears = true;  // clamps around linears, bounds from the checkpoint
  double rms_norm_eps = 1e-6;
  double gradient_clipping = 1e10;
  int64_t output_proj_dims = 1536;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
};

// The top level of a Gemma 4 assistant's config.json (model_type "gemma4_assistant",
// Gemma4AssistantConfig): the multi-token-prediction drafter that reads a target model's K/V.
struct AssistantConfig {
  int64_t backbone_hidden_size = 1536;  // the target's hidden size
  // The head scores only the tokens of the centroid_intermediate_top_k of num_centroids token
  // clusters its centroids rank highest (masked_embedding), not the whole vocabulary.
  bool use_ordered_embeddings = false;
  int64_t num_centroids = 2048;
  int64_t centroid_intermediate_top_k = 32;
};

struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;         // sliding layers
  int64_t global_head_dim = 0;  // full layers
  int64_t intermediate_size = 0;
  bool use_double_wide_mlp = false;
  int64_t hidden_size_per_layer_input = 0;
  int64_t vocab_size_per_layer_input = 0;
  int64_t sliding_window = 0;
  double final_logit_softcapping = 0.0;  // 0: none
  double rms_norm_eps = 1e-6;
  std::vector<LayerType> layer_types;
  RopeParams rope_sliding;
  RopeParams rope_full;
  int64_t num_kv_shared_layers = 0;
  bool tie_word_embeddings = true;
  std::string hidden_activation = "gelu_pytorch_tanh";
  int64_t max_position_embeddings = 131072;
  int64_t bos_token_id = 2;  // -1 when config.json has null
  int64_t pad_token_id = 0;  // -1 when config.json has null
  // Union, in order and without duplicates, of text_config's, the top level's and (load_config)
  // generation_config.json's eos ids.
  std::vector<int64_t> eos_token_ids;
  std::optional<QuantizationConfig> quantization;
  std::optional<VisionConfig> vision;  // absent for text-only checkpoints
  // Multimodal token ids of the top level (transformers' defaults; -1 when config.json has null).
  int64_t image_token_id = 258880;  // one per image soft token in the prompt
  int64_t boi_token_id = 255999;    // begins an image
  int64_t eoi_token_id = 258882;    // ends an image
  // The audio encoder, when config.json has an audio_config; the ids that frame its soft tokens
  // in a prompt (-1 when null), transformers' defaults when absent.
  std::optional<AudioConfig> audio;
  int64_t audio_token_id = 258881;
  int64_t boa_token_id = 256000;
  int64_t eoa_token_index = 258883;
  // An assistant's: its text_config is the rest of this struct, every layer of which reads the
  // target's K/V (num_kv_shared_layers = num_hidden_layers, no per-layer inputs).
  std::optional<AssistantConfig> assistant;
  // Where config.json holds the text fields ("text_config." or ""), and the fields that size
  // tensors which it leaves out, read as transformers' defaults ("text_config.hidden_size"): a
  // shape check names a size's field as a user finds it, or says it is not there.
  std::string text_fields;
  std::vector<std::string> defaulted_fields;

  // Derived, from the research note §1 / §2.5.
  int64_t first_shared_layer() const { return num_hidden_layers - num_kv_shared_layers; }
  bool is_shared(int64_t layer) const { return layer >= first_shared_layer(); }
  // For a shared layer: the last non-shared layer of the same type. For others: the layer itself.
  int64_t kv_source(int64_t layer) const;
  int64_t layer_head_dim(int64_t layer) const;
  int64_t mlp_width(int64_t layer) const;
  const RopeParams& rope(int64_t layer) const;
};

// Parses and validates (model_type "gemma4", "gemma4_text" or "gemma4_assistant"). `path` is used
// in every message.
ModelConfig parse_config_json(const std::string& json_text, const std::string& path);
// NotFoundError unless `dir` is a directory, FormatError unless it holds config.json: what every
// reader of a checkpoint checks first.
void check_checkpoint_dir(const std::string& dir);
// DIR/config.json plus the eos ids of DIR/generation_config.json when that file exists.
ModelConfig load_config(const std::string& dir);

// A LoRA adapter's adapter_config.json as PEFT writes it (peft_type "LORA"): what scales its
// terms. Fields that change the arithmetic in ways the engine does not follow (DoRA, biases,
// per-module alphas, modules trained whole) are FormatErrors naming the field.
struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  bool use_rslora = false;  // scaling lora_alpha / sqrt(r) instead of lora_alpha / r
  // A non-empty rank_pattern gives modules other ranks than r: a module's rank is then its
  // tensors' own; without one every module's must be r, as PEFT's load requires.
  bool rank_pattern = false;
  std::string base_model;   // base_model_name_or_path, "" when absent (reports only)

  // PEFT's scaling for a module of rank r (rank_pattern's ranks are the tensors' own).
  double scaling(int64_t rank) const;
};

LoraConfig parse_lora_config_json(const std::string& json_text, const std::string& path);
// DIR/adapter_config.json; FormatError when DIR has none.
LoraConfig load_lora_config(const std::string& dir);

}  // namespace torchtpu
