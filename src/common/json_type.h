// How error messages name a JSON value's type ("a string", "an array", ...), shared by the request
// parsers and the MCP tools. Header-only and torch-free (the fuzz harnesses compile it).
#pragma once

#include <nlohmann/json.hpp>

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

}  // namespace torchtpu
