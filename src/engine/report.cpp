#include "engine/report.h"

namespace torchtpu {

nlohmann::json layout_report(const Layout& layout) {
  return {{"full_rings", layout.full_rings},
          {"sliding_rings", layout.sliding_rings},
          {"shared_layers", layout.shared_layers},
          {"context", layout.context},
          {"row_bytes", layout.row_bytes}};
}

nlohmann::json engine_report(const Engine& engine) {
  nlohmann::json storage = nlohmann::json::array();
  for (const auto& s : engine.storage()) {
    storage.push_back(
        {{"family", s.family}, {"format", s.format}, {"where", s.where}, {"bytes", s.bytes}});
  }
  nlohmann::json lora = nlohmann::json::array();
  for (const auto& a : engine.adapters()) lora.push_back(lora_report(a));
  return {{"layout", layout_report(engine.layout())},
          {"storage", storage},
          {"device", engine.options().device.str()},
          {"dtype", dtype_name(engine.options().dtype)},
          {"threads", engine.options().threads},
          {"int4",
           {{"weights", int4_weights_name(engine.model_options().int4)},
            {"quantized_at_load", engine.model_options().quantize_int4},
            {"activation_bits", engine.model_options().int4_activation_bits},
            {"cpu_kernel", ops::int4_cpu_isa()}}},
          {"lora", lora},
          {"load_s", engine.load_seconds()}};
}

nlohmann::json lora_report(const LoraReport& adapter) {
  return {{"name", adapter.spec.name},
          {"path", adapter.spec.dir},
          {"scale", adapter.spec.scale},
          {"r", adapter.config.r},
          {"lora_alpha", adapter.config.lora_alpha},
          {"use_rslora", adapter.config.use_rslora},
          {"base_model", adapter.config.base_model},
          {"targets", adapter.targets}};
}

}  // namespace torchtpu
