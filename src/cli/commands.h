// Subcommands of torchtpu-cpp. Each adds itself to the app with a callback that runs it.
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu::cli {

void add_make_tiny_command(CLI::App& app);
void add_generate_command(CLI::App& app);

}  // namespace torchtpu::cli
