// Prefix states in files (llama-server's slot save and restore): one state per safetensors file,
// named by the weights it was computed with, so that another process with the same weights (a
// restarted server, a replica taking a conversation over) starts from it instead of reading its
// tokens again.
#pragma once

#include <cstdint>
#include <string>

#include "engine/prefix_cache.h"
#include "model/rings.h"

namespace torchtpu {

// Writes `state` to `path`, replacing a file there; returns the file's size in bytes.
// `weights_id`: Engine::weights_id of the engine whose rings held it.
int64_t write_prefix_state(const std::string& path, const PrefixState& state,
                           const std::string& weights_id);

// Reads a state write_prefix_state wrote, onto the device of `rings`, checked against them: the
// same weights, each ring's kind, dtype and row shape, and its tokens inside their context.
// NotFoundError when no file is at `path`; FormatError for a file that is not a prefix state or
// whose weights or rings differ, naming what differs.
PrefixState read_prefix_state(const std::string& path, const std::string& weights_id,
                              Rings& rings);

}  // namespace torchtpu
