// A tensor shape as error messages print it: "[2, 3]".
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <string>

namespace torchtpu {

inline std::string shape_str(c10::ArrayRef<int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace torchtpu
