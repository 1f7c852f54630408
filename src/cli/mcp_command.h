// `torchtpu-cpp mcp --url URL`: a stdio MCP server in front of any of our servers (the tools of
// src/server/mcp.h, calling URL over HTTP).
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu::cli {

void add_mcp_command(CLI::App& app);

}  // namespace torchtpu::cli
