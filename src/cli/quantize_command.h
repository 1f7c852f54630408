// `torchtpu-cpp quantize IN OUT --group 32 [--emb4 OUT2] [--asym]`: writes a compressed-tensors
// pack-quantized (W4A16) checkpoint, and optionally its emb4 twin, from a dense checkpoint.
#pragma once

#include <CLI/CLI.hpp>

namespace torchtpu {

// Registers the subcommand; errors propagate as torchtpu error kinds to the caller of parse().
void add_quantize_command(CLI::App& app);

}  // namespace torchtpu
