// Gemma 4's audio encoder over ATen (transformers' Gemma4AudioModel, a Universal Speech Model
// conformer) and the embedder that projects its soft tokens into the text model
// (Gemma4MultimodalEmbedder, model.embed_audio). Weights come from the checkpoint's
// model.audio_tower.* and model.embed_audio.* tensors; every operation is an at:: call on the
// device ModelOptions names, in its compute dtype.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/gemma4.h"

namespace torchtpu {

struct AudioFeedForward {
  at::Tensor pre_layer_norm, post_layer_norm;  // f32, via the compute dtype
  ClippedLinear ffw_layer_1, ffw_layer_2;
};

struct AudioLayerWeights {
  AudioFeedForward feed_forward1, feed_forward2;
  // self_attn
  ClippedLinear q_proj, k_proj, v_proj, post;
  at::Tensor relative_k_proj;  // [hidden, hidden]
  at::Tensor per_dim_scale;    // [head_dim]
  // lconv1d
  at::Tensor lconv_pre_layer_norm, conv_norm;
  ClippedLinear linear_start, linear_end;
  at::Tensor depthwise_conv1d;  // [hidden, 1, conv_kernel_size]
  at::Tensor norm_pre_attn, norm_post_attn, norm_out;
};

class AudioTower {
 public:
  // FormatError when config.json has no audio_config or a tensor is missing or misshapen.
  // Weights that need no conversion alias `ckpt`'s mappings: it must outlive the tower.
  AudioTower(const Checkpoint& ckpt, const ModelConfig& config, const ModelOptions& options);
  // Opens `model_dir` itself (config.json and the weights) and keeps it open.
  AudioTower(const std::string& model_dir, const ModelOptions& options);

  const AudioConfig& config() const { return audio_; }

  // One clip's log-mel features [T, n_mels] (float) and its valid-frame mask [T] (bool, a valid
  // prefix then padding) -> the soft tokens at the valid positions after subsampling,
  // [soft_tokens, text hidden_size] in the compute dtype on the model's device, ready to be placed
  // at the audio soft-token positions of a prompt. ValueError for shapes the checkpoint cannot
  // take.
  at::Tensor embed(const at::Tensor& features, const at::Tensor& mask) const;

  // The encoder's soft tokens for every subsampled position [T / 4, output_proj_dims] and their
  // mask [T / 4] (Gemma4AudioModel's last_hidden_state and attention_mask), before embed_audio.
  std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& features,
                                           const at::Tensor& mask) const;

 private:
  void load(const Checkpoint& ckpt, const ModelConfig& config);
  at::Tensor attention(const AudioLayerWeights& w, const at::Tensor& x,
                       const at::Tensor& invalid) const;
  at::Tensor feed_forward(const AudioFeedForward& w, const at::Tensor& x) const;
  at::Tensor light_conv(const AudioLayerWeights& w, const at::Tensor& x) const;
  at::Tensor activation(const at::Tensor& x) const;

  std::shared_ptr<Checkpoint> owned_;  // when constructed from a directory
  AudioConfig audio_;
  int64_t text_hidden_size_ = 0;
  ModelOptions options_;
  at::Tensor conv0_, norm0_, conv1_, norm1_, input_proj_;  // subsample_conv_projection
  std::vector<AudioLayerWeights> layers_;
  at::Tensor output_proj_weight_, output_proj_bias_;
  at::Tensor embedding_projection_;  // embed_audio, [text hidden, output_proj_dims]
  at::Tensor relative_positions_;    // [context_size / 2 + 1, hidden], compute dtype
};

}  // namespace torchtpu
