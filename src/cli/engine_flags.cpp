#include "cli/engine_flags.h"

#include "hub/hub.h"

namespace torchtpu::cli {

void EngineFlags::add_to(CLI::App& cmd) {
  cmd.add_option("--model", model, "Checkpoint directory or Hub id (org/name[@rev])")->required();
  cmd.add_option("--emb4", emb4, "Directory or Hub id with int4 vocabulary tables");
  cmd.add_option("--dtype", dtype, "Compute dtype: bfloat16 | float32 | float16");
  cmd.add_option("--device", device, "cpu | cuda[:N]");
  cmd.add_option("--context", context, "Context length (full-ring slots)");
  cmd.add_option("--chunk", chunk, "Prompt tokens read per forward pass");
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
  return o;
}

}  // namespace torchtpu::cli
