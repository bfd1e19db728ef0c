// Resident memory of this process, from /proc/self/status.
#pragma once

#include <cstdint>

namespace attnres {

// A value of /proc/self/status in bytes (VmRSS: now; VmHWM: peak of this process image); 0 when
// the key or the file is missing.
std::int64_t proc_status_bytes(const char* key);

// Peak resident memory of this process image: VmHWM. Not getrusage's ru_maxrss, which keeps the
// parent's footprint across fork + exec: `experiment` starts each training run from a worker
// that holds a model for the previous run's test pass, and ru_maxrss reported that model's
// memory as the new run's (peak RSS of the same configuration measured 400 or 795 MiB).
std::int64_t peak_rss_bytes();

}  // namespace attnres
