#include "hub/progress.h"

#include <unistd.h>

#include <cstdio>

namespace torchtpu::hub {
namespace {

constexpr auto kBarInterval = std::chrono::milliseconds(100);
constexpr auto kLineInterval = std::chrono::seconds(10);
constexpr int kBarWidth = 30;

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::string human_bytes(double n) {
  static const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (n >= 1000 && u < 4) {
    n /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", n, kUnits[u]);
  return buf;
}

Progress::Progress(bool enabled) : enabled_(enabled), tty_(isatty(STDERR_FILENO) == 1) {}

void Progress::start(const std::string& name, int64_t total, int64_t done) {
  name_ = name;
  total_ = total;
  done_ = start_done_ = done;
  started_ = last_draw_ = Clock::now();
  drawn_ = false;
  if (!enabled_) return;
  if (tty_) {
    draw(false);
  } else {
    std::string line = "downloading " + name + " (" + human_bytes(total) + ")";
    if (done > 0) line += ", resuming at " + human_bytes(done);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void Progress::add(int64_t n) {
  done_ += n;
  if (!enabled_) return;
  const Clock::duration interval = tty_ ? Clock::duration(kBarInterval) : kLineInterval;
  auto now = Clock::now();
  if (now - last_draw_ >= interval) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::reset(int64_t done) {
  done_ = start_done_ = done;
  started_ = Clock::now();
}

void Progress::finish() {
  if (enabled_) draw(true);
  name_.clear();
}

void Progress::note(const std::string& line) {
  if (enabled_ && tty_ && drawn_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  drawn_ = false;
}

void Progress::draw(bool final) {
  double elapsed = seconds(Clock::now() - started_);
  double rate = elapsed > 0 ? (done_ - start_done_) / elapsed : 0;
  int pct = total_ > 0 ? static_cast<int>(100.0 * done_ / total_) : 100;
  std::string sizes = human_bytes(done_) + " / " + human_bytes(total_);
  if (tty_) {
    int filled = kBarWidth * pct / 100;
    std::string bar(filled, '#');
    bar.resize(kBarWidth, '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %3d%% %s %s/s%s", name_.c_str(), bar.c_str(), pct,
                 sizes.c_str(), human_bytes(rate).c_str(), final ? "\n" : "");
    drawn_ = !final;
  } else if (final) {
    std::fprintf(stderr, "done %s: %s in %.1f s (%s/s)\n", name_.c_str(),
                 human_bytes(total_).c_str(), elapsed, human_bytes(rate).c_str());
  } else {
    std::fprintf(stderr, "  %s %d%% %s %s/s\n", name_.c_str(), pct, sizes.c_str(),
                 human_bytes(rate).c_str());
  }
  std::fflush(stderr);
}

}  // namespace torchtpu::hub
