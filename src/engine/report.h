// What every report of a loaded engine shows (generate --json, /v1/engine, Python): layout, how
// each tensor family is stored, device, dtype, load time.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace torchtpu {

nlohmann::json engine_report(const Engine& engine);

}  // namespace torchtpu
