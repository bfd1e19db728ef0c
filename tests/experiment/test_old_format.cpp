// Experiment directories written before src/results existed still summarize and report:
// tests/results/data/old-format is a paired experiment (block, rd, prenorm; seeds 1, 2) as the
// runner and `attnres report` of that time wrote it, its summary.json included.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "experiment/fixture.hpp"
#include "analysis/report.hpp"
#include "analysis/summary.hpp"
#include "util/atomic_file.hpp"

namespace attnres::experiment {
using namespace analysis;  // these tests drive the analysis with the experiment's fixtures
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kOldFormat = fs::path(ATTNRES_SOURCE_DIR) / "tests/results/data/old-format";

// Keys that summaries gained after the old one was written: a summary of today may have them
// beside everything the old one had. "instability": computed from the runs' recorded curves.
const char* const kAddedSince[] = {"instability"};

// Same structure, kinds and strings; numbers equal to 12 significant digits (the summary's
// statistics go through exp, log and bisection, which may round differently on another CPU).
void expect_same(const json& a, const json& b, const std::string& where) {
  ASSERT_EQ(a.type(), b.type()) << where;
  if (a.is_object()) {
    std::size_t added = 0;
    for (const char* key : kAddedSince) added += a.contains(key) && !b.contains(key) ? 1 : 0;
    ASSERT_EQ(a.size(), b.size() + added) << where;
    for (const auto& [key, value] : a.items()) {
      if (!b.contains(key) && std::find(std::begin(kAddedSince), std::end(kAddedSince), key) != std::end(kAddedSince))
        continue;
      ASSERT_TRUE(b.contains(key)) << where << "." << key;
      expect_same(value, b[key], where + "." + key);
    }
  } else if (a.is_array()) {
    ASSERT_EQ(a.size(), b.size()) << where;
    for (std::size_t i = 0; i < a.size(); ++i) expect_same(a[i], b[i], where + "[" + std::to_string(i) + "]");
  } else if (a.is_number_float()) {
    const double x = a.get<double>(), y = b.get<double>();
    EXPECT_NEAR(x, y, 1e-12 * std::max(1.0, std::abs(y))) << where;
  } else {
    EXPECT_EQ(a, b) << where;
  }
}

TEST(OldFormat, SummarizesToTheSummaryOfItsTime) {
  const fs::path dir = fs::temp_directory_path() / ("attnres-old-format-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(kOldFormat, dir, fs::copy_options::recursive);
  const ExperimentSummary s = summarize(dir.string());
  EXPECT_EQ(s.runs.size(), 6u);
  EXPECT_TRUE(s.missing.empty());
  ASSERT_EQ(s.routing.size(), 2u);  // prenorm has no depth routing
  EXPECT_TRUE(s.routing[1].two_routes);
  expect_same(json::parse(read_text_file((dir / "summary.json").string())),
              json::parse(read_text_file((kOldFormat / "summary.json").string())), "summary.json");
  const ReportFiles files = write_report(s, (dir / "out").string());
  EXPECT_NE(read_text_file(files.html).find("</html>"), std::string::npos);
  fs::remove_all(dir);
}

TEST(SummaryJson, WithUnavailableValuesReadsBackByteForByte) {
  testing::SyntheticExperiment exp;
  std::filesystem::remove(exp.result_path("block", 2));  // rd is left with one paired seed: n/a values
  summarize(exp.dir());
  const std::string path = results::summary_path(exp.dir());
  const std::string text = read_text_file(path);
  ASSERT_NE(text.find("null"), std::string::npos);
  results::write_summary(path, results::read_summary(path));
  EXPECT_EQ(read_text_file(path), text);
}

}  // namespace
}  // namespace attnres::experiment
