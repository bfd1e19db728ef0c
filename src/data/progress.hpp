// Progress of long data jobs on stderr: a line rewritten in place (\r) on a terminal, plain
// lines every few seconds otherwise (logs), nothing when disabled.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace attnres::data {

class Progress {
 public:
  Progress(std::string label, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Cheap to call often: prints only when enough time has passed.
  void update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens);
  // Ends the in-place line and prints `message` on its own line.
  void finish(const std::string& message);
  double seconds() const;

 private:
  void print(const std::string& line);

  std::string label_;
  bool enabled_;
  bool tty_;
  bool dirty_ = false;  // a \r line is on screen
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
};

// "12.3 MB", "4.56M" and similar short forms for messages.
std::string format_bytes(double bytes);
std::string format_count(double count);

}  // namespace attnres::data
