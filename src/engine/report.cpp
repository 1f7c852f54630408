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
          {"load_s", engine.load_seconds()}};
}

}  // namespace torchtpu
