#include "data/progress.hpp"

#include <algorithm>
#include <cstdio>

namespace attnres::data {

std::string format_bytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) std::snprintf(buf, sizeof buf, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6) std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  else if (bytes >= 1e3) std::snprintf(buf, sizeof buf, "%.1f kB", bytes / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  return buf;
}

std::string format_count(double count) {
  char buf[32];
  if (count >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", count / 1e9);
  else if (count >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", count / 1e6);
  else if (count >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", count / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", count);
  return buf;
}

Progress::Progress(std::string label, bool enabled, std::string documents)
    : label_(std::move(label)), documents_(std::move(documents)), line_(enabled),
      start_(std::chrono::steady_clock::now()) {}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(std::uint64_t bytes, std::uint64_t documents, std::uint64_t tokens) {
  const double s = std::max(seconds(), 1e-9);
  std::string line = label_ + ": " + format_bytes(static_cast<double>(bytes)) + ", " +
                     format_count(static_cast<double>(documents)) + " " + documents_;
  if (tokens != 0)
    line += ", " + format_count(static_cast<double>(tokens)) + " tokens (" +
            format_count(static_cast<double>(tokens) / s) + " tokens/s)";
  if (line_.update(line)) {
    shown_ = true;
    pending_.clear();
  } else {
    pending_ = std::move(line);
  }
}

void Progress::finish(const std::string& message) {
  if (shown_ && !pending_.empty()) line_.update(pending_, true);
  pending_.clear();
  line_.message(label_ + ": " + message);
}

}  // namespace attnres::data
