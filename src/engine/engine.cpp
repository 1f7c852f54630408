#include "engine/engine.h"

#include <ATen/Parallel.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <thread>
#include <utility>

#include "common/errors.h"
#include "common/fnv1a.h"
#include "common/memory.h"
#include "engine/draft.h"
#include "engine/sequence.h"
#include "io/checkpoint.h"

namespace torchtpu {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

at::Tensor id_tensor(const std::vector<int64_t>& ids, const at::Device& device) {
  return at::tensor(ids, at::kLong).view({1, static_cast<int64_t>(ids.size())}).to(device);
}

// The ids of a host int64 tensor, in order.
std::vector<int64_t> host_ids(const at::Tensor& ids) {
  const auto flat = ids.contiguous();
  return {flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()};
}

// The soft tokens of prompt positions [begin, end), or none when the chunk has none.
std::optional<SoftTokens> soft_tokens(const PromptMedia& media, int64_t begin, int64_t end,
                                      const at::Device& device) {
  const auto& p = media.positions;
  const auto lo = std::lower_bound(p.begin(), p.end(), begin) - p.begin();
  const auto hi = std::lower_bound(p.begin(), p.end(), end) - p.begin();
  if (lo == hi) return std::nullopt;
  auto mask = at::zeros({1, end - begin}, at::kBool);
  auto* m = mask.data_ptr<bool>();
  for (auto i = lo; i < hi; ++i) m[p[i] - begin] = true;
  return SoftTokens{mask.to(device), media.rows.narrow(0, lo, hi - lo)};
}

}  // namespace

at::Device parse_device(const std::string& name) {
  std::optional<at::Device> device;
  try {
    device.emplace(name);
  } catch (const std::exception&) {
    // at::Device also knows the name a PrivateUse1 backend registered (torch_tpu's "tpu").
    throw ValueError("unknown device '" + name +
                     "' (expected cpu, cuda, cuda:N, or the name of a registered backend: tpu "
                     "after importing torch_tpu, or one loaded with --device-library)");
  }
  // at::Device keeps the index in an int8: cpu:250 would come back as cpu:-6, past every check.
  if (const auto colon = name.rfind(':');
      colon != std::string::npos && name.substr(colon + 1) != std::to_string(device->index())) {
    throw ValueError("device '" + name + "': index " + name.substr(colon + 1) +
                     " is past the largest torch numbers a device by, " +
                     std::to_string(std::numeric_limits<c10::DeviceIndex>::max()));
  }
  check_device(*device, name);
  return *device;
}

void check_device(const at::Device& device, const std::string& name) {
  if (device.is_meta() || device.type() == at::kLazy) {
    throw ValueError("device '" + name +
                     "' holds no data (one of torch's placeholder devices): give cpu, cuda[:N] "
                     "or a backend's device");
  }
  if (!c10::impl::hasDeviceGuardImpl(device.type())) {
    throw ValueError("device '" + name + "': this torch has no " +
                     c10::DeviceTypeName(device.type(), /*lower_case=*/true) +
                     " backend (built without it, or the module that registers it is not "
                     "loaded)");
  }
  if (device.is_cpu() && device.index() > 0) {
    throw ValueError("device '" + name + "': the CPU is one device, cpu or cpu:0");
  }
  // A CUDA device this machine lacks is the user's mistake, named here rather than by the first
  // copy to it (whose message is the driver's, with a C++ backtrace).
  if (device.is_cuda()) {
    const int64_t count = at::detail::getCUDAHooks().deviceCount();
    if (count == 0) {
      throw ValueError("device '" + name + "': torch sees no CUDA device on this machine");
    }
    if (device.index() >= count) {
      throw ValueError("device '" + name + "': torch sees " + std::to_string(count) +
                       " CUDA device" + (count == 1 ? "" : "s") + ", cuda:0 to cuda:" +
                       std::to_string(count - 1));
    }
  }
}

at::ScalarType parse_dtype_name(const std::string& name) {
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float32" || name == "f32" || name == "float") return at::kFloat;
  if (name == "float16" || name == "f16" || name == "half") return at::kHalf;
  throw ValueError("unknown dtype '" + name + "' (expected bfloat16, float32 or float16)");
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return "bfloat16";
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    default: return c10::toString(dtype);
  }
}

EngineOptions EngineSettings::options(const std::string& model_dir) const {
  EngineOptions o;
  o.model_dir = model_dir;
  o.emb4_dir = emb4_dir;
  o.device = parse_device(device);
  o.dtype = parse_dtype_name(dtype);
  o.context = context;
  o.threads = threads;
  o.int4 = parse_int4_weights(int4);
  o.quantize_int4 = parse_quantize(quantize);
  o.int4_activation_bits = int4_activation_bits;
  o.no_vision = no_vision;
  o.no_audio = no_audio;
  o.draft_model = draft_model;
  o.max_lora = max_lora;
  for (const auto& text : lora) {
    o.lora.push_back(parse_lora_spec(text));
    if (lora_init_without_apply) o.lora.back().scale = 0;
  }
  return o;
}

