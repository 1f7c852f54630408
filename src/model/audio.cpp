#include "model/audio.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "common/errors.h"
#include "io/aten_view.h"
#include "ops/rms_norm.h"

namespace torchtpu {
namespace {

constexpr const char* kTower = "model.audio_tower.";
constexpr const char* kEmbedder = "model.embed_audio.";

// Gemma4RMSNorm's default eps: the conformer layers' own norms do not take the config's.
constexpr double kLayerNormEps = 1e-6;

// The largest value the compute dtype holds bounds the configured clipping (transformers takes
// the minimum of the two so that a bf16 or f16 clamp never overflows).
double clip_bound(double gradient_clipping, at::ScalarType dtype) {
  double max = std::numeric_limits<float>::max();
  if (dtype == at::kBFloat16) max = std::numeric_limits<c10::BFloat16>::max();
  if (dtype == at::kHalf) max = std::numeric_limits<c10::Half>::max();
  if (dtype == at::kDouble) max = std::numeric_limits<double>::max();
  return std::min(gradient_clipping, max);
}

}  // namespace

AudioTower::AudioTower(const Checkpoint& ckpt, const ModelConfig& config,
                       const ModelOptions& options)
    : options_(options) {
  load(ckpt, config);
}

AudioTower::AudioTower(const std::string& model_dir, const ModelOptions& options)
    : owned_(std::make_shared<Checkpoint>(model_dir)), options_(options) {
  load(*owned_, load_config(model_dir));
}

void AudioTower::load(const Checkpoint& ckpt, const ModelConfig& config) {
  if (!config.audio) {
    throw FormatError("checkpoint " + ckpt.dir() +
                      " has no audio encoder: config.json has no audio_config");
  }
  audio_ = *config.audio;
  text_hidden_size_ = config.hidden_size;
  const auto& a = audio_;
  const auto& o = options_;
  auto tensor = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const auto& view = ckpt.get(name);
    expect_weight(view, shape);
    return host_tensor(view).to(o.device, o.dtype);
  };
  // Norm weights are rounded to the compute dtype as transformers holds them, then used in f32.
  auto norm = [&](const std::string& name, int64_t dim) {
    return tensor(name + ".weight", {dim}).to(at::kFloat);
  };
  auto clipped = [&](const std::string& name, int64_t out, int64_t in) {
    ClippedLinear l;
    l.weight = tensor(name + ".linear.weight", {out, in});
    if (a.use_clipped_linears) {
      l.input_min = tensor(name + ".input_min", {});
      l.input_max = tensor(name + ".input_max", {});
      l.output_min = tensor(name + ".output_min", {});
      l.output_max = tensor(name + ".output_max", {});
    }
    return l;
  };
  const int64_t H = a.hidden_size;
  const int64_t c0 = a.subsampling_conv_channels[0];
  const int64_t c1 = a.subsampling_conv_channels[1];
  const std::string s = std::string(kTower) + "subsample_conv_projection.";
  conv0_ = tensor(s + "layer0.conv.weight", {c0, 1, 3, 3});
  norm0_ = tensor(s + "layer0.norm.weight", {c0});
  conv1_ = tensor(s + "layer1.conv.weight", {c1, c0, 3, 3});
  norm1_ = tensor(s + "layer1.norm.weight", {c1});
  input_proj_ = tensor(s + "input_proj_linear.weight", {H, (c0 / 4) * c1});

