// What every report of a loaded engine shows (generate --json, /v1/engine, Python): layout, how
// each tensor family is stored, device, dtype, load time.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace torchtpu {

nlohmann::json engine_report(const Engine& engine);
// The KV rings' layout: full_rings, sliding_rings, shared_layers, context, row_bytes.
nlohmann::json layout_report(const Layout& layout);
// One loaded LoRA adapter: name, path, its load-time scale, r, lora_alpha, use_rslora,
// base_model and the modules it adapts.
nlohmann::json lora_report(const LoraReport& adapter);

}  // namespace torchtpu
