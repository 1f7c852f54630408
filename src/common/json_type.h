// How error messages name a JSON value's type ("a string", "an array", ...) and quote what the
// JSON parser found wrong, shared by the request parsers, the MCP tools and the file readers.
// Header-only and torch-free (the fuzz harnesses compile it).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace torchtpu {

// nlohmann's message without its "[json.exception.parse_error.101] " tag, which names the
// library's exception class, not anything in the input.
inline std::string json_error_text(const nlohmann::json::exception& e) {
  std::string_view text = e.what();
  if (text.starts_with("[json.exception.")) {
    const size_t end = text.find("] ");
    if (end != std::string_view::npos) text.remove_prefix(end + 2);
  }
  return std::string(text);
}

inline const char* json_type_name(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Why the JSON number `v` named `name` is an integer out of int64's range, as a message quoting
// what was sent; empty when it is not one. Two kinds: an unsigned integer past 2^63 - 1 (which
// get<int64_t> would wrap to a negative number), and an integer too long for any 64-bit type,
// which the parser reads as a float (past 2^64, or below -2^63: a seed of 20 digits).
inline std::string int64_overflow(const nlohmann::ordered_json& v, const std::string& name) {
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  constexpr auto kMin = std::numeric_limits<int64_t>::min();
  // Every double past +-2^53 is a whole number, so a float this far out is such an integer (-2^63
  // itself too: the parser holds int64's least value as an integer, so a float there was below).
  const double x = v.is_number_float() ? v.get<double>() : 0;
  if (x <= -0x1p63) {
    return "'" + name + "' must be at least " + std::to_string(kMin) + ", got " + v.dump();
  }
  const bool too_large =
      v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMax) : x >= 0x1p63;
  if (!too_large) return "";
  return "'" + name + "' must be at most " + std::to_string(kMax) + ", got " + v.dump();
}

}  // namespace torchtpu
