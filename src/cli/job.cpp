// How a command runs: as a job (one process, or one rank of an MPI job whose error aborts them all),
// and the stop signals that end training cleanly.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "cli/commands.hpp"
#include "util/process.hpp"

namespace attnres::cli {

namespace {

// The first SIGINT/SIGTERM only sets a flag: the training loop finishes its step, saves a
// checkpoint and returns. A second one ends the process at once (exit 128 + signal): files are
// written through temporaries (util/atomic_file), so a checkpoint being written is simply not
// renamed into place and the previous one stays whole. Only async-signal-safe calls here.
std::atomic<bool> g_stop_requested{false};
std::atomic<int> g_stop_signal{0};  // the first signal, for the exit status (128 + it)
// A child whose parent announces the stops (util/process.hpp, kStopAnnouncedByParent) stops silently.
std::atomic<bool> g_quiet_stops{false};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

void say(const char* text, std::size_t size) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, size);
  (void)ignored;
}

extern "C" void request_stop(int signal) {
  if (g_stop_requested.exchange(true)) {
    static constexpr char kNow[] = "\nattnres: second signal: stopping now (the last saved checkpoint is kept)\n";
    if (!g_quiet_stops.load()) say(kNow, sizeof kNow - 1);
    signal_running_child(signal);  // a training child in its own process group stops now too
    ::_exit(128 + signal);
  }
  g_stop_signal.store(signal);
  static constexpr char kSoon[] = "\nattnres: stopping after this step and saving a checkpoint; signal again to stop now\n";
  if (!g_quiet_stops.load()) say(kSoon, sizeof kSoon - 1);
}

}  // namespace

const std::atomic<bool>* install_stop_handlers() {
  const char* announced = std::getenv(kStopAnnouncedByParent);
  g_quiet_stops.store(announced != nullptr && std::string(announced) == "1");
  struct sigaction action {};
  action.sa_handler = request_stop;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a write in progress continues instead of failing with EINTR
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  return &g_stop_requested;
}

int stop_signal() { return g_stop_signal.load(); }

void run_as_job(const std::function<void(dist::Communicator&)>& command) {
  dist::Communicator comm = dist::Communicator::from_environment();
  if (!comm.distributed()) {
    command(comm);
    return;
  }
  try {
    command(comm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnres: error on %s: %s\n", comm.describe().c_str(), e.what());
    comm.abort(1);
  }
}

}  // namespace attnres::cli
