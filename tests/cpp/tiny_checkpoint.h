// Tiny random Gemma 4 checkpoints for the engine's C++ suites: make-tiny's "tiny" preset (7 layers,
// sliding window 8, so prompts and decodes wrap the sliding rings), f32 weights, each written once
// per process and removed when the process exits; and the engine options the suites read them
// with.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <system_error>

#include "engine/engine.h"
#include "model/make_tiny.h"

namespace torchtpu::testing {

// The preset with `seed` and `ple` (per-layer input width) changed, in a directory named after
// `tag`, the process and both values.
inline std::string tiny_checkpoint(const std::string& tag, uint64_t seed, int64_t ple = 16) {
  namespace fs = std::filesystem;
  struct Written {
    std::set<fs::path> paths;
    ~Written() {
      std::error_code ignored;
      for (const auto& path : paths) fs::remove_all(path, ignored);
    }
  };
  static Written written;
  const auto path = fs::temp_directory_path() / (tag + "-" + std::to_string(::getpid()) + "-" +
                                                 std::to_string(seed) + "-" + std::to_string(ple));
  if (!fs::exists(path / "config.json")) {
    auto spec = tiny_preset("tiny");
    spec.seed = seed;
    spec.ple = ple;
    make_tiny(path.string(), spec);
    written.paths.insert(path);
  }
  return path.string();
}

// float32 (where a sequence's tokens do not depend on what it was computed beside), 256
// positions, prompts read `prefill_chunk` tokens at a time, one thread.
inline EngineOptions tiny_engine_options(const std::string& dir, int64_t prefill_chunk) {
  EngineOptions o;
  o.model_dir = dir;
  o.dtype = at::kFloat;
  o.context = 256;
  o.prefill_chunk = prefill_chunk;
  o.threads = 1;
  return o;
}

}  // namespace torchtpu::testing
