// The engine: one model, its rings, and the decode loop (read the prompt in chunks, then one token
// per step, tokens read back to the host every `read_every` steps). One owner thread uses it
// (DESIGN principle 4); nothing here knows about HTTP, Python or threads.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "engine/logprobs.h"
#include "engine/media.h"
#include "grammar/constraint.h"
#include "model/audio.h"
#include "model/gemma4.h"
#include "model/rings.h"
#include "model/sampling.h"
#include "model/vision.h"

namespace torchtpu {

// A LoRA adapter to load beside the weights (model/lora.h): its name (how requests and reports
// call it), its directory, and the scale a sequence gives it when its DecodeOptions::lora is empty
// (llama-server's --lora-scaled; 0 loads it for the requests that ask for it).
struct LoraSpec {
  std::string name;
  std::string dir;
  double scale = 1.0;
};
// "[NAME=]DIR" (the --lora flag) -> a spec of scale 1; NAME defaults to DIR's last component.
// ValueError for an empty NAME or DIR.
LoraSpec parse_lora_spec(const std::string& text);

// A loaded adapter as reports show it (generate --json, /v1/engine, /lora-adapters, Python).
struct LoraReport {
  LoraSpec spec;
  LoraConfig config;                 // its adapter_config.json
  std::vector<std::string> targets;  // the modules it adapts ("self_attn.q_proj", ...)
};

// The context a server, CLI or Python engine gets when none is named: room for a coding agent's
// first request (Claude Code's is about 18,000 tokens, docs/API.md) at about 199 MiB of KV cache
// per row for E2B in bf16 (3 full rings of 2 KiB per position, and the sliding rings' window).
inline constexpr int64_t kDefaultContext = 32768;

struct EngineOptions {
  std::string model_dir;
  std::string emb4_dir;
  at::Device device = at::kCPU;
  at::ScalarType dtype = at::kBFloat16;
  int64_t context = kDefaultContext;
  int64_t prefill_chunk = 512;  // prompt tokens read per forward pass
  Int4Weights int4 = Int4Weights::kAuto;
  bool quantize_int4 = false;  // ModelOptions::quantize_int4
  int64_t int4_activation_bits = 16;  // ModelOptions::int4_activation_bits: 16 or 8
  int64_t threads = 0;         // intra-op threads; 0: default_threads()
  // Leave the checkpoint's image / audio tower unloaded (less memory; prompts with such media
  // are then refused).
  bool no_vision = false;
  bool no_audio = false;
  // A Gemma 4 assistant's checkpoint (model_type "gemma4_assistant", the target's
  // multi-token-prediction drafter, llama.cpp's --model-draft): when given, drafts come from it
  // instead of from prompt lookup (Drafting), for requests that draft.
  std::string draft_model;
  // LoRA adapters loaded at construction; names unique. load_lora and unload_lora change the set
  // after.
  std::vector<LoraSpec> lora;
  // The most adapters loaded at once (the lora-affinity scorer's max_lora).
  int64_t max_lora = 8;
};

// "auto", "packed", "composite", "dequantized" -> Int4Weights; ValueError otherwise.
Int4Weights parse_int4_weights(const std::string& name);
std::string int4_weights_name(Int4Weights mode);
// "int4" -> true, "none" -> false (the --quantize flag); ValueError otherwise.
bool parse_quantize(const std::string& name);
// Physical cores of this machine (hyperthread siblings counted once), at least 1.
int64_t physical_cores();
// The intra-op threads when none are asked for: OMP_NUM_THREADS when it is a positive count
// (OpenMP's list form "4,2" gives its first), as libtorch itself honours it, so a host that shares
// the machine (a test runner, a container) can say so once; otherwise physical_cores().
int64_t default_threads();

// "cpu", "cuda:0", "tpu" (after torch_tpu registered it) -> a device; ValueError otherwise.
at::Device parse_device(const std::string& name);
// ValueError (naming `name`) unless the engine can hold weights on `device`: not a placeholder
// (meta, lazy), a type this torch has a backend for, the one CPU, a CUDA device this machine has.
void check_device(const at::Device& device, const std::string& name);
// "bfloat16"/"bf16", "float32"/"f32", "float16"/"f16" -> a dtype; ValueError otherwise.
at::ScalarType parse_dtype_name(const std::string& name);
std::string dtype_name(at::ScalarType dtype);

// The engine's settings as a front end takes them, by name (the CLI's and the server's flags,
// torchtpu_cpp.serve's arguments): one place turns them into EngineOptions, so that every front
// end checks and maps them alike.
struct EngineSettings {
  std::string emb4_dir;
  std::string device = "cpu";
  std::string dtype = "bfloat16";
  std::string int4 = "auto";      // auto | packed | composite | dequantized
  std::string quantize = "none";  // int4: quantize a dense checkpoint at load
  int64_t context = kDefaultContext;
  int64_t threads = 0;
  int64_t int4_activation_bits = 16;
  bool no_vision = false;
  bool no_audio = false;
  std::string draft_model;
  std::vector<std::string> lora;  // "[NAME=]DIR" each (parse_lora_spec)
  // Load the adapters at scale 0 (llama-server's --lora-init-without-apply): only requests that
  // name one apply it.
  bool lora_init_without_apply = false;
  int64_t max_lora = 8;

