// What a benchmark and a result's provenance report about the machine and its own process: CPU name
// and flags, cores, load average, the OpenBLAS core and CPU time (resident memory: util/memory.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/memory.hpp"  // proc_status_bytes, peak_rss_bytes

namespace attnres {

std::string cpu_model();     // /proc/cpuinfo's first "model name", or "unknown"
std::vector<std::string> cpu_flags();  // /proc/cpuinfo's first "flags" line, split; empty when none
int online_cores();          // sysconf(_SC_NPROCESSORS_ONLN)
std::string load_average();  // the 1, 5 and 15 minute load averages, e.g. "1.20 0.95 0.80"
std::string openblas_core(); // openblas_get_corename(), or "unknown"

// A variable of the environment, or `fallback` when it is unset.
std::string getenv_or(const char* name, const char* fallback);

// CPU time of this process, all threads, in seconds.
double process_cpu_seconds();

}  // namespace attnres
