// What a prompt's media are and how many it may carry, without libtorch: the request parsers
// (and their fuzz harness, built without it) name media kinds and check budgets before anything
// is decoded.
#pragma once

#include <cstdint>

namespace torchtpu {

enum class MediaKind { kImage, kAudio };

inline const char* media_kind_name(MediaKind kind) {  // "image" | "audio"
  return kind == MediaKind::kImage ? "image" : "audio";
}

// The most media items one prompt may carry.
inline constexpr int64_t kMaxMediaItems = 32;

// The soft-token budgets Gemma4ImageProcessor accepts.
inline constexpr int64_t kImageSoftTokenBudgets[] = {70, 140, 280, 560, 1120};

}  // namespace torchtpu
