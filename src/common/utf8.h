// Counting UTF-8 text by characters (code points) rather than bytes, as OpenAI's length limits
// and logprobs' text offsets count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace torchtpu {

// The characters `bytes` starts (its bytes that are not continuation bytes): a character split
// across pieces counts once, at its first byte.
inline size_t utf8_characters(const std::string& bytes) {
  return static_cast<size_t>(std::count_if(bytes.begin(), bytes.end(), [](char c) {
    return (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace torchtpu