LoraSpec parse_lora_spec(const std::string& text) {
  const auto eq = text.find('=');
  LoraSpec spec;
  spec.dir = eq == std::string::npos ? text : text.substr(eq + 1);
  while (spec.dir.size() > 1 && spec.dir.back() == '/') spec.dir.pop_back();
  spec.name = eq == std::string::npos ? std::filesystem::path(spec.dir).filename().string()
                                      : text.substr(0, eq);
  if (spec.dir.empty() || spec.name.empty()) {
    throw ValueError("a LoRA adapter is given as [NAME=]DIR, got '" + text + "'");
  }
  return spec;
}

Int4Weights parse_int4_weights(const std::string& name) {
  for (auto mode : {Int4Weights::kAuto, Int4Weights::kPacked, Int4Weights::kComposite,
                    Int4Weights::kDequantized}) {
    if (name == int4_weights_name(mode)) return mode;
  }
  throw ValueError("int4 weights \"" + name +
                   "\" is not one of auto, packed, composite, dequantized");
}

std::string int4_weights_name(Int4Weights mode) {
  switch (mode) {
    case Int4Weights::kAuto: return "auto";
    case Int4Weights::kPacked: return "packed";
    case Int4Weights::kComposite: return "composite";
    case Int4Weights::kDequantized: return "dequantized";
  }
  return "auto";
}

bool parse_quantize(const std::string& name) {
  if (name == "int4") return true;
  if (name == "none" || name.empty()) return false;
  throw ValueError("quantize \"" + name + "\" is not one of int4, none");
}

int64_t physical_cores() {
  // Linux names each logical CPU's core by (package, core id); siblings share the pair.
  std::set<std::pair<std::string, std::string>> cores;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/sys/devices/system/cpu", error)) {
    const std::string name = entry.path().filename();
    if (name.size() < 4 || name.rfind("cpu", 0) != 0 ||
        !std::all_of(name.begin() + 3, name.end(), ::isdigit)) {
      continue;
    }
    std::ifstream package(entry.path() / "topology/physical_package_id");
    std::ifstream core(entry.path() / "topology/core_id");
    std::string p, c;
    if (package >> p && core >> c) cores.emplace(p, c);
  }
  if (!cores.empty()) return static_cast<int64_t>(cores.size());
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}

int64_t default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const std::string first(env, std::strcspn(env, ","));
    if (!first.empty() && first.size() <= 6 && std::all_of(first.begin(), first.end(), ::isdigit) &&
        std::stoll(first) > 0) {
      return std::stoll(first);
    }
  }
  return physical_cores();
}

namespace {

void check_lora_scale(const std::string& name, double scale) {
  if (!std::isfinite(scale)) {
    throw ValueError("LoRA adapter '" + name + "' is given a scale that is not finite (" +
                     c10::str(scale) + ")");
  }
}

// Adapters to be loaded together: named, apart, at finite scales, no more than max_lora.
void check_lora_specs(const std::vector<LoraSpec>& specs, int64_t max_lora) {
  if (max_lora < 0) {
    throw ValueError("max_lora must be at least 0, got " + std::to_string(max_lora));
  }
  std::set<std::string> names;
  for (const auto& spec : specs) {
    if (spec.name.empty()) throw ValueError("a LoRA adapter needs a name (from " + spec.dir + ")");
    if (!names.insert(spec.name).second) {
      throw ValueError("two LoRA adapters are named '" + spec.name +
                       "': name them apart as NAME=DIR");
    }
    check_lora_scale(spec.name, spec.scale);
  }
  if (static_cast<int64_t>(specs.size()) > max_lora) {
    throw ValueError(std::to_string(specs.size()) + " LoRA adapters would be loaded, more than " +
                     "max_lora (" + std::to_string(max_lora) +
                     "): unload one first, or raise it (--max-loras)");
  }
}

}  // namespace

Engine::Engine(const EngineOptions& options) : options_(options) {
  if (options.threads < 0) {
    throw ValueError("threads must be at least 1 (or 0 for the physical cores), got " +
                     std::to_string(options.threads));
  }
  options_.threads = options.threads ? options.threads : default_threads();
  at::set_num_threads(static_cast<int>(options_.threads));
  if (options.context < 1) {
    throw ValueError("context must be at least 1, got " + std::to_string(options.context));
  }
  if (options.prefill_chunk < 1) {
    throw ValueError("prefill chunk must be at least 1, got " +
                     std::to_string(options.prefill_chunk));
  }
  if (options.int4_activation_bits != 16 && options.int4_activation_bits != 8) {
    throw ValueError("int4 activation bits must be 16 or 8, got " +
                     std::to_string(options.int4_activation_bits));
  }
  // Before the weights load, not after.
  check_lora_specs(options.lora, options.max_lora);
  if (load_config(options.model_dir).assistant) {
    throw ValueError("checkpoint " + options.model_dir +
                     " is a Gemma 4 assistant (model_type \"gemma4_assistant\"), which drafts for "
                     "the model it was made for: give it as the draft model (--draft-model) "
                     "beside that model");
  }
  load();
  config_ = model_->config();
  model_options_ = model_->options();
  storage_ = model_->storage();
  for (const auto& spec : options_.lora) load_lora(spec);
  layout_ = ring_layout(config_, options_.context, options_.dtype);
  check_rings_fit(1);  // now, though the rings are made only when a decode needs them
  if (audio_) audio_options_ = load_audio_feature_options(options_.model_dir);
}

