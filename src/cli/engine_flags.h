// The flags that say which checkpoint an Engine loads and how it runs, shared by the commands
// that build one from the command line, so that every command spells and checks them alike.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine/engine.h"

namespace torchtpu::cli {

struct EngineFlags {
  std::string model, emb4, device = "cpu", dtype = "bfloat16";
  std::string int4 = "auto", quantize = "none";
  int64_t context = 8192, chunk = 512, threads = 0, int4_activation_bits = 16;
  bool no_vision = false, no_audio = false;

  // --model (required), --emb4, --device, --dtype, --context, --chunk, --int4, --quantize,
  // --int4-activation-bits, --threads, --no-vision, --no-audio.
  void add_to(CLI::App& cmd);
  // Hub ids resolve to their cache directories (downloading what is missing); a bad device or
  // dtype name is a ValueError naming it.
  EngineOptions options() const;
};

}  // namespace torchtpu::cli
