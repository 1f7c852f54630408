// How error messages name a JSON value's type ("a string", "an array", ...), shared by the request
// parsers and the MCP tools. Header-only and torch-free (the fuzz harnesses compile it).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

namespace torchtpu {

inline const char* json_type_name(const nlohmann::ordered_json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Why the JSON integer `v` named `name` is no int64 (an unsigned one past 2^63 - 1, which
// get<int64_t> would wrap to a negative number), as a message quoting what was sent; empty when
// it is one.
inline std::string int64_overflow(const nlohmann::ordered_json& v, const std::string& name) {
  constexpr auto kMax = std::numeric_limits<int64_t>::max();
  if (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(kMax)) return "";
  return "'" + name + "' must be at most " + std::to_string(kMax) + ", got " + v.dump();
}

}  // namespace torchtpu
