// Memory figures from /proc (Linux): this process's resident memory and what the system has
// available; and giving freed heap back.
#pragma once

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cstdint>
#include <fstream>
#include <string>

namespace torchtpu {

// A "Field:   N kB" line of a /proc file, in bytes; 0 where /proc is unavailable.
inline int64_t proc_kb_field(const std::string& path, const std::string& field) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return 0;
}
inline int64_t resident_bytes() { return proc_kb_field("/proc/self/status", "VmRSS"); }
inline int64_t peak_resident_bytes() { return proc_kb_field("/proc/self/status", "VmHWM"); }
// What new allocations can take without swapping, as the kernel estimates it.
inline int64_t available_memory_bytes() { return proc_kb_field("/proc/meminfo", "MemAvailable"); }

// Returns the free pages inside glibc's heap to the system. Loading frees many temporaries
// between long-lived weights; glibc keeps the holes resident (over 1 GB at E2B in int4) unless
// asked. A no-op elsewhere.
inline void release_free_heap() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace torchtpu
