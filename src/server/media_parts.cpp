#include "server/media_parts.h"

#include <algorithm>
#include <array>

#include "common/errors.h"
#include "server/openai.h"

namespace torchtpu::server {

ojson modalities_json(const Modalities& modalities) {
  ojson out = {"text"};
  if (modalities.image) out.push_back("image");
  if (modalities.audio) out.push_back("audio");
  return out;
}

void check_media_limits(const MediaLimits& limits) {
  if (limits.max_items < 0 || limits.max_items > kMaxMediaItems) {
    throw ValueError("--max-media must be between 0 and " + std::to_string(kMaxMediaItems) +
                     ", got " + std::to_string(limits.max_items));
  }
  for (const auto& [flag, bytes] : {std::pair{"--max-image-bytes", limits.max_image_bytes},
                                    std::pair{"--max-audio-bytes", limits.max_audio_bytes}}) {
    if (bytes < 1 || bytes > (int64_t{1} << 30)) {
      throw ValueError(std::string(flag) + " must be between 1 and 2^30, got " +
                       std::to_string(bytes));
    }
  }
  if (std::find(std::begin(kImageSoftTokenBudgets), std::end(kImageSoftTokenBudgets),
                limits.image_tokens) == std::end(kImageSoftTokenBudgets)) {
    throw ValueError("--image-tokens must be 70, 140, 280, 560 or 1120, got " +
                     std::to_string(limits.image_tokens));
  }
  if (!(limits.url_timeout_s > 0 && limits.url_timeout_s <= 600)) {
    throw ValueError("--media-url-timeout must be above 0 and at most 600 seconds, got " +
                     ojson(limits.url_timeout_s).dump());
  }
}

MediaSource image_from_url(const std::string& url, const std::string& param, int64_t image_tokens) {
  MediaSource source{MediaKind::kImage, "", "", "", param, param, image_tokens};
  if (url.starts_with("http://") || url.starts_with("https://")) {
    source.url = url;
    return source;
  }
  if (!url.starts_with("data:")) {
    const std::string shown = url.substr(0, std::min<size_t>(url.find(':'), 16));
    throw invalid(param,
                  "must be a data: URL or an http(s) URL, got one starting \"" + shown + "\"");
  }
  const size_t comma = url.find(',');
  const std::string header = url.substr(5, comma == std::string::npos ? 0 : comma - 5);
  const std::string suffix = ";base64";
  if (comma == std::string::npos || header.size() < suffix.size() ||
      header.compare(header.size() - suffix.size(), suffix.size(), suffix) != 0) {
    throw invalid(param, "must be a base64 data: URL (data:MEDIA_TYPE;base64,DATA)");
  }
  source.mime = header.substr(0, header.find(';'));
  if (source.mime.empty()) {
    throw invalid(param, "is a data: URL without a media type (data:image/png;base64,...)");
  }
  source.base64 = url.substr(comma + 1);
  return source;
}

MediaSource audio_from_input_audio(const ojson& part, const std::string& param) {
  const ojson* audio = field(part, "input_audio");
  if (!audio) throw missing(param + ".input_audio");
  if (!audio->is_object()) throw wrong_type(param + ".input_audio", "an object", *audio);
  const std::string& data = required_string(*audio, "data", param + ".input_audio");
  const std::string& format = required_string(*audio, "format", param + ".input_audio");
  if (format != "wav" && format != "mp3") {
    throw unsupported(param + ".input_audio.format",
                      "is \"" + format + "\": this server reads \"wav\" and \"mp3\" audio");
  }
  return {MediaKind::kAudio,
          "",
          format == "wav" ? "audio/wav" : "audio/mpeg",
          data,
          param + ".input_audio.data",
          param + ".input_audio.format",
          0};
}

int64_t image_tokens_for_detail(const ojson* detail, const std::string& param) {
  if (!detail) return 0;
  if (*detail == "auto") return 0;
  if (*detail == "low") return 70;
  if (*detail == "high") return 1120;
  throw invalid(param, "must be \"auto\", \"low\" or \"high\", got " + detail->dump());
}

}  // namespace torchtpu::server