  // For the checkpoint in model_dir; the parse_* functions' ValueErrors for a bad name.
  EngineOptions options(const std::string& model_dir) const;
};

// A cap on a thinking block (llama.cpp's reasoning budget, vLLM's thinking token budget): once
// `tokens` tokens have followed the block's opening marker, in the prompt or the output, every
// token but the closing marker is masked, so the model closes the block and goes on to answer.
// A block opened again is counted again.
struct ThinkingBudget {
  int64_t tokens = 0;
  ThinkingMarkers markers;
  // Forced one by one once the budget is spent, before the closing marker (llama.cpp's
  // --reasoning-budget-message): the thought ends on words of the caller's choosing, such as
  // "time to answer", rather than mid-sentence. Holds neither marker.
  std::vector<int64_t> message;
};

// Speculative decoding by prompt lookup (vLLM's ngram method, llama.cpp's ngram speculation): each
// step looks for the last few tokens of the sequence earlier in it (prompt or output), takes the
// tokens that followed there as a draft, and checks the draft in one forward pass with the step's
// own token. With an assistant loaded (EngineOptions::draft_model) the draft is the assistant's
// instead (multi-token prediction, Engine::draft), and the n-gram bounds go unused. Each
// position's token is sampled as a plain step would sample it, in order, and the draft is kept up
// to its first disagreement, that position's token included; so the output is the tokens decoding
// without a draft gives (up to the float rounding of a pass over several tokens),
// greedy or sampled with a seed, constrained or budgeted. Pays where the output repeats its input
// (edits, code, quotes, extraction); a rejected draft costs the extra positions of its pass.
struct Drafting {
  int64_t tokens = 0;     // drafted per step at most (draft_max); 0: off
  int64_t ngram_min = 2;  // the shortest run of last tokens looked up
  int64_t ngram_max = 4;  // the longest, tried first
  // Check every draft found, whatever it costs; else only while drafts give tokens faster than
  // steps do (DraftGate in engine/draft.h).
  bool always = false;

