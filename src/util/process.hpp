// Running another program, or this one again, as a child process and waiting for it: the one
// spawner behind `experiment` (a training process per run) and `bench` (a worker per measurement).
#pragma once

#include <atomic>
#include <string>
#include <utility>
#include <vector>

namespace attnres {

// The running executable itself, even if its file was rebuilt or removed since it started.
inline constexpr const char* kSelfExecutable = "/proc/self/exe";

// Set (to "1") in the environment of a child run with a stop flag: its parent announces the stops
// on the terminal and passes them on, so the child's signal handlers stop it without saying so
// again (each Ctrl-C message was printed by both).
inline constexpr const char* kStopAnnouncedByParent = "ATTNRES_STOP_ANNOUNCED_BY_PARENT";

struct ChildProcess {
  std::vector<std::string> argv;  // argv[0]: the program's path (not searched for on PATH)
  // Variables set for the child, replacing inherited ones of the same name; the rest of this
  // process' environment is inherited.
  std::vector<std::pair<std::string, std::string>> set_env;
  bool capture_stdout = false;  // else the child writes to this process' stdout; stderr is always shared
  std::string name;             // the child in error messages (default: argv[0] in quotes)
  // A stop request of this process (its SIGINT/SIGTERM handler's flag). When given, the child runs
  // in a process group of its own, so a terminal's Ctrl-C reaches this process alone, and this
  // process passes the request on as one SIGINT: the child stops the same way whether the signal
  // came from a terminal, from `kill` or `timeout` aimed at this process, or from a scheduler.
  const std::atomic<bool>* stop = nullptr;
};

struct ChildResult {
  int status = -1;     // the exit status, or 128 + the number of the signal that ended it
  std::string output;  // its stdout, when captured
};

// Starts the child and waits for it to end (retrying on EINTR). Throws Error when it cannot be
// started.
ChildResult run_child(const ChildProcess& child);

// Sends `signal` to the child that run_child is waiting for with a stop flag, if any. Async-signal-
// safe: for a signal handler that stops this process at once (the child must not outlive it).
void signal_running_child(int signal) noexcept;

}  // namespace attnres
