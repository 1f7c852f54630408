// Reading a request's media (#19): a MediaSource's bytes decoded or fetched, checked against the
// server's limits and what the checkpoint reads, and decoded once, before anything is queued.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "media/audio.h"
#include "server/media_parts.h"

namespace torchtpu::server {

// A content part read and checked: its bytes decode (decode_image / decode_audio) within the
// limits.
struct MediaPart {
  MediaKind kind = MediaKind::kImage;
  std::string bytes;
  at::Tensor rgb;            // images: the decoded pixels, RGB uint8 [3, H, W]
  Waveform wave;             // clips: the decoded samples at the file's rate
  std::string mime;          // image/png | image/jpeg | image/webp | one of the WAV or MP3 types
  int64_t image_tokens = 0;  // images: one of kImageSoftTokenBudgets
  std::string param;         // the field it came from, for errors found later
};

// Reads the sources in order: base64 decoded, http(s) URLs fetched (only with allow_urls), each
// item checked against the limits, its media type and what the checkpoint reads, and decoded
// once so that a corrupt file is refused here, before anything is queued. ApiError 400 naming
// the source's field and the limit or value for anything wrong.
std::vector<MediaPart> load_media(const std::vector<MediaSource>& sources,
                                  const MediaLimits& limits, const Modalities& modalities);

}  // namespace torchtpu::server
