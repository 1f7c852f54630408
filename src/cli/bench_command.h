// `torchtpu-cpp bench`: load time, first call, prompt-read and decode rates
// (streamed and batched host reads) and peak memory of one engine, as one JSON
// object. Prompts are random token ids from a fixed seed (bench_prompt), so
// peers can be fed exactly the same ids.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <vector>

namespace torchtpu::cli {

void add_bench_command(CLI::App &app);

// `length` ids in [0, vocab) from SplitMix64 seeded with seed * 2^32 + length;
// bench/prompts.py writes the same ids for the peers.
std::vector<int64_t> bench_prompt(uint64_t seed, int64_t length, int64_t vocab);

}  // namespace torchtpu::cli
