#include "util/memory.hpp"

#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace attnres {

std::int64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::atoll(line.c_str() + prefix.size()) * 1024;
  return 0;
}

std::int64_t peak_rss_bytes() {
  const std::int64_t hwm = proc_status_bytes("VmHWM");
  if (hwm > 0) return hwm;
  rusage usage{};  // no /proc: the best there is
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace attnres