ValueError Engine::rings_too_big(int64_t rows, const std::string& have) const {
  return ValueError("the KV cache of " + std::to_string(rows) + (rows == 1 ? " row" : " rows") +
                    " at a context of " + std::to_string(options_.context) + " tokens needs " +
                    std::to_string(layout_.row_bytes * rows >> 20) + " MiB, more than " + have +
                    ": lower the context or the rows decoded together");
}

void Engine::check_rings_fit(int64_t rows) const {
  const int64_t available = options_.device.is_cpu() ? available_memory_bytes() : 0;
  // A tenth stays for everything else: rings that took all of it left a server paging its
  // weights (mapped from their files) in and out, its start taking minutes.
  if (available > 0 && layout_.row_bytes * rows > available / 10 * 9) {
    throw rings_too_big(
        rows, "90% of the " + std::to_string(available >> 20) + " MiB of memory available");
  }
}

Rings Engine::make_rings(int64_t rows) const {
  check_rings_fit(rows);
  try {
    return Rings(config_, options_.context, rows, options_.dtype, options_.device);
  } catch (const c10::OutOfMemoryError& e) {
    throw rings_too_big(rows, "the " + options_.device.str() + " could allocate (" +
                                  e.what_without_backtrace() + ")");
  }
}

Rings& Engine::empty_rings() {
  if (rings_.batch() == 0) {
    rings_ = make_rings(1);
  } else {
    rings_.reset();
  }
  return rings_;
}

const std::string& Engine::weights_id() const {
  std::call_once(weights_id_once_, [this] {
    uint64_t id = Checkpoint(options_.model_dir).fingerprint();
    if (!options_.emb4_dir.empty()) {
      id = id * kFnvPrime ^ Checkpoint(options_.emb4_dir).fingerprint();
    }
    weights_id_ = digest_hex(id);
  });
  return weights_id_;
}

std::vector<StorageReport> Engine::storage() const {
  std::vector<StorageReport> out = storage_;
  const auto dtype = dtype_name(lora_dtype(options_.device, options_.dtype));
  std::lock_guard lock(lora_mutex_);
  for (const auto& a : lora_) {
    out.push_back({"lora " + a.report.spec.name, dtype, c10::str(options_.device), a.nbytes});
  }
  return out;
}

std::vector<LoraReport> Engine::adapters() const {
  std::lock_guard lock(lora_mutex_);
  std::vector<LoraReport> out;
  for (const auto& a : lora_) out.push_back(a.report);
  return out;
}

void Engine::load_lora(const LoraSpec& spec) {
  {
    std::lock_guard lock(lora_mutex_);
    std::vector<LoraSpec> specs;
    for (const auto& a : lora_) specs.push_back(a.report.spec);
    specs.push_back(spec);
    check_lora_specs(specs, options_.max_lora);
  }
  c10::InferenceMode inference;
  auto weights = std::make_shared<const LoraAdapter>(spec.dir, config_, options_.device,
                                                     options_.dtype);
  LoadedLora loaded{{spec, weights->config(), weights->targets()}, weights->nbytes(), weights};
  if (asleep()) loaded.weights.reset();
  std::lock_guard lock(lora_mutex_);
  lora_.push_back(std::move(loaded));
}

void Engine::check_lora(const std::map<std::string, double>& scales) const {
  for (const auto& [name, scale] : scales) {
    lora_named(name);
    check_lora_scale(name, scale);
  }
}

size_t Engine::lora_named(const std::string& name) const {
  for (size_t a = 0; a < lora_.size(); ++a) {
    if (lora_[a].report.spec.name == name) return a;
  }
  std::string loaded;
  for (const auto& a : lora_) loaded += (loaded.empty() ? "" : ", ") + a.report.spec.name;
  throw ValueError("no LoRA adapter is named '" + name + "'; loaded: " +
                   (loaded.empty() ? "none" : loaded));
}

void Engine::unload_lora(const std::string& name) {
  std::shared_ptr<const LoraAdapter> weights;  // freed after the lock, unless a sequence holds it
  std::lock_guard lock(lora_mutex_);
  const auto it = lora_.begin() + static_cast<std::ptrdiff_t>(lora_named(name));
  weights = std::move(it->weights);
  lora_.erase(it);
}

void Engine::set_lora_scales(const std::map<std::string, double>& scales) {
  std::lock_guard lock(lora_mutex_);
  check_lora(scales);
  for (auto& a : lora_) {
    const auto it = scales.find(a.report.spec.name);
    a.report.spec.scale = it == scales.end() ? 0.0 : it->second;
  }
}

void Engine::load_adapters() {
  std::lock_guard lock(lora_mutex_);
  for (auto& a : lora_) {
    a.weights = std::make_shared<const LoraAdapter>(a.report.spec.dir, config_, options_.device,
                                                    options_.dtype);
  }
}

