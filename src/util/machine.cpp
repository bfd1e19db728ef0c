#include "util/machine.hpp"

#include <unistd.h>

#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

namespace attnres {

namespace {

// The value of /proc/cpuinfo's first line starting with `key` (after ": "); nullopt when none.
std::optional<std::string> cpuinfo_value(const char* key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(std::min(colon + 2, line.size()));
    }
  return std::nullopt;
}

}  // namespace

std::string cpu_model() { return cpuinfo_value("model name").value_or("unknown"); }

std::vector<std::string> cpu_flags() {
  std::istringstream in(cpuinfo_value("flags").value_or(""));
  std::vector<std::string> out;
  for (std::string flag; in >> flag;) out.push_back(flag);
  return out;
}

int online_cores() { return static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)); }

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string openblas_core() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "unknown";
}

std::string getenv_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

double process_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace attnres
