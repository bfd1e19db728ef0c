// Shared by the CLI suites (test_cli.cpp, test_cli_safety.cpp): a tiny training budget and the
// check that a command fails as a user error naming what it should.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/cli_util.hpp"
#include "common/tiny_model.hpp"

namespace attnres::testing {

// 8 steps of 4 x 32 tokens of a model small enough for tests.
inline const std::string kTiny = kTinyModel + " --set train.tokens=1024 --set train.eval_tokens=256 "
                                              "--set train.checkpoint_every=4 --set train.threads=1";

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The command exits 1 (a user error, not an internal one) and its output holds every part.
inline void expect_user_error(const std::string& args, const std::vector<std::string>& parts) {
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  for (const auto& p : parts) EXPECT_TRUE(contains(r.output, p)) << args << "\nwanted: " << p << "\n" << r.output;
  EXPECT_FALSE(contains(r.output, "internal error")) << args << "\n" << r.output;
}

}  // namespace attnres::testing
