#include "engine/report.h"

namespace torchtpu {

nlohmann::json engine_report(const Engine& engine) {
  const auto layout = engine.layout();
  nlohmann::json storage = nlohmann::json::array();
  for (const auto& s : engine.storage()) {
    storage.push_back(
        {{"family", s.family}, {"format", s.format}, {"where", s.where}, {"bytes", s.bytes}});
  }
  return {{"layout",
           {{"full_rings", layout.full_rings},
            {"sliding_rings", layout.sliding_rings},
            {"shared_layers", layout.shared_layers},
            {"context", layout.context}}},
          {"storage", storage},
          {"device", engine.options().device.str()},
          {"dtype", dtype_name(engine.options().dtype)},
          {"threads", engine.options().threads},
          {"int4",
           {{"weights", int4_weights_name(engine.model_options().int4)},
            {"quantized_at_load", engine.model_options().quantize_int4},
            {"activation_bits", engine.model_options().int4_activation_bits},
            {"cpu_kernel", ops::int4_cpu_isa()}}},
          {"load_s", engine.load_seconds()}};
}

}  // namespace torchtpu
