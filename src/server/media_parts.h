// Images and audio in requests (#19): the one form every front end (chat/completions, the
// Responses API, Anthropic Messages) turns its content parts into, the checks on what the request
// says about them, with a 400 naming the field for anything wrong, and the server's limits.
// A front end leaves {"type":"image"} / {"type":"audio"} in the message's content array where the
// part was (the chat template prints <|image|> / <|audio|> there) and appends a MediaSource to
// GenerationRequest::media in the same order; load_media (server/media_load.h) reads them when
// the request is started. Nothing here needs libtorch, so the request fuzz harness covers it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "media/kinds.h"

namespace torchtpu::server {

using ojson = nlohmann::ordered_json;

// A content part as the request names it, before its bytes are read.
struct MediaSource {
  MediaKind kind = MediaKind::kImage;
  std::string url;           // an http(s) URL (images only), or empty for inline data
  std::string mime;  // inline data's media type, as sent ("image/png", "audio/wav", "audio/mpeg")
  std::string base64;        // inline data, base64-encoded
  std::string param;         // the field holding the URL or the data
  std::string mime_param;    // the field naming the media type (param for a data: URL)
  int64_t image_tokens = 0;  // the image's soft-token budget; 0: the server's default
};

// What requests may send (ServeOptions::media, the serve flags of the same names).
struct MediaLimits {
  int64_t max_items = 8;                       // --max-media: images and audio clips per request
  int64_t max_image_bytes = int64_t{8} << 20;  // --max-image-bytes, each image as encoded
  int64_t max_audio_bytes = int64_t{8} << 20;  // --max-audio-bytes, each clip as encoded
  int64_t image_tokens = 280;  // --image-tokens: an image's soft tokens when detail is "auto"
  bool allow_urls = false;     // --allow-media-urls: fetch http(s) image URLs
  // --media-url-timeout: seconds a fetch's body may take (connecting and stalls have the HTTP
  // client's own timeouts)
  double url_timeout_s = 10;
};

// ValueError naming the flag for a limit out of range: --max-media 0-kMaxMediaItems, byte limits
// 1 B-1 GiB, --image-tokens one of kImageSoftTokenBudgets, --media-url-timeout 0-600 s (exclusive
// of 0).
void check_media_limits(const MediaLimits& limits);

// What the checkpoint reads besides text (ModelConfig's vision / audio towers).
struct Modalities {
  bool image = false;
  bool audio = false;
  // The checkpoint has the tower but the server left it unloaded (--no-vision, --no-audio).
  bool image_disabled = false;
  bool audio_disabled = false;
};
// ["text", "image", "audio"] or the part of it the checkpoint reads (/v1/models, /v1/engine).
ojson modalities_json(const Modalities& modalities);

// A data: or http(s) URL naming an image (OpenAI's image_url.url, Responses' image_url,
// Anthropic's url source). ApiError 400 naming `param` for any other scheme, a data: URL that
// is not base64 or has no media type.
MediaSource image_from_url(const std::string& url, const std::string& param, int64_t image_tokens);

// OpenAI's input_audio part ({"type":"input_audio","input_audio":{"data":BASE64,"format":"wav"}},
// chat's and the Responses API's). ApiError 400 naming the field for a missing field or a format
// other than "wav" or "mp3".
MediaSource audio_from_input_audio(const ojson& part, const std::string& param);

// OpenAI's image_url.detail: "low" 70 soft tokens, "high" 1120, "auto" or absent 0 (the server's
// --image-tokens). ApiError 400 naming `param` for other values.
int64_t image_tokens_for_detail(const ojson* detail, const std::string& param);

}  // namespace torchtpu::server
