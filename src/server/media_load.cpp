#include "server/media_load.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <utility>

#include "common/ascii.h"
#include "common/base64.h"
#include "common/errors.h"
#include "hub/http.h"
#include "media/audio.h"
#include "media/image.h"
#include "server/openai.h"

namespace torchtpu::server {
namespace {

constexpr const char* kImageTypes[] = {"image/png", "image/jpeg", "image/webp"};
// The names WAV goes by (RFC 2361's audio/vnd.wave, and the ones browsers and clients send), then
// MP3's (RFC 3003's audio/mpeg and the common audio/mp3). The decoder goes by the bytes, not the
// name: a WAV file sent as audio/mpeg reads as WAV.
constexpr const char* kAudioTypes[] = {"audio/wav",      "audio/x-wav", "audio/wave",
                                       "audio/vnd.wave", "audio/mpeg",  "audio/mp3"};

// Media types are case-insensitive (RFC 6838): IMAGE/PNG is image/png. image/jpg is no
// registered type, but many clients send it for JPEG.
template <size_t N>
bool one_of(const std::string& type, const char* const (&list)[N]) {
  std::string s = ascii_lower(type);
  if (s == "image/jpg") s = "image/jpeg";
  for (const char* x : list) {
    if (s == x) return true;
  }
  return false;
}

template <size_t N>
std::string listed(const char* const (&list)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i)
    out += (i == 0 ? "" : i + 1 == N ? " or " : ", ") + std::string(list[i]);
  return out;
}

const char* noun(MediaKind kind) {
  return kind == MediaKind::kImage ? "an image" : "an audio clip";
}

// GET within the limits: only http(s), redirects included (the HTTP client's rule), at most
// max_image_bytes, within url_timeout_s in all (connecting, waiting and the body). `mime` becomes
// the reply's Content-Type without parameters, which must name an image type this server reads.
std::string fetch(const std::string& url, const std::string& param, const MediaLimits& limits,
                  std::string& mime) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(limits.url_timeout_s));
  auto refuse = [&](const std::string& why) {
    return ApiError(400, "'" + param + "' could not be fetched: " + why, "invalid_request_error",
                    param, "invalid_image_url");
  };
  std::string body;
  hub::HttpResponse reply;
  const auto too_slow = [&] {
    return refuse("it took longer than --media-url-timeout " + ojson(limits.url_timeout_s).dump() +
                  " s");
  };
  try {
    hub::HttpClient client("torchtpu-cpp", "");
    client.set_deadline(deadline);
    reply =
        client.stream(url, 0, {}, [&](const char* data, size_t n) {
          if (static_cast<int64_t>(body.size() + n) > limits.max_image_bytes) {
            throw refuse("the image is larger than --max-image-bytes " +
                         std::to_string(limits.max_image_bytes));
          }
          if (std::chrono::steady_clock::now() > deadline) throw too_slow();
          body.append(data, n);
        });
  } catch (const hub::TransportError& e) {
    if (std::chrono::steady_clock::now() >= deadline) throw too_slow();
    throw refuse(e.what());
  }
  if (reply.status < 200 || reply.status >= 300) {
    throw refuse("the server answered HTTP " + std::to_string(reply.status));
  }
  mime = reply.header("content-type").substr(0, reply.header("content-type").find(';'));
  if (!one_of(mime, kImageTypes)) {
    throw refuse("the server answered with the Content-Type \"" + mime + "\", not " +
                 listed(kImageTypes));
  }
  return body;
}

// The media decoders' ValueError (c10's from the image codecs, ours from the audio readers) as the
// 400 naming the part.
ApiError unreadable(const MediaSource& s, const std::string& why) {
  const bool image = s.kind == MediaKind::kImage;
  return ApiError(400,
                  "'" + s.param + "' is not " +
                      (image ? "a readable image" : "a readable WAV or MP3 file") + ": " + why,
                  "invalid_request_error", s.param, image ? "invalid_image" : "invalid_audio");
}