  auto feed_forward = [&](const std::string& p) {
    AudioFeedForward f;
    f.pre_layer_norm = norm(p + "pre_layer_norm", H);
    f.post_layer_norm = norm(p + "post_layer_norm", H);
    f.ffw_layer_1 = clipped(p + "ffw_layer_1", 4 * H, H);
    f.ffw_layer_2 = clipped(p + "ffw_layer_2", H, 4 * H);
    return f;
  };
  for (int64_t l = 0; l < a.num_hidden_layers; ++l) {
    const std::string p = std::string(kTower) + "layers." + std::to_string(l) + ".";
    AudioLayerWeights w;
    w.feed_forward1 = feed_forward(p + "feed_forward1.");
    w.feed_forward2 = feed_forward(p + "feed_forward2.");
    w.q_proj = clipped(p + "self_attn.q_proj", H, H);
    w.k_proj = clipped(p + "self_attn.k_proj", H, H);
    w.v_proj = clipped(p + "self_attn.v_proj", H, H);
    w.post = clipped(p + "self_attn.post", H, H);
    w.relative_k_proj = tensor(p + "self_attn.relative_k_proj.weight", {H, H});
    w.per_dim_scale = tensor(p + "self_attn.per_dim_scale", {a.head_dim()});
    w.lconv_pre_layer_norm = norm(p + "lconv1d.pre_layer_norm", H);
    w.conv_norm = norm(p + "lconv1d.conv_norm", H);
    w.linear_start = clipped(p + "lconv1d.linear_start", 2 * H, H);
    w.linear_end = clipped(p + "lconv1d.linear_end", H, H);
    w.depthwise_conv1d = tensor(p + "lconv1d.depthwise_conv1d.weight", {H, 1, a.conv_kernel_size});
    w.norm_pre_attn = norm(p + "norm_pre_attn", H);
    w.norm_post_attn = norm(p + "norm_post_attn", H);
    w.norm_out = norm(p + "norm_out", H);
    layers_.push_back(std::move(w));
  }
  output_proj_weight_ = tensor(std::string(kTower) + "output_proj.weight", {a.output_proj_dims, H});
  output_proj_bias_ = tensor(std::string(kTower) + "output_proj.bias", {a.output_proj_dims});
  embedding_projection_ = tensor(std::string(kEmbedder) + "embedding_projection.weight",
                                 {text_hidden_size_, a.output_proj_dims});

  // Gemma4AudioRelPositionalEncoding: relative distances context_size / 2 down to 0, each as
  // [sin(d·τ), cos(d·τ)] over hidden / 2 geometric timescales from 1 to 10^4.
  const int64_t context =
      a.attention_chunk_size + a.attention_context_left - 1 + a.attention_context_right;
  const int64_t timescales = H / 2;
  const double increment = std::log(10000.0) / std::max<int64_t>(timescales - 1, 1);
  const auto inv_timescales = at::exp(at::arange(timescales, at::kFloat) * -increment);
  const auto distance = at::arange(context / 2, -1, -1, at::kLong).unsqueeze(-1);
  const auto scaled = distance * inv_timescales.unsqueeze(0);
  relative_positions_ = at::cat({at::sin(scaled), at::cos(scaled)}, -1).to(o.device, o.dtype);
}

at::Tensor AudioTower::activation(const at::Tensor& x) const {
  return audio_.hidden_act == "silu" ? at::silu(x) : at::gelu(x, "tanh");
}

at::Tensor AudioTower::feed_forward(const AudioFeedForward& w, const at::Tensor& x) const {
  const double clip = clip_bound(audio_.gradient_clipping, x.scalar_type());
  auto h = ops::rms_norm(at::clamp(x, -clip, clip), w.pre_layer_norm, kLayerNormEps);
  h = w.ffw_layer_2(activation(w.ffw_layer_1(h)));
  h = ops::rms_norm(at::clamp(h, -clip, clip), w.post_layer_norm, kLayerNormEps);
  return h * audio_.residual_weight + x;
}