  // ValueError naming draft_max, draft_ngram_min or draft_ngram_max.
  void validate() const;
};

// The draft tokens per step a front end (serve, generate, torchtpu_cpp.serve) checks when its user
// gives no count (--draft-max absent): with an assistant (`draft_model` not empty) 3, since its
// drafts cost passes of their own and 2-3 a pass pay soonest on the CPU (docs/BENCHMARKS.md,
// "Drafts from an assistant"), as llama-server drafts once given a draft model; else 0, prompt
// lookup being asked for.
int64_t default_draft_tokens(const std::string& draft_model);

// Sees the float32 logits [count, vocab] of prompt positions [first, first + count), row j scoring
// the prompt's token first + j + 1 (the prompt's own logprobs: vLLM's prompt_logprobs, OpenAI's
// echo with logprobs).
using OnPromptLogits = std::function<void(const at::Tensor& logits, int64_t first)>;

// The logits of a prompt (DecodeOptions::prompt_logits) come this many positions at a time:
// E2B's take 64 MiB at f32.
constexpr int64_t kPromptLogitsChunk = 64;

struct DecodeOptions {
  int64_t max_new = 64;
  std::vector<int64_t> stop_ids;  // empty: the checkpoint's eos ids
  int64_t read_every = 1;         // steps between host reads (1 streams)
  bool ignore_eos = false;        // decode exactly max_new tokens
  SamplingParams sampling;        // greedy by default
  // Grammar the output must follow: each step's logits are masked to the tokens it allows before
  // sampling, and every sampled token is committed to it (so decoding reads every token back:
  // read_every is taken as 1). Single-use: the constraint advances through one decode.
  std::shared_ptr<Constraint> constraint;
  // Reads every token back too, as a constraint does.
  std::optional<ThinkingBudget> thinking_budget;
  // Speculative decoding by prompt lookup, in Engine::decode and in a Batch; reads every token
  // back too.
  Drafting draft;
  // A Batch's prefix cache shares states only between sequences of the same salt
  // (prefix_cache_key); "": those without one. Engine::decode keeps no cache.
  std::string cache_salt;
  // Prompt positions in [1, prompt size) where a Batch's prefix cache saves the state as well as
  // at its block ends and the prompt's end: where the prompt's turns begin, so that a prompt that
  // parts from this one there (another conversation after the same system prompt and tools, an
  // edited last message) starts from it rather than from the block end before it.
  std::vector<int64_t> reuse_points;
  // The Batch row this sequence runs in (llama-server's id_slot: a client that saves or restores
  // a slot's state names the row its conversation used); it waits for that row while others take
  // the rest. -1: the first free row. Engine::decode has one row and ignores it.
  int64_t row = -1;
  // The LoRA adapters this sequence applies, by name, at these scales (those not named: 0);
  // none: each loaded adapter at its own scale (LoraSpec::scale). Resolved when the sequence
  // starts (Engine::lora_scales).
  std::optional<std::map<std::string, double>> lora;
  // Given, sees the logits of every prompt position but the last (whose logits choose the first
  // token), in order, at most kPromptLogitsChunk positions a call, before the first token: the
  // prompt is then read whole, nothing restored from a prefix cache, since a restored position
  // has no logits. Nothing else about the decode changes.
  OnPromptLogits prompt_logits;
};

struct DecodeResult {
  std::vector<int64_t> tokens;  // generated ids, the stop id excluded
  std::string finish;           // "stop" | "length" | "cancelled"
  std::optional<int64_t> stop_id;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens a prefix cache gave instead of reading them
  // Draft tokens checked by the model, and those it kept (speculative decoding).
  int64_t drafted = 0;
  int64_t accepted = 0;
  double read_s = 0;          // reading the prompt, until the first token is known on the host
  double decode_s = 0;        // the remaining steps
};

// A prompt's soft tokens, ready for its chunks: the towers' rows for every media position, in
// prompt order.
struct PromptMedia {
  std::vector<int64_t> positions;  // ascending prompt positions of soft tokens
  at::Tensor rows;                 // [positions.size(), hidden_size] on the engine's device
};

// Called with each batch of new tokens as they reach the host; returning false cancels.
using OnTokens = std::function<bool(const std::vector<int64_t>&)>;
// Sees the float32 logits [vocab] each generated token was chosen from (tests, dumps).
using OnLogits = std::function<void(const at::Tensor&)>;

class Engine {
 public:
  explicit Engine(const EngineOptions& options);

  // These answer from any thread, asleep or awake: they are fixed at construction (options()'s
  // lora: the adapters loaded then).
  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  Layout layout() const { return layout_; }
  // ValueError saying what `rows` rows of rings at this engine's context and dtype need, when
  // that is more than 90% of the memory available now (checked on the CPU).
  void check_rings_fit(int64_t rows) const;
  // Rings of `rows` rows at this engine's context, dtype and device: check_rings_fit's error, or
  // the same message when the device cannot allocate them.
  Rings make_rings(int64_t rows) const;
  // Any thread: the weights' storage, the adapters loaded now included.
  std::vector<StorageReport> storage() const;
  // Any thread: the LoRA adapters loaded now, in the order they were loaded (a request's lora
  // ids count in this order), each with its scale for sequences that name none.
  std::vector<LoraReport> adapters() const;
  // The model's options as resolved (the int4 form chosen for kAuto).
  const ModelOptions& model_options() const { return model_options_; }
  // Whether images / audio clips can be given (the checkpoint has the tower and it is loaded).
  bool has_vision() const { return config_.vision && !options_.no_vision; }
  bool has_audio() const { return config_.audio && !options_.no_audio; }