void Engine::load() {
  const auto start = Clock::now();
  c10::InferenceMode inference;
  model_ = std::make_unique<Gemma4>(
      options_.model_dir,
      ModelOptions{options_.device, options_.dtype, options_.emb4_dir,
                   /*attend_filled_slots=*/options_.device.is_cpu(), options_.int4,
                   options_.quantize_int4, options_.int4_activation_bits});
  const auto& c = model_->config();
  if (c.vision && !options_.no_vision) {
    vision_ = std::make_unique<VisionTower>(options_.model_dir, model_->options());
  }
  if (c.audio && !options_.no_audio) {
    audio_ = std::make_unique<AudioTower>(options_.model_dir, model_->options());
  }
  if (!options_.draft_model.empty()) load_drafter();
  load_s_ = seconds_since(start);
}

void Engine::load_drafter() {
  const auto& t = model_->config();
  const std::string& dir = options_.draft_model;
  const ModelConfig a = load_config(dir);
  auto mismatch = [&](const std::string& what, int64_t assistant, int64_t target) {
    if (assistant != target) {
      throw ValueError("the draft model " + dir + " does not fit " + options_.model_dir + ": its " +
                       what + " is " + std::to_string(assistant) + ", the model's " +
                       std::to_string(target));
    }
  };
  if (!a.assistant) {
    throw ValueError("the draft model " + dir + " is not a Gemma 4 assistant: its config.json " +
                     "needs model_type \"gemma4_assistant\"");
  }
  mismatch("backbone_hidden_size", a.assistant->backbone_hidden_size, t.hidden_size);
  mismatch("vocab_size", a.vocab_size, t.vocab_size);
  mismatch("num_key_value_heads", a.num_key_value_heads, t.num_key_value_heads);
  auto last_unshared = [&](LayerType type) {
    for (int64_t l = t.first_shared_layer() - 1; l >= 0; --l) {
      if (t.layer_types[l] == type) return l;
    }
    return int64_t{-1};
  };
  draft_sliding_layer_ = last_unshared(LayerType::kSliding);
  draft_full_layer_ = last_unshared(LayerType::kFull);
  for (const auto type : {LayerType::kSliding, LayerType::kFull}) {
    const bool sliding = type == LayerType::kSliding;
    if (std::find(a.layer_types.begin(), a.layer_types.end(), type) == a.layer_types.end()) {
      continue;
    }
    if ((sliding ? draft_sliding_layer_ : draft_full_layer_) < 0) {
      throw ValueError("the draft model " + dir + " has " + (sliding ? "sliding" : "full") +
                       " layers but " + options_.model_dir + " has no such layer to read K/V from");
    }
    mismatch(sliding ? "head_dim" : "global_head_dim", sliding ? a.head_dim : a.global_head_dim,
             sliding ? t.head_dim : t.global_head_dim);
  }
  ModelOptions options = model_->options();
  options.emb4_dir.clear();  // the model's tables, not the assistant's
  drafter_ = std::make_unique<Gemma4>(dir, options);
}

void Engine::sleep() {
  release_rings();
  audio_.reset();
  vision_.reset();
  drafter_.reset();
  model_.reset();
  {
    std::lock_guard lock(lora_mutex_);
    for (auto& a : lora_) a.weights.reset();
  }
  release_free_heap();
}

void Engine::check_awake() const {
  if (asleep()) throw std::logic_error("the engine is asleep: wake() it before running the model");
}

const Gemma4& Engine::model() const {
  check_awake();
  return *model_;
}

void Engine::wake() {
  if (!asleep()) return;
  load();
  load_adapters();
}

void Engine::check_prompt(const std::vector<int64_t>& ids, const std::vector<Media>& media) const {
  if (ids.empty()) throw ValueError("the prompt is empty: give at least one token id");
  const int64_t vocab = config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw ValueError("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (static_cast<int64_t>(ids.size()) > options_.context) {
    throw ValueError("the prompt has " + std::to_string(ids.size()) +
                     " tokens but the context holds " + std::to_string(options_.context));
  }
  if (static_cast<int64_t>(media.size()) > kMaxMediaItems) {
    throw ValueError("the prompt carries " + std::to_string(media.size()) +
                     " images and audio clips; at most " + std::to_string(kMaxMediaItems) +
                     " are allowed");
  }
  const auto& c = config();
  for (auto kind : {MediaKind::kImage, MediaKind::kAudio}) {
    const bool image = kind == MediaKind::kImage;
    const std::string name = media_kind_name(kind);
    int64_t items = 0, soft_tokens = 0, positions = 0;
    for (const auto& m : media) {
      if (m.kind != kind) continue;
      ++items;
      soft_tokens += m.soft_tokens;
    }
    if (items > 0) check_tower(kind);
    // An image the tower cannot take (more patches along a side than its position tables hold)
    // is the caller's error, found here rather than when the batch admits it.
    for (size_t i = 0; image && i < media.size(); ++i) {
      if (media[i].kind != kind) continue;
      try {
        VisionTower::check(*c.vision, media[i].pixels, media[i].positions);
      } catch (const c10::ValueError& e) {
        throw ValueError("media item " + std::to_string(i) + ": " + e.what_without_backtrace());
      }
    }
    const bool in_config = image ? c.vision.has_value() : c.audio.has_value();
    if (!in_config) continue;  // the token id may be an ordinary one of a text-only vocabulary
    const int64_t token = image ? c.image_token_id : c.audio_token_id;
    for (auto id : ids) positions += id == token;
    if (positions != soft_tokens) {
      throw ValueError("the prompt has " + std::to_string(positions) + " " + name +
                       " soft-token positions (token id " + std::to_string(token) + ") but its " +
                       std::to_string(items) + " " + name + " items fill " +
                       std::to_string(soft_tokens) +
                       " (expand placeholders with expand_media_placeholders)");
    }
  }
}

