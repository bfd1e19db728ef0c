// The two kinds of failure: a user's (Error, exit 1) and a bug's (InternalError, exit 2).
#include <gtest/gtest.h>

#include <string>

#include "util/error.hpp"
#include "util/text.hpp"

namespace attnres {
namespace {

int g_evaluated = 0;
int count_evaluation() { return ++g_evaluated; }

TEST(InternalCheck, PassesSilentlyWithoutEvaluatingTheMessage) {
  g_evaluated = 0;
  ATTNRES_CHECK(1 + 1 == 2, "never built: ", count_evaluation());
  EXPECT_EQ(g_evaluated, 0);
}

TEST(InternalCheck, AFailureIsAnInternalErrorNamingFileLineConditionAndMessage) {
  const int line = __LINE__ + 2;
  try {
    ATTNRES_CHECK(2 < 1, "the value was ", 7);
    FAIL() << "ATTNRES_CHECK(false) returned";
  } catch (const Error&) {
    FAIL() << "an internal check threw the user's error type";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("test_error.cpp:" + std::to_string(line) + ": "), std::string::npos) << what;
    EXPECT_NE(what.find("'2 < 1' does not hold: the value was 7"), std::string::npos) << what;
  }
}

TEST(InternalCheck, WithoutAMessageItNamesTheCondition) {
  try {
    ATTNRES_CHECK(g_evaluated < 0);
    FAIL() << "ATTNRES_CHECK(false) returned";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("'g_evaluated < 0' does not hold"), std::string::npos) << e.what();
  }
}

TEST(InternalCheck, UnreachableThrowsAnInternalError) {
  EXPECT_THROW(ATTNRES_UNREACHABLE("mode ", 9, " has no record"), InternalError);
}

TEST(UserError, RequireThrowsTheUserErrorWithTheMessage) {
  try {
    require(false, "key '", "lr", "' must be positive");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "key 'lr' must be positive");
  }
}

// Issue #47: "1 documents" and pasted hints that broke on a space: one helper for each.
TEST(MessageText, CountsAgreeWithTheirNoun) {
  EXPECT_EQ(counted(1, "document"), "1 document");
  EXPECT_EQ(counted(0, "document"), "0 documents");
  EXPECT_EQ(counted(2, "empty document"), "2 empty documents");
  EXPECT_EQ(counted(3, "entry", "entries"), "3 entries");
}

TEST(MessageText, PathsInHintsAreQuotedForTheShell) {
  EXPECT_EQ(shell_quote("runs/exp-small"), "runs/exp-small");
  EXPECT_EQ(shell_quote("sp:/data/tok.model"), "sp:/data/tok.model");
  EXPECT_EQ(shell_quote("my runs/exp"), "'my runs/exp'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote(""), "''");
}

}  // namespace
}  // namespace attnres
