// A double as messages and metrics print it: the shortest text that reads back as the value
// ("0.025", "3", "1e+20"), not std::to_string's fixed six decimals ("0.000000" for 1e-9).
#pragma once

#include <charconv>
#include <string>

namespace torchtpu {

inline std::string number_str(double v) {
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), v).ptr;
  return std::string(buffer, end);
}

}  // namespace torchtpu
