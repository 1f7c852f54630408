#include "model/vision.h"

#include <cmath>
#include <sstream>
#include <utility>

#include "common/errors.h"
#include "io/aten_view.h"
#include "ops/elementwise.h"
#include "ops/rms_norm.h"
#include "quant/pack_quantized.h"

namespace torchtpu {
namespace {

const std::string kTower = "model.vision_tower.";
const std::string kEmbedder = "model.embed_vision.";

const TensorView& get(const Checkpoint& ckpt, const std::string& name,
                      const std::vector<int64_t>& shape) {
  const TensorView* view = ckpt.find(name);
  if (view == nullptr) {
    throw FormatError("checkpoint " + ckpt.dir() + " has no tensor " + name +
                      " (config.json has a vision_config, so the vision tower's weights must be "
                      "there)");
  }
  expect_weight(*view, shape);
  return *view;
}

// rotate_half over the last dim: [-x2, x1].
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// apply_multidimensional_rope with two dimensions: the first half of each head rotates by the x
// coordinate, the second by y, each half in the rotate-half convention.
at::Tensor axial_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  std::vector<at::Tensor> parts;
  for (int64_t k = 0; k < 2; ++k) {
    auto xk = x.narrow(-1, k * half, half);
    parts.push_back(xk * cos.narrow(-1, k * half, half) +
                    rotate_half(xk) * sin.narrow(-1, k * half, half));
  }
  return at::cat(parts, -1);
}

}  // namespace

VisionTower::VisionTower(std::shared_ptr<const Checkpoint> ckpt, const ModelConfig& config,
                         const ModelOptions& options)
    : text_hidden_size_(config.hidden_size), options_(options), checkpoint_(std::move(ckpt)) {
  if (!config.vision) {
    throw ValueError("checkpoint " + checkpoint_->dir() +
                     " has no vision encoder: its config.json has no vision_config, so it "
                     "cannot read images");
  }
  config_ = *config.vision;
  load(*checkpoint_, config.quantization ? &*config.quantization : nullptr);
}

VisionTower::VisionTower(const std::string& model_dir, const ModelOptions& options)
    : VisionTower(std::make_shared<const Checkpoint>(model_dir), load_config(model_dir), options) {}

void VisionTower::load(const Checkpoint& ckpt, const QuantizationConfig* quant) {
  const auto& c = config_;
  const auto& o = options_;
  const int64_t H = c.hidden_size;
  const int64_t D = c.head_dim;
  auto dense = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return host_tensor(get(ckpt, name, shape)).to(o.device, o.dtype);
  };
  // Rounded through the compute dtype first, as a model cast to that dtype holds it.
  auto norm = [&](const std::string& name, int64_t dim) {
    return host_tensor(get(ckpt, name, {dim})).to(o.dtype).to(at::kFloat).to(o.device);
  };
  // A linear's [out, in] weight: dense, or pack-quantized int4 expanded to the compute dtype (the
  // tower runs once per image, so it keeps no packed form).
  auto matrix = [&](const std::string& module, int64_t out, int64_t in) {
    if (!has_packed(ckpt, module)) return dense(module + ".weight", {out, in});
    const PackedInt4 packed = read_packed(ckpt, module, quant);
    expect_shape(packed, out, in, "config.json's vision_config");
    return dequantize(packed.to(o.device), o.dtype);
  };
  auto linear = [&](const std::string& module, int64_t out, int64_t in) {
    ClippedLinear l;
    l.weight = matrix(module + ".linear", out, in);
    if (c.use_clipped_linears) {
      l.input_min = dense(module + ".input_min", {});
      l.input_max = dense(module + ".input_max", {});
      l.output_min = dense(module + ".output_min", {});
      l.output_max = dense(module + ".output_max", {});
    }
    return l;
  };

  input_proj_ = matrix(kTower + "patch_embedder.input_proj", H, 3 * c.patch_size * c.patch_size);
  position_embedding_table_ =
      dense(kTower + "patch_embedder.position_embedding_table", {2, c.position_embedding_size, H});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = kTower + "encoder.layers." + std::to_string(l) + ".";
    Layer w;
    w.input_layernorm = norm(p + "input_layernorm.weight", H);
    w.post_attention_layernorm = norm(p + "post_attention_layernorm.weight", H);
    w.pre_feedforward_layernorm = norm(p + "pre_feedforward_layernorm.weight", H);
    w.post_feedforward_layernorm = norm(p + "post_feedforward_layernorm.weight", H);
    w.q_proj = linear(p + "self_attn.q_proj", c.num_attention_heads * D, H);
    w.k_proj = linear(p + "self_attn.k_proj", c.num_key_value_heads * D, H);
    w.v_proj = linear(p + "self_attn.v_proj", c.num_key_value_heads * D, H);
    w.o_proj = linear(p + "self_attn.o_proj", H, c.num_attention_heads * D);
    w.q_norm = norm(p + "self_attn.q_norm.weight", D);
    w.k_norm = norm(p + "self_attn.k_norm.weight", D);
    w.gate_proj = linear(p + "mlp.gate_proj", c.intermediate_size, H);
    w.up_proj = linear(p + "mlp.up_proj", c.intermediate_size, H);
    w.down_proj = linear(p + "mlp.down_proj", H, c.intermediate_size);
    layers_.push_back(std::move(w));
  }
  if (c.standardize) {
    // Buffers of the model's dtype, applied in f32 (Gemma4VisionModel.forward).
    std_bias_ = dense(kTower + "std_bias", {H}).to(at::kFloat);
    std_scale_ = dense(kTower + "std_scale", {H}).to(at::kFloat);
  }
  embedding_projection_ = matrix(kEmbedder + "embedding_projection", text_hidden_size_, H);

  // Gemma4VisionRotaryEmbedding: frequencies over a quarter of head_dim, shared by x and y.
  const int64_t spatial = D / 2;
  auto exponents = at::arange(0, spatial, 2, at::kLong).to(at::kFloat) / spatial;
  inv_freq_ = (1.0 / at::pow(c.rope_theta, exponents)).to(o.device);
}

