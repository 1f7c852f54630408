// Reading a request's media (#19): a MediaSource's bytes decoded or fetched, checked against the
// server's limits and what the checkpoint reads, and decoded once, before anything is queued.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "media/audio.h"
#include "media/image.h"
#include "server/media_parts.h"

namespace torchtpu::server {

// The decoded pixels that image decodes may hold at once. A tiny file can declare 67 megapixels
// (a 2.6 KB WebP decodes to 200 MB, and preprocessing needs more), and requests decode before they
// are queued: a decode waits here until its image fits, so concurrent requests take turns rather
// than add up.
class DecodeBudget {
 public:
  explicit DecodeBudget(int64_t pixels);

  // Pixels held from acquire() until destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();

   private:
    friend class DecodeBudget;
    Lease(DecodeBudget* budget, int64_t pixels) : budget_(budget), pixels_(pixels) {}
    DecodeBudget* budget_;
    int64_t pixels_;
  };

  // Asked while a decode waits: whether its client has left.
  using Gone = std::function<bool()>;

  // Waits until `pixels` (at most the capacity: a larger image waits for the whole) fit beside
  // those held. Leases are held one at a time and only while decoding, so every wait ends. With
  // `gone`, asked every 50 ms of the wait: ApiError 499 once it is true, so that nothing is decoded
  // for a client that left (one that timed out and sent the request again would otherwise have
  // every copy decoded, one after the other, ahead of the clients still waiting).
  Lease acquire(int64_t pixels, const Gone& gone = {});

  int64_t capacity() const { return capacity_; }
  int64_t peak() const;  // the most pixels held at once so far

 private:
  void release(int64_t pixels);

  const int64_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable freed_;
  int64_t held_ = 0;
  int64_t peak_ = 0;
};

// The process's budget: two images of ImageLimits' largest size (about 1 GB while they decode).
DecodeBudget& image_decode_budget();

// The preprocessing for an image given its soft-token budget (Engine::image_options).
using ImageOptionsFor = std::function<ImageProcessorOptions(int64_t max_soft_tokens)>;

// A content part read and checked: its bytes decode (decode_image / decode_audio) within the
// limits; an image is preprocessed as it is decoded and a clip's features are extracted as it is
// decoded, so neither its full-size pixels nor its samples are kept.
struct MediaPart {
  MediaKind kind = MediaKind::kImage;
  std::string bytes;
  ImagePatches patches;      // images: preprocess_image's result
  AudioFeatures audio;       // clips: audio_features_from_waveform's result
  std::string mime;          // image/png | image/jpeg | image/webp | one of the WAV or MP3 types
  int64_t image_tokens = 0;  // images: one of kImageSoftTokenBudgets
  std::string param;         // the field it came from, for errors found later
};

// Reads the sources in order: base64 decoded, http(s) URLs fetched (only with allow_urls), each
// item checked against the limits, its media type and what the checkpoint reads, and decoded
// once so that a corrupt file is refused here, before anything is queued. Images are decoded and
// preprocessed (with image_options, ImageProcessorOptions' defaults when empty) one at a time,
// each within a lease of `budget` (whose wait ends with ApiError 499 once `gone` says the client
// left); clips are decoded and their features extracted (with audio_options) one at a time, so a
// request holds at most one clip's samples (up to 8 M floats for 8 MB of 8-bit WAV at 384 kHz)
// however many it sends. ApiError 400 naming the source's field and the limit or value for
// anything wrong.
std::vector<MediaPart> load_media(const std::vector<MediaSource>& sources,
                                  const MediaLimits& limits, const Modalities& modalities,
                                  const ImageOptionsFor& image_options = {},
                                  const AudioFeatureOptions& audio_options = {},
                                  DecodeBudget& budget = image_decode_budget(),
                                  const DecodeBudget::Gone& gone = {});

}  // namespace torchtpu::server
