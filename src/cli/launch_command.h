// `torchtpu-cpp launch claude|codex|opencode`: runs a coding agent against a running torchtpu-cpp
// server, as `ollama launch` does: Claude Code through the Anthropic Messages API, Codex through
// the Responses API, OpenCode through Chat Completions, with the server's URL, key and model set
// for that run only (environment and command-line settings; no file of the agent's is written).
// --print shows them instead.
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu::cli {

void add_launch_command(CLI::App& app);

}  // namespace torchtpu::cli
