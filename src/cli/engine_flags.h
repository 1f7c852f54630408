// The flags that say which checkpoint an Engine loads and how it runs, shared by the commands
// that build one from the command line, so that every command spells and checks them alike.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "engine/engine.h"

namespace torchtpu::cli {

// --device, --dtype, --context, --threads, --int4, --quantize, --int4-activation-bits,
// --no-vision, --no-audio into `settings` (every command that builds an engine; `serve` too).
void add_engine_settings(CLI::App& cmd, EngineSettings& settings);

// --draft-max, --draft-ngram-min, --draft-ngram-max, --draft-always into `draft` (speculative
// decoding by prompt lookup: generate and serve).
// Returns --draft-max's option, whose count() says whether it was given (default_draft_tokens).
CLI::Option* add_draft_flags(CLI::App& cmd, Drafting& draft);

struct EngineFlags {
  std::string model, emb4;  // a directory or a Hub id each
  EngineSettings settings;  // its emb4_dir is set from emb4 by options()
  int64_t chunk = 512;

  // --model (required), --emb4, --chunk and add_engine_settings' flags.
  void add_to(CLI::App& cmd);
  // Hub ids resolve to their cache directories (downloading what is missing); a bad device or
  // dtype name is a ValueError naming it.
  EngineOptions options() const;
};

}  // namespace torchtpu::cli
