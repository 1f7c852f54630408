// `torchtpu-cpp proxy`: the chat page, /mcp and every other request forwarded to an upstream
// server found at a URL or by a command (src/server/proxy.h).
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu::cli {

void add_proxy_command(CLI::App& app);

}  // namespace torchtpu::cli
