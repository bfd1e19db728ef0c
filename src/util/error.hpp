// One error type for everything a user can cause (bad input, bad files, bad flags).
// The CLI prints its message and exits non-zero; library code never calls exit().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace attnres {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(concat(args...));
}

// Checks a user-facing condition; the message names the file, key or flag at fault.
template <class... Args>
void require(bool ok, const Args&... args) {
  if (!ok) fail(args...);
}

}  // namespace attnres
