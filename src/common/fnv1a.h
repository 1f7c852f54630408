// FNV-1a, 64-bit: the digests that name content without keeping it (media items and salts in
// prefix cache keys, a checkpoint's identity in prefix state files). Not cryptographic: it tells
// different inputs apart, it does not resist someone forging a collision.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torchtpu {

inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;
inline constexpr uint64_t kFnvPrime = 1099511628211ull;

inline uint64_t fnv1a(uint64_t hash, const uint8_t* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * kFnvPrime;
  return hash;
}

}  // namespace torchtpu
