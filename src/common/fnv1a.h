// FNV-1a, 64-bit: the digests that name content without keeping it (media items and salts in
// prefix cache keys, a checkpoint's identity in prefix state files). Not cryptographic: it tells
// different inputs apart, it does not resist someone forging a collision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace torchtpu {

inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;
inline constexpr uint64_t kFnvPrime = 1099511628211ull;

inline uint64_t fnv1a(uint64_t hash, const uint8_t* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * kFnvPrime;
  return hash;
}

// A digest as the 16 hex digits that name it (weights ids, adapters' digests).
inline std::string digest_hex(uint64_t digest) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return hex;
}

}  // namespace torchtpu