// A value the preprocessing refused, as the 400 naming the part.
ApiError invalid_value(const MediaSource& s, const std::string& why) {
  return ApiError(400, "'" + s.param + "': " + why, "invalid_request_error", s.param,
                  "invalid_value");
}

// decode_image, then preprocess_image, within a lease for the image's pixels: the full-size
// pixels (3 bytes each, a transient copy as many again, and preprocessing's buffers, about 7 in
// all) are freed before the lease is.
ImagePatches read_image(const MediaSource& s, const std::string& bytes, int64_t max_bytes,
                        const ImageProcessorOptions& options, DecodeBudget& budget,
                        const DecodeBudget::Gone& gone) {
  ImageLimits image_limits;
  image_limits.max_bytes = max_bytes;
  const auto [width, height] = image_size(bytes);
  // An image over the limit is refused before its pixels are allocated: it holds nothing.
  const int64_t pixels = width * height <= image_limits.max_pixels ? width * height : 0;
  const DecodeBudget::Lease lease = budget.acquire(pixels, gone);
  at::Tensor rgb;
  try {
    rgb = decode_image(bytes, image_limits);
  } catch (const c10::ValueError& e) {
    throw unreadable(s, e.what_without_backtrace());
  }
  try {
    return preprocess_image(rgb, options);
  } catch (const c10::ValueError& e) {
    throw invalid_value(s, e.what_without_backtrace());
  }
}

// decode_audio, then the clip's features, so that its samples at the file's rate are freed before
// the next clip is decoded. A clip longer than the extractor's max_samples is refused as it
// decodes, as audio_features_from_file refuses it.
AudioFeatures read_clip(const MediaSource& s, const std::string& bytes,
                        const AudioFeatureOptions& options) {
  Waveform wave;
  try {
    wave = decode_audio(bytes, static_cast<double>(options.max_samples) / options.sampling_rate);
  } catch (const c10::ValueError& e) {
    throw unreadable(s, e.what_without_backtrace());
  } catch (const ValueError& e) {
    throw unreadable(s, e.what());
  }
  try {
    return audio_features_from_waveform(wave, options);
  } catch (const c10::ValueError& e) {
    throw invalid_value(s, e.what_without_backtrace());
  } catch (const ValueError& e) {
    throw invalid_value(s, e.what());
  }
}

}  // namespace

DecodeBudget::DecodeBudget(int64_t pixels) : capacity_(pixels) {}

DecodeBudget::Lease::Lease(Lease&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), pixels_(other.pixels_) {}

DecodeBudget::Lease::~Lease() {
  if (budget_ != nullptr) budget_->release(pixels_);
}

DecodeBudget::Lease DecodeBudget::acquire(int64_t pixels, const Gone& gone) {
  pixels = std::clamp<int64_t>(pixels, 0, capacity_);
  std::unique_lock lock(mutex_);
  const auto fits = [&] { return held_ + pixels <= capacity_; };
  while (!freed_.wait_for(lock, std::chrono::milliseconds(50), fits)) {
    if (gone && gone()) {
      throw ApiError(499, "the client closed the connection while its image waited to be decoded",
                     "invalid_request_error", "", "client_closed_request");
    }
  }
  held_ += pixels;
  peak_ = std::max(peak_, held_);
  return Lease(this, pixels);
}

void DecodeBudget::release(int64_t pixels) {
  {
    const std::lock_guard lock(mutex_);
    held_ -= pixels;
  }
  freed_.notify_all();
}

int64_t DecodeBudget::peak() const {
  const std::lock_guard lock(mutex_);
  return peak_;
}

DecodeBudget& image_decode_budget() {
  static DecodeBudget budget(2 * ImageLimits{}.max_pixels);
  return budget;
}

