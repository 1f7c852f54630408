// Standard base64 (RFC 4648 section 4): media travel in requests as base64 data, and the MCP tools
// send local files that way. Header-only and torch-free (the fuzz harnesses compile it).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace torchtpu {

inline constexpr char kBase64Alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// With padding.
inline std::string encode_base64(const std::string& bytes) {
  constexpr const char* kAlphabet = kBase64Alphabet;
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t group = static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                           static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                           static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2]));
    for (int shift : {18, 12, 6, 0}) out.push_back(kAlphabet[group >> shift & 63]);
  }
  if (i < bytes.size()) {
    const bool two = i + 2 == bytes.size();
    const uint32_t group =
        static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
        (two ? static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 : 0);
    out.push_back(kAlphabet[group >> 18 & 63]);
    out.push_back(kAlphabet[group >> 12 & 63]);
    out.push_back(two ? kAlphabet[group >> 6 & 63] : '=');
    out.push_back('=');
  }
  return out;
}

// The bytes of base64 with padding and no whitespace, or nullopt for anything else.
inline std::optional<std::string> decode_base64(const std::string& text) {
  static const std::array<int8_t, 256> kValue = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    for (int i = 0; i < 64; ++i)
      v[static_cast<unsigned char>(kBase64Alphabet[i])] = static_cast<int8_t>(i);
    return v;
  }();
  if (text.size() % 4 != 0) return std::nullopt;
  size_t padding = 0;
  if (!text.empty() && text.back() == '=') padding = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    uint32_t group = 0;
    for (size_t j = 0; j < 4; ++j) {
      const bool pad = last && j >= 4 - padding;
      const int8_t v = pad ? 0 : kValue[static_cast<unsigned char>(text[i + j])];
      if (v < 0) return std::nullopt;
      group = group << 6 | static_cast<uint32_t>(v);
    }
    out.push_back(static_cast<char>(group >> 16));
    if (!last || padding < 2) out.push_back(static_cast<char>(group >> 8 & 0xff));
    if (!last || padding < 1) out.push_back(static_cast<char>(group & 0xff));
  }
  return out;
}

}  // namespace torchtpu