at::Tensor VisionTower::attention(const Layer& w, const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin) const {
  const auto& c = config_;
  const int64_t B = x.size(0), T = x.size(1), D = c.head_dim;
  auto q = w.q_proj(x).view({B, T, -1, D});
  q = axial_rope(ops::rms_norm(q, w.q_norm, c.rms_norm_eps), cos, sin).transpose(1, 2);
  auto k = w.k_proj(x).view({B, T, -1, D});
  k = axial_rope(ops::rms_norm(k, w.k_norm, c.rms_norm_eps), cos, sin).transpose(1, 2);
  auto v =
      ops::rms_norm(w.v_proj(x).view({B, T, -1, D}), at::Tensor(), c.rms_norm_eps).transpose(1, 2);
  const int64_t groups = c.num_attention_heads / c.num_key_value_heads;
  if (groups > 1) {
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  // Bidirectional over the patches of one image; the q/k norms replace the 1/sqrt(d) scale.
  auto out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/false, /*scale=*/1.0);
  return w.o_proj(out.transpose(1, 2).reshape({B, T, -1}));
}

VisionTower::Grid VisionTower::grid(const VisionConfig& c, const at::Tensor& pixels,
                                    const at::Tensor& positions) {
  const int64_t patch_width = 3 * c.patch_size * c.patch_size;
  const int64_t k = c.pooling_kernel_size;
  TORCH_CHECK_VALUE(pixels.dim() == 2 && pixels.size(1) == patch_width &&
                        at::isFloatingType(pixels.scalar_type()),
                    "image pixels must be a floating-point tensor [patches, 3 * patch_size^2 = ",
                    patch_width, "], got ", pixels.scalar_type(), " ", pixels.sizes());
  TORCH_CHECK_VALUE(positions.dim() == 2 && positions.size(0) == pixels.size(0) &&
                        positions.size(1) == 2 && !at::isFloatingType(positions.scalar_type()) &&
                        positions.scalar_type() != at::kBool,
                    "image positions must be an integer tensor [patches = ", pixels.size(0),
                    ", 2], got ", positions.scalar_type(), " ", positions.sizes());

  // Padding rows (-1, -1) are masked out of attention and pooling by transformers; dropping them
  // gives the real patches the same result.
  auto host_positions = positions.to(at::kCPU, at::kLong);
  const auto real = (host_positions != -1).any(1);
  host_positions = host_positions.index({real});
  const int64_t P = host_positions.size(0);
  TORCH_CHECK_VALUE(P > 0, "the image has no patches (every position is padding)");
  const int64_t x_max = host_positions.select(1, 0).max().item<int64_t>();
  const int64_t y_max = host_positions.select(1, 1).max().item<int64_t>();
  const int64_t lowest = host_positions.min().item<int64_t>();
  TORCH_CHECK_VALUE(
      lowest >= 0 && std::max(x_max, y_max) < c.position_embedding_size,
      "image patch positions must lie in [0, position_embedding_size = ", c.position_embedding_size,
      "), got values from ", lowest, " to ", std::max(x_max, y_max));
  const int64_t grid_w = x_max + 1, grid_h = y_max + 1;
  TORCH_CHECK_VALUE(grid_w % k == 0 && grid_h % k == 0 && P == grid_w * grid_h,
                    "image patches must tile a grid whose sides are multiples of "
                    "pooling_kernel_size = ",
                    k, ": got ", P, " patches with positions up to (", x_max, ", ", y_max, ")");
  // Gemma4VisionPooler's bins: each k x k block of patches, numbered row by row.
  const auto bins = at::div(host_positions, k, "floor");
  const auto bin = bins.select(1, 0) + (grid_w / k) * bins.select(1, 1);
  const int64_t soft_tokens = P / (k * k);
  TORCH_CHECK_VALUE(at::bincount(bin, {}, soft_tokens).eq(k * k).all().item<bool>(),
                    "image patch positions must each appear once (", P, " patches, grid ", grid_w,
                    " x ", grid_h, ")");
  return {real, host_positions, bin, soft_tokens};
}