  // The last load of the weights (the constructor's, or wake's).
  double load_seconds() const { return load_s_; }
  // The weights' identity as 16 hex digits: Checkpoint::fingerprint of the model and of the int4
  // tables when given. A prefix state file names it, and only an engine with the same weights
  // reads the file back (the rings' dtype and shapes are checked on their own). Computed at the
  // first call, not at load: it touches a page or two of every tensor, seconds on a cold disk,
  // which only an engine that saves or restores states should pay.
  const std::string& weights_id() const;
  // Frees the rings of the engine's own decodes (a warm-up's); the next such decode makes them
  // again. A Batch holds rings of its own, so a server frees these before it makes one. Owner
  // thread.
  void release_rings() { rings_ = Rings(); }
  // Frees the weights, the towers and the rings, giving their memory back (a server idle for a
  // while: llama.cpp's --sleep-idle-seconds); the configuration and checks above still answer.
  // Until wake(), nothing that runs the model may be called. Owner thread.
  void sleep();
  // Loads the weights again as the constructor did; nothing when awake. Owner thread.
  void wake();
  bool asleep() const { return model_ == nullptr; }
  // Owner thread. Loads an adapter beside the weights (while asleep: checks its files, and
  // loads it at the wake). ValueError for a name already loaded, an empty name, a scale that is
  // not finite or more than max_lora adapters; the adapter's FormatErrors. Nothing changes then.
  void load_lora(const LoraSpec& spec);
  // Owner thread. Later sequences cannot name it; one that applies it already keeps it until it
  // ends (LoraScales holds it). ValueError naming the adapters loaded when none is called so.
  void unload_lora(const std::string& name);
  // Any thread. Each adapter's scale for later sequences that name none: those in `scales` at
  // theirs, the rest at 0 (llama-server's POST /lora-adapters). ValueError, and nothing changed,
  // for a name not loaded or a scale that is not finite.
  void set_lora_scales(const std::map<std::string, double>& scales);
  // ValueError unless media of this kind can be given, naming the missing tower or the option
  // that disabled it.
  void check_tower(MediaKind kind) const;
  // The checkpoint's image processor settings for a soft-token budget (check_tower's errors).
  ImageProcessorOptions image_options(int64_t max_soft_tokens = 280) const;
  const AudioFeatureOptions& audio_options() const { return audio_options_; }

  // float32 logits [ids.size(), vocab] of one causal pass with no cache; the rings are untouched.
  // `media`: the prompt's images and clips (ids already expanded, expand_media_placeholders).
  // `lora`: as DecodeOptions::lora.
  at::Tensor logits(const std::vector<int64_t>& ids, const std::vector<Media>& media = {},
                    const std::optional<std::map<std::string, double>>& lora = std::nullopt);

  // Every token of `ids` after the first, scored under the positions before it: ids.size() - 1
  // ranked entries in order (append_prompt_logprobs, each with its `top` likeliest tokens), a
  // prompt's logprobs or its perplexity. The prompt is read into freshly reset rings
  // kPromptLogitsChunk positions through the head at a time, so no [ids, vocab] tensor is held
  // (logits() holds them all: 4 GB of f32 for 4,000 E2B tokens), and nothing is generated.
  // check_prompt's and lora_scales' errors; ValueError for fewer than two ids or `top` outside
  // [0, vocab].
  std::vector<TokenLogprob> score(const std::vector<int64_t>& ids, int64_t top = 0,
                                  const std::vector<Media>& media = {},
                                  const std::optional<std::map<std::string, double>>& lora =
                                      std::nullopt);

  // Reads the prompt into freshly reset rings and decodes (greedy or sampled, per options).
  DecodeResult decode(const std::vector<int64_t>& prompt, const DecodeOptions& options,
                      const OnTokens& on_tokens = {}, const OnLogits& on_logits = {});
  // The same for a prompt whose expanded placeholders take `media`'s soft tokens.
  DecodeResult decode(const std::vector<int64_t>& prompt, const std::vector<Media>& media,
                      const DecodeOptions& options, const OnTokens& on_tokens = {},
                      const OnLogits& on_logits = {});

  // The checks decode and logits apply to caller input (ValueError naming the value and limit);
  // with media: a tower for each kind given, and as many soft-token positions of each kind as
  // its items fill.
  void check_prompt(const std::vector<int64_t>& ids, const std::vector<Media>& media = {}) const;
  // check_prompt plus the decode options' own checks (ValueError).
  void check_decode(const std::vector<int64_t>& prompt, const DecodeOptions& options,
                    const std::vector<Media>& media = {}) const;
  // Runs the towers over a checked prompt's media (on the engine's device).
  PromptMedia embed_media(const std::vector<int64_t>& prompt,
                          const std::vector<Media>& media) const;
  // A sequence's adapters for DecodeOptions::lora `asked`, holding them (owner thread).
  // ValueError naming an adapter that is not loaded, or a scale that is not finite.
  LoraScales lora_scales(const std::optional<std::map<std::string, double>>& asked) const;
  // Tokens a sequence after a prompt of `prompt_tokens` may generate: max_new, or fewer where the
  // context ends first.
  int64_t token_budget(int64_t prompt_tokens, int64_t max_new) const;