std::vector<MediaPart> load_media(const std::vector<MediaSource>& sources,
                                  const MediaLimits& limits, const Modalities& modalities,
                                  const ImageOptionsFor& image_options,
                                  const AudioFeatureOptions& audio_options, DecodeBudget& budget,
                                  const DecodeBudget::Gone& gone) {
  if (static_cast<int64_t>(sources.size()) > limits.max_items) {
    const std::string& param = sources[limits.max_items].param;
    throw ApiError(400,
                   "the request holds " + std::to_string(sources.size()) +
                       " images and audio clips, more than this server's --max-media " +
                       std::to_string(limits.max_items),
                   "invalid_request_error", param, "too_many_media_items");
  }
  std::vector<MediaPart> parts;
  for (const MediaSource& s : sources) {
    const bool image = s.kind == MediaKind::kImage;
    MediaPart part{s.kind, "", {}, {}, s.mime, image ? s.image_tokens : 0, s.param};
    if (image && part.image_tokens == 0) part.image_tokens = limits.image_tokens;
    const int64_t max_bytes = image ? limits.max_image_bytes : limits.max_audio_bytes;
    const char* flag = image ? "--max-image-bytes" : "--max-audio-bytes";
    if (!s.url.empty()) {
      if (!limits.allow_urls) {
        throw ApiError(400,
                       "'" + s.param +
                           "' is an http(s) URL, which this server does not fetch; send the "
                           "image as a data: URL, or start the server with --allow-media-urls",
                       "invalid_request_error", s.param, "media_urls_disabled");
      }
    } else {
      if (image ? !one_of(s.mime, kImageTypes) : !one_of(s.mime, kAudioTypes)) {
        throw unsupported(s.mime_param, std::string("names the media type \"") + s.mime +
                                            "\"; this server reads " +
                                            (image ? listed(kImageTypes) : listed(kAudioTypes)));
      }
      // MIME's base64 breaks its lines (RFC 2045), and clients pass it on so: spaces and line
      // breaks are not data.
      std::string data = s.base64;
      std::erase_if(data, [](char c) { return c == '\n' || c == '\r' || c == ' ' || c == '\t'; });
      // Base64 takes 4 characters for 3 bytes: refuse an oversized item before decoding it.
      if (static_cast<int64_t>(data.size() / 4 * 3) > max_bytes + 2) {
        throw invalid(s.param, std::string("holds ") + noun(s.kind) + " of about " +
                                   std::to_string(data.size() / 4 * 3) + " bytes, more than " +
                                   flag + " " + std::to_string(max_bytes));
      }
      auto bytes = decode_base64(data);
      if (!bytes) throw invalid(s.param, "is not valid base64");
      part.bytes = std::move(*bytes);
    }
    // What the request says is checked above, what the checkpoint reads here, and only then is
    // anything fetched or decoded.
    if (image ? !modalities.image : !modalities.audio) {
      const bool disabled = image ? modalities.image_disabled : modalities.audio_disabled;
      const std::string why = disabled ? std::string("this server was started with ") +
                                             (image ? "--no-vision" : "--no-audio")
                                       : std::string("this checkpoint has no ") +
                                             (image ? "vision" : "audio") +
                                             " encoder (its config.json has no " +
                                             (image ? "vision_config" : "audio_config") + ")";
      throw ApiError(
          400,
          std::string("'") + s.param + "' is " + (image ? "an image" : "audio") + ", and " + why,
          "invalid_request_error", s.param, "unsupported_modality");
    }
    if (!s.url.empty()) part.bytes = fetch(s.url, s.param, limits, part.mime);
    if (static_cast<int64_t>(part.bytes.size()) > max_bytes) {
      throw invalid(s.param, std::string("holds ") + noun(s.kind) + " of " +
                                 std::to_string(part.bytes.size()) + " bytes, more than " + flag +
                                 " " + std::to_string(max_bytes));
    }
    if (image) {
      ImageProcessorOptions options;
      options.max_soft_tokens = part.image_tokens;
      if (image_options) options = image_options(part.image_tokens);
      part.patches = read_image(s, part.bytes, max_bytes, options, budget, gone);
    } else {
      part.audio = read_clip(s, part.bytes, audio_options);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace torchtpu::server
