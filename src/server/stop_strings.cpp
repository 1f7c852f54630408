#include "server/stop_strings.h"

#include <algorithm>

namespace torchtpu::server {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {}

std::string StopStrings::push(std::string_view text, bool opaque) {
  if (stopped_) return {};
  if (opaque) return finish() + std::string(text);
  held_ += text;
  // The earliest complete stop sequence wins.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at < cut) {
      cut = at;
      matched_ = s;
    }
  }
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that begins some stop sequence. Stop sequences are valid UTF-8 and
  // so start on a character boundary: the released text never ends inside a character.
  size_t keep = 0;
  for (const auto& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::finish() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace torchtpu::server
