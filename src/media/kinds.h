// What a prompt's media are and how many it may carry, without libtorch: the request parsers
// (and their fuzz harness, built without it) name media kinds and check budgets before anything
// is decoded.
#pragma once

#include <cstdint>
#include <string_view>

namespace torchtpu {

enum class MediaKind { kImage, kAudio };

inline const char* media_kind_name(MediaKind kind) {  // "image" | "audio"
  return kind == MediaKind::kImage ? "image" : "audio";
}

// The most media items one prompt may carry.
inline constexpr int64_t kMaxMediaItems = 32;

// The media type that bytes' first bytes show, among the formats the towers decode: PNG, JPEG or
// WebP for images, WAV (RIFF/WAVE) or MP3 (an ID3 tag or an MPEG frame sync) for audio; empty for
// anything else. The one place that tells the formats apart: the decoders dispatch on it and the
// server names a file's format with it before anything is decoded.
inline std::string_view sniff_media_type(MediaKind kind, std::string_view bytes) {
  const auto at = [&](size_t offset, std::string_view magic) {
    return bytes.size() >= offset + magic.size() && bytes.substr(offset, magic.size()) == magic;
  };
  if (kind == MediaKind::kAudio) {
    if (at(0, "RIFF") && at(8, "WAVE")) return "audio/wav";
    const bool sync = bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
                      (static_cast<unsigned char>(bytes[1]) & 0xE0) == 0xE0;
    return at(0, "ID3") || sync ? "audio/mpeg" : "";
  }
  if (at(0, "\x89PNG\r\n\x1a\n")) return "image/png";
  if (at(0, "\xff\xd8\xff")) return "image/jpeg";
  if (at(0, "RIFF") && at(8, "WEBP")) return "image/webp";
  return "";
}

// The soft-token budgets Gemma4ImageProcessor accepts.
inline constexpr int64_t kImageSoftTokenBudgets[] = {70, 140, 280, 560, 1120};

}  // namespace torchtpu
