// A status line on stderr for long jobs: rewritten in place (\r) on a terminal, printed as
// plain lines at most every `interval` seconds otherwise (logs), nothing when disabled.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace attnres {

class StatusLine {
 public:
  explicit StatusLine(bool enabled, double log_interval_seconds = 10.0)
      : enabled_(enabled), tty_(::isatty(STDERR_FILENO) == 1), interval_(log_interval_seconds) {}
  ~StatusLine() { end_line(); }
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;

  // Prints when due (a terminal refreshes 4 times a second); force prints now. Returns whether
  // it printed.
  bool update(const std::string& line, bool force = false) {
    if (!enabled_) return false;
    const auto now = std::chrono::steady_clock::now();
    const double since = std::chrono::duration<double>(now - last_).count();
    if (!force && since < (tty_ ? 0.25 : interval_)) return false;
    last_ = now;
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      dirty_ = true;
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
    return true;
  }

  // A message on a line of its own (ends the in-place line first).
  void message(const std::string& text) {
    if (!enabled_) return;
    end_line();
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }

 private:
  void end_line() {
    if (dirty_) std::fprintf(stderr, "\n");
    dirty_ = false;
  }

  bool enabled_;
  bool tty_;
  double interval_;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace attnres
