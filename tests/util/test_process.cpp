// util/process: the child process spawner of `experiment` and `bench`.
#include <gtest/gtest.h>

#include <cstdlib>

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
