// Test tool: `config_dump DIR` prints load_config(DIR) as JSON, with the derived per-layer values
// (head dim, MLP width, K/V source), for the cross-check against transformers. Errors go to
// stderr with exit status 1.
#include <exception>
#include <iostream>
#include <nlohmann/json.hpp>

#include "io/config.h"

int main(int argc, char** argv) {
  using namespace torchtpu;
  if (argc != 2) {
    std::cerr << "usage: config_dump DIR\n";
    return 2;
  }
  try {
    const ModelConfig c = load_config(argv[1]);
    auto rope = [](const RopeParams& r) {
      return nlohmann::json{{"rope_type", r.rope_type},
                            {"rope_theta", r.theta},
                            {"partial_rotary_factor", r.partial_rotary_factor},
                            {"factor", r.factor}};
    };
    nlohmann::json layers = nlohmann::json::array();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      layers.push_back(
          {{"type", c.layer_types[l] == LayerType::kFull ? "full_attention" : "sliding_attention"},
           {"head_dim", c.layer_head_dim(l)},
           {"mlp_width", c.mlp_width(l)},
           {"kv_source", c.assistant ? -1 : c.kv_source(l)},  // an assistant reads its target's
           {"shared", c.is_shared(l)}});
    }
    nlohmann::json out = {
        {"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_attention_heads", c.num_attention_heads},
        {"num_key_value_heads", c.num_key_value_heads},
        {"head_dim", c.head_dim},
        {"global_head_dim", c.global_head_dim},
        {"intermediate_size", c.intermediate_size},
        {"use_double_wide_mlp", c.use_double_wide_mlp},
        {"hidden_size_per_layer_input", c.hidden_size_per_layer_input},
        {"vocab_size_per_layer_input", c.vocab_size_per_layer_input},
        {"sliding_window", c.sliding_window},
        {"final_logit_softcapping", c.final_logit_softcapping},
        {"rms_norm_eps", c.rms_norm_eps},
        {"num_kv_shared_layers", c.num_kv_shared_layers},
        {"tie_word_embeddings", c.tie_word_embeddings},
        {"hidden_activation", c.hidden_activation},
        {"max_position_embeddings", c.max_position_embeddings},
        {"bos_token_id", c.bos_token_id},
        {"pad_token_id", c.pad_token_id},
        {"eos_token_ids", c.eos_token_ids},
        {"rope_sliding", rope(c.rope_sliding)},
        {"rope_full", rope(c.rope_full)},
        {"layers", layers},
    };
    out["image_token_id"] = c.image_token_id;
    out["boi_token_id"] = c.boi_token_id;
    out["eoi_token_id"] = c.eoi_token_id;
    if (c.vision) {
      const VisionConfig& v = *c.vision;
      out["vision"] = {{"hidden_size", v.hidden_size},
                       {"intermediate_size", v.intermediate_size},
                       {"num_hidden_layers", v.num_hidden_layers},
                       {"num_attention_heads", v.num_attention_heads},
                       {"num_key_value_heads", v.num_key_value_heads},
                       {"head_dim", v.head_dim},
                       {"hidden_activation", v.hidden_activation},
                       {"rms_norm_eps", v.rms_norm_eps},
                       {"rope_theta", v.rope_theta},
                       {"pooling_kernel_size", v.pooling_kernel_size},
                       {"patch_size", v.patch_size},
                       {"position_embedding_size", v.position_embedding_size},
                       {"use_clipped_linears", v.use_clipped_linears},
                       {"standardize", v.standardize}};
    }
    out["audio_token_id"] = c.audio_token_id;
    out["boa_token_id"] = c.boa_token_id;
    out["eoa_token_index"] = c.eoa_token_index;
    out["audio_config"] = nullptr;
    if (const auto& a = c.audio) {
      out["audio_config"] = {
          {"hidden_size", a->hidden_size},
          {"num_hidden_layers", a->num_hidden_layers},
          {"num_attention_heads", a->num_attention_heads},
          {"hidden_act", a->hidden_act},
          {"subsampling_conv_channels",
           {a->subsampling_conv_channels[0], a->subsampling_conv_channels[1]}},
          {"conv_kernel_size", a->conv_kernel_size},
          {"residual_weight", a->residual_weight},
          {"attention_chunk_size", a->attention_chunk_size},
          {"attention_context_left", a->attention_context_left},
          {"attention_context_right", a->attention_context_right},
          {"attention_logit_cap", a->attention_logit_cap},
          {"attention_invalid_logits_value", a->attention_invalid_logits_value},
          {"use_clipped_linears", a->use_clipped_linears},
          {"rms_norm_eps", a->rms_norm_eps},
          {"gradient_clipping", a->gradient_clipping},
          {"output_proj_dims", a->output_proj_dims},
      };
    }
    out["assistant"] = nullptr;
    if (const auto& a = c.assistant) {
      out["assistant"] = {{"backbone_hidden_size", a->backbone_hidden_size},
                          {"use_ordered_embeddings", a->use_ordered_embeddings},
                          {"num_centroids", a->num_centroids},
                          {"centroid_intermediate_top_k", a->centroid_intermediate_top_k}};
    }
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
