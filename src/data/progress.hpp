// Progress of long data jobs on stderr: a line rewritten in place (\r) on a terminal, plain
// lines every few seconds otherwise (logs), nothing when disabled.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "util/status_line.hpp"

namespace attnres::data {

class Progress {
 public:
  // `documents` names what update() counts ("documents", "training documents").
  Progress(std::string label, bool enabled, std::string documents = "documents");

  // Cheap to call often: the status line prints only when enough time has passed.
  void update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens);
  // Shows the latest update if the status line still shows an earlier one (so it never disagrees
  // with `message`), ends the in-place line and prints `message` on its own line.
  void finish(const std::string& message);
  double seconds() const;

 private:
  std::string label_, documents_;
  StatusLine line_;
  std::string pending_;  // the latest update's line when it was not printed
  bool shown_ = false;   // some update was printed
  std::chrono::steady_clock::time_point start_;
};

// "12.3 MB", "4.56M" and similar short forms for messages.
std::string format_bytes(double bytes);
std::string format_count(double count);

}  // namespace attnres::data