void Engine::check_tower(MediaKind kind) const {
  const bool image = kind == MediaKind::kImage;
  const std::string name = media_kind_name(kind);
  if (!(image ? config().vision.has_value() : config().audio.has_value())) {
    throw ValueError("the prompt carries " + name + " input but the checkpoint at " +
                     options_.model_dir + " has no " + name + " tower (config.json has no " +
                     (image ? "vision_config" : "audio_config") + ")");
  }
  if (!(image ? has_vision() : has_audio())) {
    throw ValueError("the prompt carries " + name +
                     " input but the engine was loaded without its " + name + " tower (" +
                     (image ? "no_vision" : "no_audio") + ")");
  }
}

ImageProcessorOptions Engine::image_options(int64_t max_soft_tokens) const {
  check_tower(MediaKind::kImage);
  return {config().vision->patch_size, config().vision->pooling_kernel_size, max_soft_tokens};
}

PromptMedia Engine::embed_media(const std::vector<int64_t>& prompt,
                                const std::vector<Media>& media) const {
  PromptMedia out;
  if (media.empty()) return out;
  check_awake();
  RECORD_USER_SCOPE("engine::embed_media");
  std::vector<at::Tensor> images, clips;
  int64_t image_rows = 0;
  for (const auto& m : media) {
    auto rows = m.kind == MediaKind::kImage ? vision_->embed(m.pixels, m.positions)
                                            : audio_->embed(m.features, m.mask);
    if (rows.size(0) != m.soft_tokens) {
      throw ValueError(std::string("an ") + media_kind_name(m.kind) + " item declares " +
                       std::to_string(m.soft_tokens) + " soft tokens but its tower made " +
                       std::to_string(rows.size(0)));
    }
    if (m.kind == MediaKind::kImage) {
      image_rows += rows.size(0);
      images.push_back(rows);
    } else {
      clips.push_back(rows);
    }
  }
  // Rows in prompt order: the n-th image position takes the n-th image row, likewise audio
  // (Gemma4Model.forward's masked_scatter of each kind).
  const auto& c = config();
  std::vector<int64_t> order;
  int64_t image = 0, clip = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    if (!images.empty() && prompt[p] == c.image_token_id) {
      order.push_back(image++);
    } else if (!clips.empty() && prompt[p] == c.audio_token_id) {
      order.push_back(image_rows + clip++);
    } else {
      continue;
    }
    out.positions.push_back(static_cast<int64_t>(p));
  }
  images.insert(images.end(), clips.begin(), clips.end());
  out.rows = at::cat(images).index_select(0, at::tensor(order, at::kLong).to(options_.device));
  return out;
}

at::Tensor Engine::logits(const std::vector<int64_t>& ids, const std::vector<Media>& media,
                          const std::optional<std::map<std::string, double>>& lora) {
  check_prompt(ids, media);
  const auto scales = lora_scales(lora);
  c10::InferenceMode inference;
  const auto n = static_cast<int64_t>(ids.size());
  auto positions = at::arange(n, at::TensorOptions().dtype(at::kLong)).view({1, n});
  const auto prompt_media = embed_media(ids, media);
  const auto soft = soft_tokens(prompt_media, 0, n, options_.device);
  return model_
      ->forward(id_tensor(ids, options_.device), positions.to(options_.device), nullptr,
                /*last_only=*/false, /*no_logits=*/false, soft ? &*soft : nullptr,
                /*lengths=*/{}, /*hidden=*/nullptr, lora_rows({&scales}))
      .squeeze(0);
}

std::vector<TokenLogprob> Engine::score(const std::vector<int64_t>& ids, int64_t top,
                                        const std::vector<Media>& media,
                                        const std::optional<std::map<std::string, double>>& lora) {
  check_prompt(ids, media);
  if (ids.size() < 2) {
    throw ValueError("scoring needs at least two token ids (each after the first is scored), got " +
                     std::to_string(ids.size()));
  }
  if (top < 0 || top > config().vocab_size) {
    throw ValueError("top must be in [0, " + std::to_string(config().vocab_size) + "], got " +
                     std::to_string(top));
  }
  const auto scales = lora_scales(lora);
  c10::InferenceMode inference;
  const auto prompt_media = embed_media(ids, media);
  std::vector<TokenLogprob> scores;
  scores.reserve(ids.size() - 1);
  empty_rings();
  read_prompt(ids, &prompt_media, /*hidden=*/nullptr, lora_rows({&scales}),
              [&](const at::Tensor& logits, int64_t first) {
                append_prompt_logprobs(logits, first, ids, top, scores);
              });
  return scores;
}

