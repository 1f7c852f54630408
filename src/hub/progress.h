// Download progress on stderr: a bar redrawn in place on a terminal, plain lines otherwise (logs,
// CI), nothing when disabled. stdout stays free for the command's result.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace torchtpu::hub {

class Progress {
 public:
  explicit Progress(bool enabled);
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // A file starts: `total` bytes, of which `done` are already on disk (a resumed download).
  void start(const std::string& name, int64_t total, int64_t done);
  void add(int64_t n);
  // The transfer restarted at `done` bytes (a retry or a server that ignored the Range).
  void reset(int64_t done);
  void finish();
  // A line of its own (a warning, a retry), printed even when progress is disabled.
  void note(const std::string& line);

 private:
  using Clock = std::chrono::steady_clock;
  void draw(bool final);

  bool enabled_;
  bool tty_;
  std::string name_;
  int64_t total_ = 0;
  int64_t done_ = 0;
  int64_t start_done_ = 0;
  Clock::time_point started_;
  Clock::time_point last_draw_;
  bool drawn_ = false;
};

// "1.5 MB", "312 B": sizes as people read them.
std::string human_bytes(double n);

}  // namespace torchtpu::hub
