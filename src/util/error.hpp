// One error type for everything a user can cause (bad input, bad files, bad flags), and one for
// a broken internal invariant (a bug in attnres). The CLI prints the message and exits 1 for the
// first, 2 for the second; library code never calls exit().
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

// A broken internal invariant: a bug in attnres, whatever the input. Deliberately not an Error,
// so that no caller that handles bad input (a protocol's run that fails, a file that is refused)
// takes a bug for the user's mistake.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

template <class... Args>
[[noreturn]] void internal_failure(const char* file_name, int line, const Args&... args) {
  std::string file = file_name;
  if (const auto src = file.rfind("src/"); src != std::string::npos) file.erase(0, src);
  throw InternalError(concat(file, ":", line, ": ", args...));
}

}  // namespace attnres

// Checks an internal invariant (never the user's input: that is require()). The message arguments
// are evaluated only when the check fails, so it may sit in a loop.
#define ATTNRES_CHECK(condition, ...)                                                                  \
  ((condition) ? void(0)                                                                              \
               : ::attnres::internal_failure(__FILE__, __LINE__, "'" #condition "' does not hold" \
                                                 __VA_OPT__(, ": ", ) __VA_ARGS__))
// A place the code cannot reach when its invariants hold (e.g. after a switch over every value).
#define ATTNRES_UNREACHABLE(...) ::attnres::internal_failure(__FILE__, __LINE__, __VA_ARGS__)