at::Tensor Engine::read_chunk(Rings& rings, const std::vector<int64_t>& prompt, int64_t begin,
                              int64_t end, const PromptMedia* media, at::Tensor* hidden,
                              const LoraRows& lora, const OnPromptLogits& prompt_logits) const {
  std::vector<int64_t> part(prompt.begin() + begin, prompt.begin() + end);
  const auto positions = at::arange(begin, end, at::TensorOptions().dtype(at::kLong))
                             .view({1, -1})
                             .to(options_.device);
  const bool final_chunk = end == static_cast<int64_t>(prompt.size());
  const auto soft = media ? soft_tokens(*media, begin, end, options_.device) : std::nullopt;
  const auto ids = id_tensor(part, options_.device);
  if (!prompt_logits) {
    auto logits = model().forward(ids, positions, &rings, /*last_only=*/true,
                                  /*no_logits=*/!final_chunk, soft ? &*soft : nullptr,
                                  /*lengths=*/{}, hidden, lora);
    return final_chunk ? logits.view({-1}) : logits;
  }
  // Every position goes through every layer; the head takes them kPromptLogitsChunk at a time.
  at::Tensor normed;
  model().forward(ids, positions, &rings, /*last_only=*/false,
                  /*no_logits=*/false, soft ? &*soft : nullptr, /*lengths=*/{}, &normed, lora,
                  /*head=*/false);
  const int64_t count = end - begin;
  normed = normed.view({count, -1});
  // The last position of the prompt scores no prompt token: its logits choose the first token.
  const int64_t scoring = final_chunk ? count - 1 : count;
  for (int64_t s = 0; s < scoring; s += kPromptLogitsChunk) {
    const int64_t n = std::min(kPromptLogitsChunk, scoring - s);
    prompt_logits(model().head(normed.narrow(0, s, n)), begin + s);
  }
  if (!final_chunk) return {};
  const auto last = normed.narrow(0, count - 1, 1).view({1, 1, -1});
  if (hidden) *hidden = last;
  return model().head(last).view({-1});
}

at::Tensor Engine::read_prompt(const std::vector<int64_t>& prompt, const PromptMedia* media,
                               at::Tensor* hidden, const LoraRows& lora,
                               const OnPromptLogits& prompt_logits) {
  const auto n = static_cast<int64_t>(prompt.size());
  at::Tensor last_logits;
  for (int64_t begin = 0; begin < n; begin += options_.prefill_chunk) {
    last_logits = read_chunk(rings_, prompt, begin, std::min(n, begin + options_.prefill_chunk),
                             media, hidden, lora, prompt_logits);
  }
  return last_logits;
}

at::Tensor Engine::draft(Rings& rings, const at::Tensor& tokens, const at::Tensor& hidden,
                         const std::vector<int64_t>& positions, int64_t count) const {
  check_awake();
  TORCH_CHECK(drafter_, "Engine::draft needs a draft model");
  RECORD_USER_SCOPE("engine::assistant");
  const auto B = static_cast<int64_t>(positions.size());
  // The rings as the model's own attention reads them: on the CPU only up to the last filled
  // slot (ModelOptions::attend_filled_slots), read once for every draft token.
  auto readable = [&](int64_t layer) {
    const Ring& ring = rings.for_layer(layer);
    return model_options_.attend_filled_slots ? filled_part(ring) : ring;
  };
  const Ring empty;
  const Ring sliding = draft_sliding_layer_ >= 0 ? readable(draft_sliding_layer_) : empty;
  const Ring full = draft_full_layer_ >= 0 ? readable(draft_full_layer_) : empty;
  const auto at = id_tensor(positions, options_.device).view({B, 1});
  auto token = tokens.view({B});
  auto carry = hidden;
  std::vector<at::Tensor> drafts;
  for (int64_t i = 0; i < count; ++i) {
    const auto x = at::cat({model_->embed(token).view({B, 1, -1}), carry}, -1);
    std::tie(token, carry) = drafter_->draft(x, at, sliding, full);
    drafts.push_back(token);
  }
  return at::stack(drafts, 1).to(at::kCPU);
}

std::vector<int64_t> Engine::draft_after(const std::vector<int64_t>& prompt, int64_t count) {
  check_prompt(prompt);
  if (!has_drafter()) {
    throw ValueError("drafts need a draft model (draft_model), and none is loaded");
  }
  if (count < 1) throw ValueError("count must be at least 1, got " + std::to_string(count));
  c10::InferenceMode inference;
  empty_rings();
  at::Tensor hidden;
  const auto scales = lora_scales({});
  const auto token =
      read_prompt(prompt, nullptr, &hidden, lora_rows({&scales}), {}).argmax().view({1});
  auto ids = host_ids(token.to(at::kCPU));
  const auto drafts = host_ids(
      draft(rings_, token, hidden, {static_cast<int64_t>(prompt.size())}, count));
  ids.insert(ids.end(), drafts.begin(), drafts.end());
  return ids;
}

