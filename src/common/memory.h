// Resident memory of this process, from /proc/self/status (Linux), and giving freed heap back.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

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

// Returns the free pages inside glibc's heap to the system. Loading frees many temporaries
// between long-lived weights; glibc keeps the holes resident (over 1 GB at E2B in int4) unless
// asked. A no-op elsewhere.
inline void release_free_heap() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace torchtpu
