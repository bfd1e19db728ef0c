// util/process: the child process spawner of `experiment` and `bench`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "util/error.hpp"
#include "util/process.hpp"

namespace attnres {
namespace {

ChildProcess shell(const std::string& script, bool capture = true) {
  ChildProcess c;
  c.argv = {"/bin/sh", "-c", script};
  c.capture_stdout = capture;
  return c;
}

TEST(RunChild, ExitStatus) {
  EXPECT_EQ(run_child(shell("exit 0")).status, 0);
  EXPECT_EQ(run_child(shell("exit 3")).status, 3);
  EXPECT_EQ(run_child(shell("exit 255")).status, 255);
}

TEST(RunChild, SignalIs128PlusItsNumber) {
  EXPECT_EQ(run_child(shell("kill -TERM $$")).status, 128 + 15);
  EXPECT_EQ(run_child(shell("kill -KILL $$")).status, 128 + 9);
}

// With a stop flag the child has a process group of its own (a terminal's Ctrl-C reaches the parent
// alone) and gets one SIGINT when the flag turns true, however the parent was asked to stop.
TEST(RunChild, AStopRequestIsPassedOnToTheChildInItsOwnProcessGroup) {
  std::atomic<bool> stop{false};
  ChildProcess c = shell(
      "[ \"$(cut -d' ' -f5 /proc/$$/stat)\" = \"$$\" ] || exit 9; "  // its own process group
      "trap 'exit 7' INT; i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 5",
      false);
  c.stop = &stop;
  std::thread requester([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop.store(true);
  });
  const int status = run_child(c).status;
  requester.join();
  EXPECT_EQ(status, 7) << "9: not in its own process group; 5: the stop request never arrived";
  // Without a flag nothing is passed on, and the child stays in this process' group.
  EXPECT_EQ(run_child(shell("[ \"$(cut -d' ' -f5 /proc/$$/stat)\" = \"$(cut -d' ' -f5 /proc/$PPID/stat)\" ]")).status, 0);
}

TEST(RunChild, CapturesStdoutOnly) {
  const ChildResult r = run_child(shell("printf 'one\\n'; echo to-stderr >&2; printf 'two'; exit 4"));
  EXPECT_EQ(r.output, "one\ntwo");
  EXPECT_EQ(r.status, 4);
  // More than a pipe buffer (64 KiB): read while the child writes.
  const ChildResult big = run_child(shell("head -c 300000 /dev/zero"));
  EXPECT_EQ(big.output.size(), 300000u);
  EXPECT_EQ(big.status, 0);
}

TEST(RunChild, WithoutCaptureNothingIsKept) {
  const ChildResult r = run_child(shell("exit 0", false));
  EXPECT_TRUE(r.output.empty());
  EXPECT_EQ(r.status, 0);
}

TEST(RunChild, SetsAndReplacesEnvironmentVariables) {
  ::setenv("ATTNRES_TEST_PROCESS_A", "inherited", 1);
  ::setenv("ATTNRES_TEST_PROCESS_B", "kept", 1);
  ChildProcess c = shell("echo \"$ATTNRES_TEST_PROCESS_A $ATTNRES_TEST_PROCESS_B $ATTNRES_TEST_PROCESS_C\"; "
                         "env | grep -c '^ATTNRES_TEST_PROCESS_A='");
  c.set_env = {{"ATTNRES_TEST_PROCESS_A", "replaced"}, {"ATTNRES_TEST_PROCESS_C", "new"}};
  EXPECT_EQ(run_child(c).output, "replaced kept new\n1\n");
  // Without edits the environment is inherited as it is.
  EXPECT_EQ(run_child(shell("echo $ATTNRES_TEST_PROCESS_A")).output, "inherited\n");
  ::unsetenv("ATTNRES_TEST_PROCESS_A");
  ::unsetenv("ATTNRES_TEST_PROCESS_B");
}

// The message of the Error run_child throws ("" when it throws none).
std::string start_error(const ChildProcess& c) {
  try {
    run_child(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunChild, AProgramThatCannotStartIsAnError) {
  ChildProcess c;
  c.argv = {"/nonexistent/attnres-test-program"};
  c.capture_stdout = true;
  EXPECT_EQ(start_error(c), "cannot start '/nonexistent/attnres-test-program'");
  c.name = "the test program";
  c.capture_stdout = false;
  EXPECT_EQ(start_error(c), "cannot start the test program");
}

}  // namespace
}  // namespace attnres