void Engine::check_decode(const std::vector<int64_t>& prompt, const DecodeOptions& options,
                          const std::vector<Media>& media) const {
  check_prompt(prompt, media);
  if (options.max_new < 1) {
    throw ValueError("max_new must be at least 1, got " + std::to_string(options.max_new));
  }
  if (options.read_every < 1) {
    throw ValueError("read_every must be at least 1, got " + std::to_string(options.read_every));
  }
  if (options.constraint && options.ignore_eos) {
    throw ValueError(
        "ignore_eos cannot be combined with a constraint: the grammar decides where "
        "the output ends");
  }
  for (const int64_t point : options.reuse_points) {
    if (point < 1 || point >= static_cast<int64_t>(prompt.size())) {
      throw ValueError("reuse point " + std::to_string(point) +
                       " is outside the prompt's positions [1, " + std::to_string(prompt.size()) +
                       ")");
    }
  }
  for (size_t i = 0; i < options.stop_ids.size(); ++i) {
    const int64_t id = options.stop_ids[i];
    if (id < 0 || id >= config().vocab_size) {
      throw ValueError("stop id " + std::to_string(id) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(config().vocab_size) +
                       ")");
    }
  }
  if (const auto& budget = options.thinking_budget) {
    if (budget->tokens < 0) {
      throw ValueError("thinking_budget must be at least 0, got " +
                       std::to_string(budget->tokens));
    }
    auto check_id = [&](int64_t id, const std::string& what) {
      if (id < 0 || id >= config().vocab_size) {
        throw ValueError(what + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(config().vocab_size));
      }
    };
    for (const int64_t id : {budget->markers.open, budget->markers.close}) {
      check_id(id, "thinking_budget: marker id ");
    }
    for (const int64_t id : budget->message) {
      check_id(id, "thinking_budget message: token id ");
      // A marker in the message would open the block again or close it early: the budget's
      // count would restart forever or the message end cut.
      if (id == budget->markers.open || id == budget->markers.close) {
        throw ValueError("thinking_budget message holds the thinking block's marker " +
                         std::to_string(id) + ": it would " +
                         (id == budget->markers.open ? "open the block again" : "close it early"));
      }
    }
  }
  options.draft.validate();
  options.sampling.validate(config().vocab_size);
  if (options.lora) {
    std::lock_guard lock(lora_mutex_);
    check_lora(*options.lora);
  }
}

LoraScales Engine::lora_scales(const std::optional<std::map<std::string, double>>& asked) const {
  check_awake();
  std::lock_guard lock(lora_mutex_);
  LoraScales out;
  if (!asked) {
    for (const auto& a : lora_) {
      if (a.report.spec.scale != 0) out.push_back({a.weights, a.report.spec.scale});
    }
    return out;
  }
  check_lora(*asked);
  for (const auto& [name, scale] : *asked) {
    if (scale != 0) out.push_back({lora_[lora_named(name)].weights, scale});
  }
  return out;
}

int64_t default_draft_tokens(const std::string& draft_model) {
  return draft_model.empty() ? 0 : 3;
}

void Drafting::validate() const {
  if (tokens < 0) throw ValueError("draft_max must be at least 0, got " + std::to_string(tokens));
  // The bounds are checked with drafts off too: a server's requests may turn drafts on with them.
  if (ngram_min < 1 || ngram_max < ngram_min) {
    throw ValueError("draft_ngram_min must be at least 1 and draft_ngram_max at least "
                     "draft_ngram_min, got " + std::to_string(ngram_min) + " and " +
                     std::to_string(ngram_max));
  }
}

int64_t Engine::token_budget(int64_t prompt_tokens, int64_t max_new) const {
  // Positions past the context have no slot in the full rings: generation ends there.
  return std::min(max_new, options_.context - prompt_tokens + 1);
}

DecodeResult Engine::decode(const std::vector<int64_t>& prompt, const DecodeOptions& options,
                            const OnTokens& on_tokens, const OnLogits& on_logits) {
  return decode(prompt, {}, options, on_tokens, on_logits);
}