// Gemma4AudioAttention: queries in blocks of chunk_size, each attending to a context of
// chunk_size + context_left - 1 + context_right keys around its block; logits are content terms
// plus relative-position terms (Transformer-XL's rel-shift), soft-capped, then masked. In f32.
at::Tensor AudioTower::attention(const AudioLayerWeights& w, const at::Tensor& x,
                                 const at::Tensor& invalid) const {
  const auto& a = audio_;
  const int64_t T = x.size(0);
  const int64_t N = a.num_attention_heads;
  const int64_t D = a.head_dim();
  const int64_t C = a.attention_chunk_size;
  const int64_t past = a.attention_context_left - 1;
  const int64_t future = a.attention_context_right;
  const int64_t context = C + past + future;
  const int64_t blocks = (T + C - 1) / C;

  const double q_scale = std::pow(static_cast<double>(D), -0.5) / std::log(2.0);
  const double k_scale = std::log(1.0 + std::exp(1.0)) / std::log(2.0);
  auto q = w.q_proj(x).to(at::kFloat).view({T, N, D});
  auto k = w.k_proj(x).to(at::kFloat).view({T, N, D});
  auto v = w.v_proj(x).to(at::kFloat).view({T, N, D});
  q = q * q_scale * at::softplus(w.per_dim_scale);
  k = k * k_scale;

  // [blocks, C, N, D] queries; [blocks, context, N, D] keys and values of each block's window.
  q = at::constant_pad_nd(q, {0, 0, 0, 0, 0, blocks * C - T}).view({blocks, C, N, D});
  auto windows = [&](const at::Tensor& t) {
    return at::constant_pad_nd(t, {0, 0, 0, 0, past, future + C - 1})
        .unfold(0, context, C)
        .movedim(-1, 1);
  };
  k = windows(k);
  v = windows(v);

  const auto queries = q.permute({2, 0, 1, 3});                       // [N, blocks, C, D]
  const auto content = at::matmul(queries, k.permute({2, 0, 3, 1}));  // [N, blocks, C, context]

  const int64_t P = relative_positions_.size(0);
  const auto rel_k = at::linear(relative_positions_, w.relative_k_proj).view({P, N, D});
  auto position = at::matmul(queries.reshape({N, blocks * C, D}),
                             rel_k.to(at::kFloat).permute({1, 2, 0}));  // [N, blocks·C, P]
  // Rel-shift: pad each row to context + 1, reflow the block's rows and drop the tail, so that
  // column j of row i holds relative distance (i + past - j)'s term.
  position = at::constant_pad_nd(position.view({N, blocks, C, P}), {0, context + 1 - P})
                 .view({N, blocks, C * (context + 1)})
                 .narrow(-1, 0, C * context)
                 .view({N, blocks, C, context});

  const double cap = a.attention_logit_cap;
  auto logits = at::tanh((content + position) / cap) * cap;
  logits = logits.masked_fill(invalid, a.attention_invalid_logits_value);
  const auto probs = at::softmax(logits, -1, at::kFloat);
  const auto out = at::matmul(probs, v.permute({2, 0, 1, 3}))  // [N, blocks, C, D]
                       .permute({1, 2, 0, 3})
                       .reshape({blocks * C, N * D})
                       .narrow(0, 0, T);
  return w.post(out.to(x.scalar_type()));
}

// Gemma4AudioLightConv1d: GLU, a causal depthwise convolution over time, norm, activation.
at::Tensor AudioTower::light_conv(const AudioLayerWeights& w, const at::Tensor& x) const {
  const int64_t K = audio_.conv_kernel_size;
  auto h = ops::rms_norm(x, w.lconv_pre_layer_norm, audio_.rms_norm_eps);
  h = at::glu(w.linear_start(h), -1);
  h = at::constant_pad_nd(h.t().unsqueeze(0), {K - 1, 0});
  h = at::conv1d(h, w.depthwise_conv1d, /*bias=*/{}, /*stride=*/at::IntArrayRef{1},
                 /*padding=*/at::IntArrayRef{0}, /*dilation=*/at::IntArrayRef{1},
                 audio_.hidden_size)
          .squeeze(0)
          .t();
  const double clip = clip_bound(audio_.gradient_clipping, h.scalar_type());
  h = ops::rms_norm(at::clamp(h, -clip, clip), w.conv_norm, audio_.rms_norm_eps);
  return w.linear_end(activation(h)) + x;
}