  // The model, for whoever drives its forward pass with rings of their own (Batch).
  const Gemma4& model() const;
  // Whether drafts come from an assistant (EngineOptions::draft_model).
  bool has_drafter() const { return !options_.draft_model.empty(); }
  // The assistant's drafts, `count` for each row of `rings`: row b's last token tokens[b] ([B]
  // int64 on the device) sits at positions[b], not yet in the rings, which hold the positions
  // before it; hidden[b] ([B, 1, hidden_size]) is the model's final hidden state (Gemma4::forward)
  // at the position that chose it. Each draft token is the assistant's greedy guess after the one
  // before (transformers' Gemma4AssistantCandidateGenerator). Returns [B, count] int64 on the
  // host. Needs has_drafter().
  at::Tensor draft(Rings& rings, const at::Tensor& tokens, const at::Tensor& hidden,
                   const std::vector<int64_t>& positions, int64_t count) const;
  // What the assistant guesses after a prompt: reads it into fresh rings and returns the model's
  // greedy next token followed by `count` draft tokens after it (what a decode's first drafting
  // pass would check), to compare with other implementations or measure how often the drafts
  // are the tokens decoding gives. check_prompt's errors; ValueError without a draft model or
  // for a count below 1.
  std::vector<int64_t> draft_after(const std::vector<int64_t>& prompt, int64_t count);
  // Reads prompt[begin, end) into `rings` (one row) after the positions before `begin`; returns
  // the float32 logits [vocab] of its last token when `end` is the prompt's end, else undefined.
  // `media`: the prompt's soft tokens (nullptr or empty: none).
  // `hidden`: the final hidden state [1, 1, hidden_size] there too (Gemma4::forward's).
  // `lora`: forward's, for the one row.
  // `prompt_logits`: given, sees the logits of the chunk's positions that score a prompt token
  // (DecodeOptions::prompt_logits), every position then going through every layer.
  at::Tensor read_chunk(Rings& rings, const std::vector<int64_t>& prompt, int64_t begin,
                        int64_t end, const PromptMedia* media = nullptr,
                        at::Tensor* hidden = nullptr, const LoraRows& lora = {},
                        const OnPromptLogits& prompt_logits = {}) const;

 private:
  // check_rings_fit's error, with what the rings are measured against.
  ValueError rings_too_big(int64_t rows, const std::string& have) const;
  // The rings of this engine's own decodes, emptied; made at the first, so that an engine whose
  // sequences all decode in a Batch's rings (a server's) never holds them.
  Rings& empty_rings();
  // In chunks, into rings_.
  at::Tensor read_prompt(const std::vector<int64_t>& prompt, const PromptMedia* media,
                         at::Tensor* hidden, const LoraRows& lora,
                         const OnPromptLogits& prompt_logits);
  // The weights, towers and rings from options_.
  void load();
  // The weights of every adapter in lora_, from their directories.
  void load_adapters();
  // The index in lora_ of the adapter called `name` (the caller holds lora_mutex_); ValueError
  // naming those loaded when none is.
  size_t lora_named(const std::string& name) const;
  // lora_named's and check_lora_scale's errors for scales by name (the caller holds
  // lora_mutex_).
  void check_lora(const std::map<std::string, double>& scales) const;
  // The assistant of options_.draft_model, checked against the model (ValueError).
  void load_drafter();
  // std::logic_error while asleep.
  void check_awake() const;

  EngineOptions options_;
  ModelConfig config_;
  ModelOptions model_options_;
  std::vector<StorageReport> storage_;
  Layout layout_;
  std::unique_ptr<Gemma4> model_;
  std::unique_ptr<Gemma4> drafter_;  // the assistant, with options_.draft_model
  // The target's layers whose rings the assistant's sliding and full layers read: the last
  // non-shared layer of each type (the K/V transformers hands it as shared_kv_states).
  int64_t draft_sliding_layer_ = -1, draft_full_layer_ = -1;
  std::unique_ptr<VisionTower> vision_;
  std::unique_ptr<AudioTower> audio_;
  AudioFeatureOptions audio_options_;
  Rings rings_;
  // Written by load(), again on each wake(), while any thread may read it (the server's
  // /v1/engine).
  std::atomic<double> load_s_ = 0;
  struct LoadedLora {
    LoraReport report;
    int64_t nbytes = 0;
    std::shared_ptr<const LoraAdapter> weights;  // none while asleep
  };
  // Read by any thread (adapters(), storage(), set_lora_scales) under lora_mutex_; the owner
  // thread alone adds and removes adapters.
  mutable std::mutex lora_mutex_;
  std::vector<LoadedLora> lora_;
  mutable std::once_flag weights_id_once_;
  mutable std::string weights_id_;
};

}  // namespace torchtpu