DecodeResult Engine::decode(const std::vector<int64_t>& prompt, const std::vector<Media>& media,
                            const DecodeOptions& options, const OnTokens& on_tokens,
                            const OnLogits& on_logits) {
  check_decode(prompt, options, media);
  // Each step's mask follows from every token before it, so a constrained request (or one with a
  // thinking budget) reads every token back to the host as it is sampled, whatever read_every
  // the caller chose; a draft is looked up in the tokens read so far.
  if ((options.constraint || options.thinking_budget || options.draft.tokens > 0) &&
      options.read_every != 1) {
    DecodeOptions every_token = options;
    every_token.read_every = 1;
    return decode(prompt, media, every_token, on_tokens, on_logits);
  }
  c10::InferenceMode inference;
  const auto n = static_cast<int64_t>(prompt.size());
  const int64_t budget = token_budget(n, options.max_new);

  // One row whose parameters hold for the whole decode: skipping the ops it does not need keeps
  // every step the same program on any device, and a greedy step is one argmax with nothing
  // going up from the host.
  Sampler sampler(/*rows=*/1, config().vocab_size, options_.device, /*fixed_shape=*/false);
  sampler.set(0, options.sampling, prompt);
  empty_rings();
  SequenceOutput output(options, config().eos_token_ids, prompt, on_tokens);
  auto sample = [&](const at::Tensor& logits) {
    if (on_logits) on_logits(logits);
    if (output.masked()) output.forbid(sampler.forbidden(0));
    return sampler.next(logits.view({1, -1})).view({1, 1});
  };
  const auto prompt_media = embed_media(prompt, media);
  // With an assistant: the final hidden state at the position that chose `token`.
  at::Tensor hidden;
  at::Tensor* keep_hidden = drafter_ && options.draft.tokens > 0 ? &hidden : nullptr;
  const auto scales = lora_scales(options.lora);
  const auto lora = lora_rows({&scales});
  auto token =
      sample(read_prompt(prompt, &prompt_media, keep_hidden, lora, options.prompt_logits));
  const auto on_device = at::TensorOptions().dtype(at::kLong).device(options_.device);
  auto position = at::full({1, 1}, n, on_device);
  // Tokens not yet read wait in a device buffer, one slot per step of the read window. The slot
  // index lives on the device too, so every step runs the same ops with the same shapes and
  // constants (none depends on the request), and the step that ends a window differs from the
  // others only by the one device->host copy: one step program on a compiling device.
  auto window = at::empty({options.read_every}, on_device);
  auto slot = at::zeros({1}, on_device);
  int64_t pending = 0;
  auto keep = [&] {
    window.index_copy_(0, slot, token.view({1}));
    slot = at::remainder(slot + 1, options.read_every);
    ++pending;
  };
  auto take = [&](const at::Tensor& host, int64_t count) {
    return output.take(host.data_ptr<int64_t>(), count);
  };

  // Every window of read_every steps is read whole: a view of part of it would be one more op.
  auto read_window = [&] { return take(window.to(at::kCPU), std::exchange(pending, 0)); };
  // The first token is read at once so read_s measures the prompt alone.
  bool go_on = take(token.view({1}).to(at::kCPU), 1);
  const int64_t draft_room = torchtpu::draft_room(options.draft, rings_, options_.device);
  int64_t draft_length = draft_room;
  int64_t drafted = 0, accepted = 0;
  // One pass over the fed token and a draft after it, sampled position by position as steps
  // would be, while the draft agrees. Returns the tokens taken; the rings keep what those
  // positions wrote and get back what the rejected ones overwrote.
  auto check_draft = [&](int64_t step, const std::vector<int64_t>& draft) {
    RECORD_USER_SCOPE("engine::draft");
    const int64_t p = n + step - 1;  // the fed token's position
    const auto count = static_cast<int64_t>(draft.size());
    std::vector<int64_t> ids{output.result().tokens.back()};
    ids.insert(ids.end(), draft.begin(), draft.end());
    const auto saved = rings_.save(p + 1, p + 1 + count);
    const auto positions = at::arange(p, p + 1 + count, on_device).view({1, -1});
    const auto logits = model()
                            .forward(id_tensor(ids, options_.device), positions, &rings_,
                                     /*last_only=*/false, /*no_logits=*/false, /*soft=*/nullptr,
                                     /*lengths=*/{}, keep_hidden, lora)
                            .view({count + 1, -1});
    int64_t kept = 0;
    for (int64_t i = 0; i <= count; ++i) {
      token = sample(logits[i]);
      const auto id = token.item<int64_t>();
      go_on = output.take(&id, 1);
      if (!go_on || i == count || id != draft[i]) break;
      ++kept;
    }
    drafted += count;
    accepted += kept;
    if (keep_hidden) hidden = hidden.narrow(1, kept, 1);
    rings_.restore(saved, p + 1 + kept);
    position = at::full({1, 1}, p + 1 + kept, on_device);
    return kept + 1;
  };
  DraftGate gate;
  for (int64_t step = 1; go_on && step < budget;) {
    const auto start = std::chrono::steady_clock::now();
    auto seconds = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    // As in a Batch: the gate is asked before the assistant's drafts are made, after prompt
    // lookup's are found.
    const bool assistant = drafter_ != nullptr;
    if (draft_room > 0 && (!assistant || options.draft.always || gate.draft(1))) {
      const int64_t limit = std::min(draft_length, budget - step - 1);
      const auto draft =
          !assistant  ? lookup_draft(prompt, output.result().tokens, options.draft, limit)
          : limit > 0 ? host_ids(this->draft(rings_, token, hidden, {n + step - 1}, limit))
                      : std::vector<int64_t>();
      if (!draft.empty() && (assistant || options.draft.always || gate.draft(1))) {
        const int64_t taken = check_draft(step, draft);
        gate.record(1, /*drafted=*/true, taken, seconds());
        step += taken;
        draft_length = next_draft_length(draft_length, draft_room,
                                         taken == static_cast<int64_t>(draft.size()) + 1);
        continue;
      }
    }
    const auto logits = model()
                            .forward(token, position, &rings_, /*last_only=*/false,
                                     /*no_logits=*/false, /*soft=*/nullptr, /*lengths=*/{},
                                     keep_hidden, lora)
                            .view({-1});
    {
      RECORD_USER_SCOPE("engine::sample");
      token = sample(logits);
    }
    position = position + 1;
    keep();
    if (pending == options.read_every) go_on = read_window();
    if (draft_room > 0) gate.record(1, /*drafted=*/false, 1, seconds());
    ++step;
  }
  if (go_on && pending > 0) go_on = read_window();
  auto result = output.done("length");
  result.drafted = drafted;
  result.accepted = accepted;
  return result;
}

}  // namespace torchtpu
