// FNV-1a, 64-bit: the digests that name content without keeping it (media items and salts in
// prefix cache keys, a checkpoint's identity and the bytes of prefix state files). Not
// cryptographic: it tells different inputs apart, it does not resist someone forging a
// collision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace torchtpu {

inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;
inline constexpr uint64_t kFnvPrime = 1099511628211ull;

inline uint64_t fnv1a(uint64_t hash, const uint8_t* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) hash = (hash ^ bytes[i]) * kFnvPrime;
  return hash;
}

// FNV-1a's step over 64-bit words in four independent lanes, then the lanes and the tail bytes
// through fnv1a: for the digest of large content (a prefix state file's bytes), where the
// byte-wise chain's multiply latency would cost about a nanosecond a byte; this runs near
// memory speed. A different function from fnv1a: the two give different digests.
inline uint64_t fnv1a_wide(uint64_t hash, const uint8_t* bytes, size_t n) {
  uint64_t lanes[4] = {hash, hash ^ 1, hash ^ 2, hash ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t word;
      std::memcpy(&word, bytes + i + 8 * k, 8);
      lanes[k] = (lanes[k] ^ word) * kFnvPrime;
    }
  }
  hash = fnv1a(hash, reinterpret_cast<const uint8_t*>(lanes), sizeof lanes);
  return fnv1a(hash, bytes + i, n - i);
}

// A digest as the 16 hex digits that name it (weights ids, adapters' digests).
inline std::string digest_hex(uint64_t digest) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return hex;
}

}  // namespace torchtpu
