#include "cli/engine_flags.h"

#include "hub/hub.h"
#include "server/server.h"

namespace torchtpu::cli {

void add_engine_settings(CLI::App& cmd, EngineSettings& settings) {
  cmd.add_option("--device", settings.device,
                 "cpu | cuda[:N] | a loaded backend's name (--device-library)")
      ->capture_default_str();
  cmd.add_option("--dtype", settings.dtype, "Compute dtype: bfloat16 | float32 | float16")
      ->capture_default_str();
  cmd.add_option("--context", settings.context, "Context length (full-ring slots)")
      ->capture_default_str();
  cmd.add_option("--threads", settings.threads,
                 "Intra-op threads (0: OMP_NUM_THREADS, else the physical cores)")
      ->capture_default_str();
  cmd.add_option("--int4", settings.int4,
                 "How int4 weights are held: auto (packed on the CPU, dequantized elsewhere) | "
                 "packed | composite | dequantized")
      ->capture_default_str();
  cmd.add_option("--quantize", settings.quantize,
                 "int4: quantize a dense checkpoint's linears and head at load (group 32) | none")
      ->capture_default_str();
  cmd.add_option("--int4-activation-bits", settings.int4_activation_bits,
                 "Bits of the activations the CPU int4 kernel multiplies: 16 | 8 (half the work "
                 "for several rows at once, llama.cpp's Q8_0 numerics)")
      ->capture_default_str();
  cmd.add_flag("--no-vision", settings.no_vision,
               "Do not load the checkpoint's image tower (images are then refused)");
  cmd.add_flag("--no-audio", settings.no_audio,
               "Do not load the checkpoint's audio tower (audio is then refused)");
  cmd.add_option("--draft-model", settings.draft_model,
                 "Directory of the model's Gemma 4 assistant (model_type gemma4_assistant): "
                 "drafts come from it (multi-token prediction) instead of prompt lookup, 3 a "
                 "step unless --draft-max says otherwise");
  cmd.add_option("--lora", settings.lora,
                 "[NAME=]DIR: a LoRA adapter in PEFT's format (adapter_config.json, "
                 "adapter_model.safetensors) applied at scale 1; repeat for several. NAME (DIR's "
                 "last part when not given) is what requests call it");
  cmd.add_flag("--lora-init-without-apply", settings.lora_init_without_apply,
               "Load the --lora adapters at scale 0: only requests that ask for one apply it");
  cmd.add_option("--max-loras", settings.max_lora,
                 "The most LoRA adapters loaded at once, --lora's and those loaded at run time")
      ->capture_default_str();
}

CLI::Option* add_draft_flags(CLI::App& cmd, Drafting& draft) {
  auto* draft_max = cmd.add_option("--draft-max", draft.tokens,
                 "Speculative decoding: tokens drafted per step at most, from the assistant "
                 "(--draft-model; 3 when not given) or else from what followed the last tokens "
                 "earlier in the sequence (prompt lookup; 0: off)")
      ->capture_default_str();
  cmd.add_option("--draft-ngram-min", draft.ngram_min,
                 "Shortest run of last tokens a draft is looked up by")
      ->capture_default_str();
  cmd.add_option("--draft-ngram-max", draft.ngram_max, "Longest run, tried first")
      ->capture_default_str();
  cmd.add_flag("--draft-always", draft.always,
               "Check every draft found, even while drafts give tokens slower than plain steps "
               "(by default they are checked only while they give them faster)");
  return draft_max;
}

void EngineFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--model", model, "Checkpoint directory or Hub id (org/name[@rev])")->required();
  cmd.add_option("--emb4", emb4, "Directory or Hub id with int4 vocabulary tables");
  cmd.add_option("--chunk", chunk, "Prompt tokens read per forward pass")->capture_default_str();
  add_engine_settings(cmd, settings);
}

EngineOptions EngineFlags::options() const {
  EngineSettings given = settings;
  given.emb4_dir = emb4;
  EngineOptions o = given.options(model);
  o.prefill_chunk = chunk;
  return server::resolve_hub_ids(std::move(o), hub::Options::from_env());
}

}  // namespace torchtpu::cli
