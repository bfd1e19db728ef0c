#include "util/process.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "util/error.hpp"

extern char** environ;

namespace attnres {

namespace {

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
  if (!child.set_env.empty()) {
    env_strings = child_environment(child.set_env);
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
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, args[0].c_str(), &actions, nullptr, argv.data(),
                               envp.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&actions);
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
  while (::waitpid(pid, &status, 0) < 0) require(errno == EINTR, "waiting for ", name, " failed");
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return result;
}

}  // namespace attnres
