// `torchtpu-cpp download ID[@REV] [--revision R] [--include GLOB]...`: fetch a model from the
// Hugging Face Hub into the shared cache without serving it; prints the snapshot directory.
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu {

void add_download_command(CLI::App& app);

}  // namespace torchtpu
