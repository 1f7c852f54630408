// Subcommands of torchtpu-cpp. Each adds itself to the app with a callback that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>

namespace torchtpu::cli {

// A key option's value, left empty on the command line, from the environment variable `name`
// (serve's, mcp's and launch's $TORCHTPU_API_KEY; proxy's own two): the command line wins.
inline void default_from_env(std::string& value, const char* name) {
  if (!value.empty()) return;
  if (const char* from_env = std::getenv(name)) value = from_env;
}

void add_make_tiny_command(CLI::App& app);
void add_generate_command(CLI::App& app);

}  // namespace torchtpu::cli
