// Resident memory of this process, from /proc/self/status (Linux).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace torchtpu {

// VmRSS (current) or VmHWM (peak) in bytes; 0 where /proc is unavailable.
inline int64_t process_memory_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}
inline int64_t resident_bytes() { return process_memory_bytes("VmRSS"); }
inline int64_t peak_resident_bytes() { return process_memory_bytes("VmHWM"); }

}  // namespace torchtpu
