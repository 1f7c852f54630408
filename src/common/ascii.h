// ASCII case folding for the names protocols compare without case (HTTP header names and codings,
// media types, URL schemes and hosts, Ollama's roles). Bytes outside A-Z are kept as they are,
// whatever the locale, so UTF-8 passes unchanged.
#pragma once

#include <string>

namespace torchtpu {

inline std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

}  // namespace torchtpu
