#include "util/process.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "util/error.hpp"

extern char** environ;

namespace attnres {

namespace {

// The child run_child waits for with a stop flag (0: none), for signal_running_child. One value
// for the process, as the signal handlers that read it are.
std::atomic<pid_t> g_running_child{0};
static_assert(std::atomic<pid_t>::is_always_lock_free);

// This process' environment with `set` applied, as "NAME=value" strings.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& [name, value] : set) replaced = replaced || entry.rfind(name + "=", 0) == 0;
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

ChildResult run_child(const ChildProcess& child) {
  require(!child.argv.empty(), "run_child: no program given");
  const std::string name = child.name.empty() ? "'" + child.argv[0] + "'" : child.name;
  std::vector<std::string> args = child.argv;
  std::vector<char*> argv = c_strings(args);
  std::vector<std::string> env_strings;
  std::vector<char*> envp;
  std::vector<std::pair<std::string, std::string>> set_env = child.set_env;
  if (child.stop != nullptr) set_env.emplace_back(kStopAnnouncedByParent, "1");
  if (!set_env.empty()) {
    env_strings = child_environment(set_env);
    envp = c_strings(env_strings);
  }

  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (child.capture_stdout) {
    if (::pipe(fds) != 0) {
      posix_spawn_file_actions_destroy(&actions);
      fail("cannot create a pipe for ", name);
    }
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (child.stop != nullptr) {  // a process group of its own (pgid = its pid)
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, &attributes, argv.data(),
                               envp.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  if (rc == 0 && child.stop != nullptr) g_running_child.store(pid);
  ChildResult result;
  if (child.capture_stdout) {
    ::close(fds[1]);
    if (rc == 0) {
      char buf[4096];
      for (;;) {
        const ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n > 0) result.output.append(buf, static_cast<std::size_t>(n));
        else if (n == 0 || errno != EINTR) break;
      }
    }
    ::close(fds[0]);
  }
  require(rc == 0, "cannot start ", name);
  int status = 0;
  if (child.stop == nullptr) {
    while (::waitpid(pid, &status, 0) < 0) require(errno == EINTR, "waiting for ", name, " failed");
  } else {
    // Polls, so that a stop request is passed on within 50 ms (a captured child has closed its
    // stdout by now, so this wait is for its exit alone).
    bool passed_on = false;
    for (;;) {
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0) {
        if (errno == EINTR) continue;
        g_running_child.store(0);
        fail("waiting for ", name, " failed");
      }
      if (!passed_on && child.stop->load()) {
        ::kill(pid, SIGINT);
        passed_on = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    g_running_child.store(0);
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return result;
}

void signal_running_child(int signal) noexcept {
  const pid_t pid = g_running_child.load();
  if (pid > 0) ::kill(pid, signal);
}

}  // namespace attnres
