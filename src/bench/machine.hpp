// What a benchmark reports about the machine and its own process: CPU name, cores, load average,
// the OpenBLAS core, resident memory (/proc/self/status) and CPU time.
#pragma once

#include <cstdint>
#include <string>

namespace attnres::bench {

std::string cpu_model();     // /proc/cpuinfo's first "model name", or "unknown"
int online_cores();          // sysconf(_SC_NPROCESSORS_ONLN)
std::string load_average();  // the 1, 5 and 15 minute load averages, e.g. "1.20 0.95 0.80"
std::string openblas_core(); // openblas_get_corename(), or "unknown"

// A variable of the environment, or `fallback` when it is unset.
std::string getenv_or(const char* name, const char* fallback);

// A value of /proc/self/status in bytes (VmRSS: now; VmHWM: peak of this process image, which,
// unlike getrusage's ru_maxrss, does not inherit the parent's footprint across fork + exec).
std::int64_t proc_status_bytes(const char* key);

// CPU time of this process, all threads, in seconds.
double process_cpu_seconds();

}  // namespace attnres::bench