std::pair<at::Tensor, at::Tensor> AudioTower::encode(const at::Tensor& features,
                                                     const at::Tensor& mask) const {
  const auto& a = audio_;
  const auto& o = options_;
  TORCH_CHECK_VALUE(features.dim() == 2 && features.is_floating_point(),
                    "audio features must be a float tensor [frames, mel bins], got ",
                    features.scalar_type(), " of shape ", features.sizes());
  TORCH_CHECK_VALUE(features.size(0) > 0, "audio features have no frames");
  TORCH_CHECK_VALUE(
      mask.dim() == 1 && mask.scalar_type() == at::kBool && mask.size(0) == features.size(0),
      "the audio feature mask must be a bool tensor [", features.size(0),
      "] (one entry per frame), got ", mask.scalar_type(), " of shape ", mask.sizes());
  const int64_t bins = features.size(1);
  const int64_t bins_out = ((bins + 1) / 2 + 1) / 2;
  TORCH_CHECK_VALUE(bins_out * a.subsampling_conv_channels[1] == input_proj_.size(1),
                    "audio features have ", bins,
                    " mel bins, but this checkpoint's subsampling projection takes ",
                    input_proj_.size(1) / a.subsampling_conv_channels[1],
                    " bins after two stride-2 convolutions (",
                    4 * (input_proj_.size(1) / a.subsampling_conv_channels[1]), " mel bins)");

  // Gemma4AudioSubSampleConvProjection: two stride-2 3x3 convolutions over (time, mel), each on
  // masked input, followed by a LayerNorm over channels and a ReLU; the mask keeps every second
  // frame.
  auto valid = mask.to(o.device);
  auto h = features.to(o.device, at::kFloat).unsqueeze(0).unsqueeze(0);  // [1, 1, T, bins]
  auto subsample = [&](const at::Tensor& x, const at::Tensor& weight, const at::Tensor& norm) {
    auto y = at::conv2d((x * valid.view({1, 1, -1, 1})).to(o.dtype), weight, {}, 2, 1);
    y = at::layer_norm(y.permute({0, 2, 3, 1}), {y.size(1)}, norm, {}, a.rms_norm_eps);
    valid = valid.slice(0, 0, c10::nullopt, 2);
    return at::relu(y).permute({0, 3, 1, 2});
  };
  h = subsample(h, conv0_, norm0_);
  h = subsample(h, conv1_, norm1_);
  const int64_t T = h.size(2);
  h = at::linear(h.permute({0, 2, 3, 1}).reshape({T, -1}), input_proj_);  // [T, hidden]

  // Masked logits of every block's window: keys outside the clip or at invalid frames, and keys
  // outside the window transformers' sliding_window_mask_function allows (distance q - k in
  // [0, context_left - 1) or in (-context_right, 0)).
  const int64_t C = a.attention_chunk_size;
  const int64_t past = a.attention_context_left - 1;
  const int64_t future = a.attention_context_right;
  const int64_t context = C + past + future;
  const int64_t blocks = (T + C - 1) / C;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(o.device);
  const auto i = at::arange(C, long_options).view({1, C, 1});
  const auto j = at::arange(context, long_options).view({1, 1, context});
  const auto key = at::arange(blocks, long_options).view({blocks, 1, 1}) * C + j - past;
  const auto in_clip = (key >= 0) & (key < T);
  const auto key_valid = in_clip & valid.index({key.clamp(0, T - 1)});
  const auto distance = i - j + past;
  const auto in_window =
      ((distance >= 0) & (distance < past)) | ((distance < 0) & (-distance < future));
  const auto invalid = (key_valid & in_window).logical_not().unsqueeze(0);  // [1, blocks, C, ctx]

  const double clip = clip_bound(a.gradient_clipping, o.dtype);
  for (const auto& w : layers_) {
    h = feed_forward(w.feed_forward1, h);
    auto attended = attention(
        w, ops::rms_norm(at::clamp(h, -clip, clip), w.norm_pre_attn, kLayerNormEps), invalid);
    h = ops::rms_norm(at::clamp(attended, -clip, clip), w.norm_post_attn, kLayerNormEps) + h;
    h = light_conv(w, h);
    h = feed_forward(w.feed_forward2, h);
    h = ops::rms_norm(at::clamp(h, -clip, clip), w.norm_out, kLayerNormEps);
  }
  return {at::linear(h, output_proj_weight_, output_proj_bias_), valid};
}

at::Tensor AudioTower::embed(const at::Tensor& features, const at::Tensor& mask) const {
  const auto [soft, valid] = encode(features, mask);
  const auto kept = soft.index({valid});
  return at::linear(ops::rms_norm(kept, at::Tensor(), audio_.rms_norm_eps), embedding_projection_);
}

}  // namespace torchtpu
