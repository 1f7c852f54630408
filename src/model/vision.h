// Gemma 4's image encoder over ATen (transformers' Gemma4VisionModel and the embed_vision
// Gemma4MultimodalEmbedder): patches of one image in, soft tokens in the text model's hidden size
// out, ready to replace the image_token_id positions of a prompt. Weights are read from the
// checkpoint's model.vision_tower.* and model.embed_vision.* tensors, dense or int4
// pack-quantized (expanded to the compute dtype at load).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"
#include "model/gemma4.h"

namespace torchtpu {

class VisionTower {
 public:
  // ValueError when config has no vision_config (a text-only checkpoint); FormatError for missing
  // or misshapen tensors. Weights go to options.device in options.dtype (the compute dtype); on
  // the CPU in the checkpoint's dtype they alias its mapping, which the tower keeps open.
  VisionTower(std::shared_ptr<const Checkpoint> ckpt, const ModelConfig& config,
              const ModelOptions& options);
  // Opens model_dir's config.json and weights.
  VisionTower(const std::string& model_dir, const ModelOptions& options);

  // pixels: [P, 3 * patch_size^2] floating point in [0, 1] (the image processor's pixel_values of
  // one image); positions: [P, 2] integer (x, y) patch coordinates, rows of (-1, -1) being padding
  // that is dropped. The real patches must tile a grid whose sides are multiples of
  // pooling_kernel_size. Returns [soft_tokens, text hidden_size] in the compute dtype on the
  // model's device, soft_tokens = real patches / pooling_kernel_size^2.
  at::Tensor embed(const at::Tensor& pixels, const at::Tensor& positions) const;
  // The checks embed makes of its inputs, without running the tower, so that a caller can refuse
  // an image before queueing it: c10::ValueError naming what is wrong (shape, dtype, positions
  // beyond the position tables, patches that do not tile the pooling grid).
  // Needs only the configuration, so it answers while the weights are not loaded.
  static void check(const VisionConfig& config, const at::Tensor& pixels,
                    const at::Tensor& positions);

  const VisionConfig& config() const { return config_; }
  int64_t text_hidden_size() const { return text_hidden_size_; }

 private:
  // The real patches of an image (padding rows dropped) and the pooling bin of each.
  struct Grid {
    at::Tensor real;       // [P_in] bool, on the host
    at::Tensor positions;  // [P, 2] int64 (x, y), on the host
    at::Tensor bin;        // [P] int64, the soft token each patch pools into
    int64_t soft_tokens = 0;
  };
  static Grid grid(const VisionConfig& c, const at::Tensor& pixels, const at::Tensor& positions);

  struct Layer {
    at::Tensor input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
        post_feedforward_layernorm;  // f32, via the compute dtype
    ClippedLinear q_proj, k_proj, v_proj, o_proj;
    at::Tensor q_norm, k_norm;
    ClippedLinear gate_proj, up_proj, down_proj;
  };

  void load(const Checkpoint& ckpt, const QuantizationConfig* quant);
  at::Tensor attention(const Layer& w, const at::Tensor& x, const at::Tensor& cos,
                       const at::Tensor& sin) const;

  VisionConfig config_;
  int64_t text_hidden_size_ = 0;
  ModelOptions options_;
  std::shared_ptr<const Checkpoint> checkpoint_;  // keeps weight mappings alive
  at::Tensor input_proj_;                         // [hidden, 3 * patch^2]
  at::Tensor position_embedding_table_;           // [2, position_embedding_size, hidden]
  std::vector<Layer> layers_;
  at::Tensor std_bias_, std_scale_;  // f32, defined when standardize
  at::Tensor embedding_projection_;  // [text hidden, vision hidden]
  at::Tensor inv_freq_;              // f32 [head_dim / 4] on the device
};

}  // namespace torchtpu
