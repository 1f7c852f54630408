#include "cli/engine_flags.h"

#include "hub/hub.h"

namespace torchtpu::cli {

void EngineFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--model", model, "Checkpoint directory or Hub id (org/name[@rev])")->required();
  cmd.add_option("--emb4", emb4, "Directory or Hub id with int4 vocabulary tables");
  cmd.add_option("--dtype", dtype, "Compute dtype: bfloat16 | float32 | float16");
  cmd.add_option("--device", device, "cpu | cuda[:N] | a loaded backend's name (--device-library)");
  cmd.add_option("--context", context, "Context length (full-ring slots)");
  cmd.add_option("--chunk", chunk, "Prompt tokens read per forward pass");
  cmd.add_option("--int4", int4,
                 "How int4 weights are held: auto (packed on the CPU, dequantized elsewhere) | "
                 "packed | composite | dequantized");
  cmd.add_option("--quantize", quantize,
                 "int4: quantize a dense checkpoint's linears and head at load (group 32) | none");
  cmd.add_option("--int4-activation-bits", int4_activation_bits,
                 "Bits of the activations the CPU int4 kernel multiplies: 16 | 8 (half the work for "
                 "several rows at once, llama.cpp's Q8_0 numerics)");
  cmd.add_option("--threads", threads, "Intra-op threads (0: OMP_NUM_THREADS, else the physical cores)");
  cmd.add_flag("--no-vision", no_vision, "Do not load the checkpoint's image tower");
  cmd.add_flag("--no-audio", no_audio, "Do not load the checkpoint's audio tower");
}

EngineOptions EngineFlags::options() const {
  const auto hub = hub::Options::from_env();
  EngineOptions o;
  o.model_dir = hub::resolve_model(model, hub);
  o.emb4_dir = emb4.empty() ? "" : hub::resolve_model(emb4, hub);
  o.device = parse_device(device);
  o.dtype = parse_dtype_name(dtype);
  o.context = context;
  o.prefill_chunk = chunk;
  o.int4 = parse_int4_weights(int4);
  o.quantize_int4 = parse_quantize(quantize);
  o.int4_activation_bits = int4_activation_bits;
  o.threads = threads;
  o.no_vision = no_vision;
  o.no_audio = no_audio;
  return o;
}

}  // namespace torchtpu::cli
