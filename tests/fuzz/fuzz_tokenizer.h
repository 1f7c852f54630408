// The tokenizer the text harnesses load once per process: the Gemma 4 test tokenizer that
// scripts/setup.sh writes (the real Gemma vocabulary, merges and special tokens), or the
// tokenizer.json named by $TORCHTPU_FUZZ_TOKENIZER. Loading it takes seconds under the
// sanitizers, so the harnesses load it in LLVMFuzzerInitialize, outside libFuzzer's per-input
// timeout.
#pragma once

#include <cstdlib>
#include <string>

#include "text/tokenizer.h"

namespace torchtpu::fuzz {

inline const Tokenizer& tokenizer() {
  static const Tokenizer tok = [] {
    const char* path = std::getenv("TORCHTPU_FUZZ_TOKENIZER");
    return Tokenizer::from_file(path && *path ? path : TORCHTPU_FUZZ_DEFAULT_TOKENIZER);
  }();
  return tok;
}

// Reads the input as little-endian 24-bit numbers: ids spanning the vocabulary and a little
// beyond it, so out-of-range ids are exercised too.
inline std::vector<int64_t> ids_of(const uint8_t* data, size_t size) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i + 3 <= size; i += 3) {
    ids.push_back(int64_t{data[i]} | int64_t{data[i + 1]} << 8 | int64_t{data[i + 2]} << 16);
  }
  return ids;
}

}  // namespace torchtpu::fuzz
