// `torchtpu-cpp serve`: the OpenAI-compatible server (src/server) on a checkpoint, or on the
// built-in demo checkpoint (random weights) when no --model is given.
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu::cli {

void add_serve_command(CLI::App& app);

}  // namespace torchtpu::cli