void VisionTower::check(const VisionConfig& config, const at::Tensor& pixels,
                        const at::Tensor& positions) {
  grid(config, pixels, positions);
}

at::Tensor VisionTower::embed(const at::Tensor& pixels, const at::Tensor& positions) const {
  const auto& c = config_;
  const auto& o = options_;
  const int64_t k = c.pooling_kernel_size;
  const auto [real, host_positions, bin, soft_tokens] = grid(c, pixels, positions);
  const auto real_device = real.to(pixels.device());
  auto px = pixels.index({real_device}).to(o.device, at::kFloat);
  const auto pos = host_positions.to(o.device);
  const auto bin_device = bin.to(o.device);

  // Gemma4VisionPatchEmbedder: pixels scaled to [-1, 1], projected, plus the x and y tables.
  px = (2 * (px - 0.5)).to(o.dtype);
  auto h =
      at::linear(px, input_proj_) + (at::embedding(position_embedding_table_[0], pos.select(1, 0)) +
                                     at::embedding(position_embedding_table_[1], pos.select(1, 1)));
  h = h.unsqueeze(0);

  // Gemma4VisionRotaryEmbedding: angles of x and y, laid out x x y y over head_dim.
  auto freqs = pos.unsqueeze(-1).to(at::kFloat) * inv_freq_;  // [P, 2, D / 4]
  auto layout = [&](const at::Tensor& f) {
    auto fx = f.select(1, 0), fy = f.select(1, 1);
    return at::cat({fx, fx, fy, fy}, -1).to(o.dtype).unsqueeze(0).unsqueeze(2);  // [1, P, 1, D]
  };
  const auto cos = layout(freqs.cos()), sin = layout(freqs.sin());

  for (const Layer& w : layers_) {
    auto a = attention(w, ops::rms_norm(h, w.input_layernorm, c.rms_norm_eps), cos, sin);
    h = h + ops::rms_norm(a, w.post_attention_layernorm, c.rms_norm_eps);
    auto x = ops::rms_norm(h, w.pre_feedforward_layernorm, c.rms_norm_eps);
    auto m = w.down_proj(ops::gelu_tanh_mul(w.gate_proj(x), w.up_proj(x)));
    h = h + ops::rms_norm(m, w.post_feedforward_layernorm, c.rms_norm_eps);
  }
  h = h.squeeze(0);

  // Gemma4VisionPooler: the mean of each bin (in f32, rounded to the compute dtype), then scaled
  // by sqrt(hidden_size) in f32.
  if (k > 1) {
    h = at::zeros({soft_tokens, c.hidden_size}, h.options().dtype(at::kFloat))
            .index_add_(0, bin_device, h.to(at::kFloat) * (1.0 / static_cast<double>(k * k)))
            .to(o.dtype);
  }
  auto soft = h.to(at::kFloat) * std::sqrt(static_cast<double>(c.hidden_size));
  if (c.standardize) soft = (soft - std_bias_) * std_scale_;
  soft = soft.to(o.dtype);

  // Gemma4MultimodalEmbedder: a norm without scale, then the projection into the text model.
  return at::linear(ops::rms_norm(soft, at::Tensor(), c.rms_norm_eps), embedding_projection_);
}

}  // namespace torchtpu
