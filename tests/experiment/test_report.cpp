// Report generation: report.md has the tables, report.html is one self-contained page with SVG plots;
// and the `attnres report` command end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "experiment/fixture.hpp"
#include "analysis/plots.hpp"
#include "analysis/report.hpp"
#include "analysis/svg.hpp"
#include "analysis/verdict.hpp"
#include "util/atomic_file.hpp"

namespace attnres::experiment {
using namespace analysis;  // these tests drive the analysis with the experiment's fixtures
namespace {

using testing::SyntheticExperiment;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(Report, WritesMarkdownAndSelfContainedHtml) {
  SyntheticExperiment exp;
  const ExperimentSummary s = summarize(exp.dir());
  const std::string out = exp.dir() + "/out";
  const ReportFiles files = write_report(s, out);
  EXPECT_EQ(files.markdown, out + "/report.md");
  EXPECT_EQ(files.html, out + "/report.html");
  ASSERT_TRUE(std::filesystem::exists(files.markdown));
  ASSERT_TRUE(std::filesystem::exists(files.html));

  const std::string md = read_text_file(files.markdown);
  EXPECT_NE(md.find("| tokens | arm | seeds | mean NLL |"), std::string::npos) << md;
  EXPECT_NE(md.find("| --- | --- | ---: |"), std::string::npos);
  EXPECT_NE(md.find("| 1K | block | 3 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| rd | 2 |"), std::string::npos);
  EXPECT_NE(md.find("rd/seed-3"), std::string::npos);  // the missing run is reported
  EXPECT_NE(md.find("Jensen"), std::string::npos);
  EXPECT_NE(md.find("Systems"), std::string::npos);

  const std::string html = read_text_file(files.html);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  // Plots: validation, ΔNLL, colour scale, heatmaps (block, rd Q/K and V, rd-tied), JS bars, training loss.
  EXPECT_GE(count(html, "<svg"), 9u);
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("<table>"), std::string::npos);
  EXPECT_NE(html.find("#D55E00"), std::string::npos);  // rd's colour
  EXPECT_EQ(html.find("nan"), std::string::npos);      // no unformatted NaN leaked into coordinates
  EXPECT_EQ(html.find("inf\""), std::string::npos);
}

TEST(Report, DepthConnectionsTable) {
  SyntheticExperiment exp;
  for (int seed : {1, 2, 3}) {
    nlohmann::json r = testing::make_result("prenorm", seed);
    r["connections"] = nlohmann::json::array(
        {{{"name", "dwa"}, {"rows", {{{"target", 1}, {"sources", {0, 1}}, {"weights", {0.25, 1.0}}},
                                     {{"target", 2}, {"sources", {0, 2}}, {"weights", {-0.5, 1.125}}}}}}});
    testing::write_json(exp.result_path("prenorm", seed), r);
  }
  const ReportFiles files = write_report(summarize(exp.dir()), exp.dir() + "/out");
  const std::string md = read_text_file(files.markdown);
  EXPECT_NE(md.find("Depth connections: prenorm 'dwa' (mean over 3 seeds)"), std::string::npos) << md;
  EXPECT_NE(md.find("| target | emb | 1 | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | -0.500 |  | 1.125 |"), std::string::npos) << md;  // X1 is not read by row 2
  const std::string html = read_text_file(files.html);
  EXPECT_NE(html.find("<h2>Depth connections</h2>"), std::string::npos);
  EXPECT_NE(html.find("dwa&#39;: mean depth-connection weights"), std::string::npos);  // the heatmap
  EXPECT_NE(html.find("target 2, source 0: -0.500"), std::string::npos);                     // a cell's tooltip
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
}

// MUDD's routing: Q ~ V and K ~ V rows and columns, its K route's distributions and heatmap, and
// the definition of its distributions next to the numbers, in report.md and report.html.
TEST(Report, MuddRoutingRowsAndTheirDefinition) {
  SyntheticExperiment exp(true);
  const ReportFiles files = write_report(summarize(exp.dir()), exp.dir() + "/out");
  const std::string md = read_text_file(files.markdown);
  const std::string definition = "p_c(j) = |dw[c,j]|·‖X_j‖ / Σ_j |dw[c,j]|·‖X_j‖";
  EXPECT_NE(md.find("| mudd | Q ~ V | 3 | 0.1000 (3) | 0.1443 | 0.1500 (2) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| mudd | K ~ V | 3 | 0.1667 (3) | 0.2404 | 0.2500 (2) |"), std::string::npos) << md;
  EXPECT_NE(md.find("| rd | Q/K + V | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| layer | sources | rd | mudd Q ~ V | mudd K ~ V |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | 3 |  | 0.2000 | 0.3000 |"), std::string::npos) << md;  // rd has no layer 2
  EXPECT_NE(md.find("| mudd | 1 | 2 | 0.500 0.500 | 0.200 0.800 | 0.800 0.200 |"), std::string::npos) << md;
  EXPECT_NE(md.find(definition), std::string::npos) << md;
  EXPECT_NE(md.find("mudd: mean JS between its Q, K and V ways"), std::string::npos) << md;  // key results
  const std::string html = read_text_file(files.html);
  EXPECT_NE(html.find(definition), std::string::npos);
  EXPECT_NE(html.find("mudd · K route"), std::string::npos);  // the K route's heatmap
  EXPECT_NE(html.find("mudd · Q route"), std::string::npos);
  EXPECT_NE(html.find("mudd K~V layer 2 (3 sources): JS 0.3000 nats"), std::string::npos);  // a JS bar
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  EXPECT_EQ(html.find("nan"), std::string::npos);
}

TEST(Report, HcConnectionsSayWhatTheyAre) {
  SyntheticExperiment exp;
  const auto hc = [&](const std::string& name) {
    for (int seed : {1, 2, 3}) {
      nlohmann::json r = testing::make_result("prenorm", seed);
      r["connections"] = nlohmann::json::array(
          {{{"name", name}, {"rows", {{{"target", 0}, {"sources", {0}}, {"weights", {1.0}}},
                                      {{"target", 1}, {"sources", {0, 1}}, {"weights", {0.75, 1.5}}}}}}});
      testing::write_json(exp.result_path("prenorm", seed), r);
    }
    return read_text_file(write_report(summarize(exp.dir()), exp.dir() + "/out").markdown);
  };
  std::string md = hc("mhc");
  EXPECT_NE(md.find("Depth connections: prenorm 'mhc'"), std::string::npos) << md;
  EXPECT_NE(md.find("with mHC's H_post, H_res^T and H_pre in those roles"), std::string::npos) << md;
  EXPECT_NE(md.find("then the mean over evaluation tokens"), std::string::npos) << md;
  // Files written before the per-token connections: dynamic HC's static part, said so.
  md = hc("hc_static_part");
  EXPECT_NE(md.find("Dynamic HC: the static part A, B only"), std::string::npos) << md;
  EXPECT_EQ(md.find("then the mean over evaluation tokens"), std::string::npos) << md;
}

TEST(Report, AmaxGainTablePerArm) {
  SyntheticExperiment exp;
  {
    const ReportFiles files = write_report(summarize(exp.dir()), exp.dir() + "/out");
    EXPECT_EQ(read_text_file(files.markdown).find("Amax gain"), std::string::npos);  // no arm records it
    EXPECT_EQ(read_text_file(files.html).find("Amax gain"), std::string::npos);
  }
  for (int seed : {1, 2, 3}) {
    nlohmann::json r = testing::make_result("prenorm", seed);
    r["amax_gain"] = {{"composite_forward_mean", 1.0},      {"composite_forward_max", 1.0000013},
                      {"composite_backward_mean", 1.25},    {"composite_backward_max", 3125.5},
                      {"layer_forward_max", 1.0},           {"layer_backward_max", 2.0}};
    testing::write_json(exp.result_path("prenorm", seed), r);
  }
  const ReportFiles files = write_report(summarize(exp.dir()), exp.dir() + "/out");
  const std::string md = read_text_file(files.markdown);
  EXPECT_NE(md.find("### Amax gain: prenorm (3 seeds)"), std::string::npos) << md;
  EXPECT_NE(md.find("| gain | composite: mean | composite: max | single sublayer: max |"), std::string::npos) << md;
  EXPECT_NE(md.find("| forward (max \\|row sum\\|) | 1 | 1.000001 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| backward (max \\|column sum\\|) | 1.25 | 3125.5 | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("largest absolute row and column sums (MHC-P §3.1"), std::string::npos) << md;  // the definition
  const std::string html = read_text_file(files.html);
  EXPECT_NE(html.find("<h2>Amax gain of the stream mixing</h2>"), std::string::npos);
  EXPECT_NE(html.find("<caption>Amax gain: prenorm (3 seeds)</caption>"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"num\">3125.5</td>"), std::string::npos);
}

// Delta AttnRes's routing_max_weight: the seeds' mean, in summary.json and a line of the report.
TEST(Report, RoutingMaxWeightOfTheArmsThatRecordIt) {
  SyntheticExperiment exp;
  for (int seed : {1, 2, 3}) {
    nlohmann::json r = testing::make_result("block", seed);
    r["routing_max_weight"] = 0.25 * seed;
    testing::write_json(exp.result_path("block", seed), r);
  }
  const ExperimentSummary s = summarize(exp.dir());
  ASSERT_FALSE(s.routing.empty());
  EXPECT_EQ(s.routing[0].arm, "block");
  EXPECT_NEAR(s.routing[0].max_weight, 0.5, 1e-12);
  for (std::size_t i = 1; i < s.routing.size(); ++i) EXPECT_TRUE(std::isnan(s.routing[i].max_weight));
  const std::string path = results::summary_path(exp.dir());
  const std::string text = read_text_file(path);
  EXPECT_NE(text.find("\"routing_max_weight\""), std::string::npos);
  results::write_summary(path, results::read_summary(path));
  EXPECT_EQ(read_text_file(path), text);
  const ReportFiles files = write_report(s, exp.dir() + "/out");
  const std::string md = read_text_file(files.markdown);
  EXPECT_NE(md.find("block: routing_max_weight 0.5000 (Delta AttnRes"), std::string::npos) << md;
  EXPECT_NE(read_text_file(files.html).find("block: routing_max_weight 0.5000"), std::string::npos);
}

TEST(Report, HtmlWithoutRoutingOrCurves) {
  SyntheticExperiment exp;
  // Only prenorm and the baseline finished, without curves or routing.
  for (const std::string arm : {"rd", "rd-tied"})
    for (int seed : {1, 2, 3}) std::filesystem::remove(exp.result_path(arm, seed));
  for (const std::string arm : {"block", "prenorm"})
    for (int seed : {1, 2, 3}) {
      auto r = testing::make_result(arm, seed);
      r.erase("routing");
      r.erase("curve");
      testing::write_json(exp.result_path(arm, seed), r);
    }
  const ExperimentSummary s = compute_summary(exp.dir());
  const std::string html = render_html(s);
  EXPECT_EQ(html.find("Depth routing"), std::string::npos);
  EXPECT_EQ(html.find("Training loss"), std::string::npos);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("nan"), std::string::npos);
}

// Twins of both arms (the demo's design, issue #47): the twin of a compared arm is listed against its
// own arm (its floor), not against the baseline, where it repeated its arm's row; it is left out of
// the ΔNLL plot and the power table; and a floor of 1e-05 nats does not print as 0.0000.
TEST(Report, TwinsOfBothArmsReadAsFloors) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("attnres-twins-" + std::to_string(::getpid()) + "-" + info->name());
  std::filesystem::remove_all(dir);
  const std::vector<std::string> arms = {"block", "block~", "rd", "rd~"};
  testing::write_json(dir / "experiment.json",
                      {{"version", 1}, {"arms", arms}, {"baseline", "block"}, {"seeds", {1, 2, 3}}, {"tokens", 8000},
                       {"milestones", testing::kMilestones}, {"preset", "tiny"}, {"twin_perturbation", 1e-6},
                       {"model", {{"d_model", 64}, {"n_layers", 2}}}, {"train", {{"lr", 0.003}}}});
  for (const std::string& arm : arms)
    for (int seed : {1, 2, 3}) {
      const bool twin = arm.back() == '~';
      nlohmann::json r = testing::make_result(twin ? arm.substr(0, arm.size() - 1) : arm, seed);
      r["arm"] = arm;
      // block~ − block: 1e-5, 2e-5, 3e-5; rd~ − rd: -1e-5, 1e-5, 2e-5 (rd − block: -0.02, -0.03, -0.04)
      const double shift = !twin ? 0 : arm == "block~" ? 1e-5 * seed : (seed == 1 ? -1e-5 : 1e-5 * (seed - 1));
      for (auto& m : r["milestones"]) m["val_nll"] = m["val_nll"].get<double>() + shift;
      r["test_nll"] = r["test_nll"].get<double>() + shift;
      testing::write_json(dir / "runs" / arm / ("seed-" + std::to_string(seed)) / "result.json", r);
    }
  const ExperimentSummary s = compute_summary(dir.string());
  const std::string md = render_markdown(s);
  // rd~ against rd: mean 6.7e-06, sd 1.5e-05; block~ against block: mean 2e-05, sd 1e-05.
  EXPECT_NE(md.find("| rd~ (vs rd) | 3 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| +6.7e-06 ± 1.5e-05 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| +2e-05 ± 1e-05 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| rd's floor |"), std::string::npos) << md;
  EXPECT_EQ(md.find("|  | rd~ | 3 |"), std::string::npos) << md;       // no row of rd~ against block: validation
  EXPECT_EQ(md.find("| rd~ | 3 | 5.1900 |"), std::string::npos) << md;  // and test
  EXPECT_EQ(md.find("0.0000 ± 0.0000"), std::string::npos) << md;
  EXPECT_EQ(md.find("| rd~ | 3 | 0."), std::string::npos) << md;  // no power row for a twin
  const std::string answer = answer_line(s, "rd");
  EXPECT_NE(answer.find("noise floor ±"), std::string::npos) << answer;
  EXPECT_EQ(answer.find("±0.0000"), std::string::npos) << answer;
  // The answer names each arm's own floor, not only the pooled pair's.
  EXPECT_NE(answer.find("from block~ ±1e-05 and rd~ ±1.5e-05"), std::string::npos) << answer;
  const std::string html = render_html(s);
  EXPECT_EQ(html.find("rd~ seed 1 at"), std::string::npos);   // not in the ΔNLL plot
  EXPECT_NE(html.find("block~ seed 1 at"), std::string::npos);  // the baseline's twin is
  EXPECT_NE(html.find("background:" + arm_color(s, "rd~") + "\"></span>rd~ (vs rd)"), std::string::npos);  // its swatch
  std::filesystem::remove_all(dir);
}

TEST(Report, NiceTicks) {
  const std::vector<double> a = nice_ticks(0, 1, 5);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_DOUBLE_EQ(a[3], 0.6);
  const std::vector<double> b = nice_ticks(3.42, 3.87, 6);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_DOUBLE_EQ(b.front(), 3.5);
  EXPECT_DOUBLE_EQ(b.back(), 3.8);
  const std::vector<double> c = nice_ticks(-0.045, 0.012, 6);
  EXPECT_DOUBLE_EQ(c.front(), -0.04);
  EXPECT_DOUBLE_EQ(c.back(), 0.01);
  EXPECT_EQ(std::count(c.begin(), c.end(), 0.0), 1);
  EXPECT_EQ(arm_color("rd", 5), "#D55E00");
  EXPECT_EQ(arm_color("mystery", 0), arm_color("other", 0));
  // A twin has a colour of its own: its original's, halfway to grey (issue #47: block~ was drawn in
  // rd's vermillion, its place in the cycle).
  EXPECT_EQ(arm_color("block~", 1), "#5891B1");
  EXPECT_NE(arm_color("block~", 1), arm_color("rd", 2));
  EXPECT_NE(arm_color("rd~", 3), arm_color("rd", 2));
}

// A curve is an SVG path in relative steps: walking the steps from the start visits every point
// at px's resolution (no drift over many steps), and the text is shorter than absolute points.
TEST(Report, PolylineIsARelativePathThroughEveryPoint) {
  std::vector<Point> points;
  for (int i = 0; i < 240; ++i) points.emplace_back(84.0 + 3.0251 * i, 300.0 - 90.0 * std::exp(-i / 40.0) + 0.37 * (i % 7));
  points.emplace_back(-0.04, -12.96);  // a negative coordinate, and a step of whole pixels
  Svg svg(1000, 380, "curve");
  svg.polyline(points, "#000", 1.2);
  const std::string text = svg.str();
  const auto d0 = text.find("d=\"M");
  ASSERT_NE(d0, std::string::npos) << text.substr(0, 300);
  const std::string d = text.substr(d0 + 3, text.find('"', d0 + 3) - d0 - 3);  // from the M
  const auto l = d.find('l');
  ASSERT_NE(l, std::string::npos);
  double x = 0, y = 0;
  ASSERT_EQ(std::sscanf(d.c_str() + 1, "%lf,%lf", &x, &y), 2);
  EXPECT_NEAR(x, points[0].first, 0.05);
  EXPECT_NEAR(y, points[0].second, 0.05);
  std::istringstream steps(d.substr(l + 1));
  std::string step;
  std::size_t i = 1;
  for (; steps >> step; ++i) {
    double dx = 0, dy = 0;
    ASSERT_EQ(std::sscanf(step.c_str(), "%lf,%lf", &dx, &dy), 2) << step;
    x += dx;
    y += dy;
    ASSERT_LT(i, points.size());
    EXPECT_NEAR(x, points[i].first, 0.05 + 1e-9) << "point " << i;
    EXPECT_NEAR(y, points[i].second, 0.05 + 1e-9) << "point " << i;
  }
  EXPECT_EQ(i, points.size());
  std::string absolute;
  for (const auto& [px_, py_] : points) absolute += px(px_) + "," + px(py_) + " ";
  EXPECT_LT(d.size(), absolute.size() * 3 / 4);
}

int run_cli(const std::string& args, std::string* output) {
  const std::string log = (std::filesystem::temp_directory_path() / ("attnres-report-cli-" + std::to_string(::getpid()))).string();
  const int status = std::system(("'" + std::string(ATTNRES_BINARY) + "' " + args + " >'" + log + "' 2>&1").c_str());
  *output = read_text_file(log);
  std::filesystem::remove(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ReportCommand, EndToEnd) {
  if (!std::filesystem::exists(ATTNRES_BINARY)) GTEST_SKIP() << "attnres binary not built: " << ATTNRES_BINARY;
  SyntheticExperiment exp;
  std::string out;
  ASSERT_EQ(run_cli("report --experiment '" + exp.dir() + "'", &out), 0) << out;
  EXPECT_NE(out.find("Validation NLL"), std::string::npos) << out;
  EXPECT_NE(out.find(exp.dir() + "/report.html"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(exp.dir() + "/summary.json"));
  EXPECT_TRUE(std::filesystem::exists(exp.dir() + "/report.md"));

  // With --out, everything goes there and the experiment directory is only read.
  const std::string before = read_text_file(exp.dir() + "/summary.json");
  std::filesystem::remove(exp.dir() + "/summary.json");
  const std::string elsewhere = exp.dir() + "-report";
  ASSERT_EQ(run_cli("report --experiment '" + exp.dir() + "' --quiet --out '" + elsewhere + "'", &out), 0) << out;
  EXPECT_NE(out.find("summary: " + elsewhere + "/summary.json"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(exp.dir() + "/summary.json")) << "report --out wrote into the experiment";
  EXPECT_EQ(read_text_file(elsewhere + "/summary.json"), before);
  EXPECT_TRUE(std::filesystem::exists(elsewhere + "/report.html"));
  std::filesystem::remove_all(elsewhere);

  std::ofstream(exp.result_path("block", 1)) << "not json";
  ASSERT_EQ(run_cli("report --experiment '" + exp.dir() + "' --quiet", &out), 1) << out;
  EXPECT_NE(out.find("attnres: error: "), std::string::npos) << out;
  EXPECT_NE(out.find("runs/block/seed-1/result.json"), std::string::npos) << out;
}

// Issue #47: the runs and milestones as CSV for other tools, one row per run and per run x
// milestone, every number exactly as in the result files.
TEST(ReportCommand, CsvHoldsARowPerRunAndPerMilestone) {
  if (!std::filesystem::exists(ATTNRES_BINARY)) GTEST_SKIP() << "attnres binary not built: " << ATTNRES_BINARY;
  SyntheticExperiment exp;
  const std::string out_dir = exp.dir() + "-csv";
  std::string out;
  ASSERT_EQ(run_cli("report --experiment '" + exp.dir() + "' --quiet --csv --out '" + out_dir + "'", &out), 0) << out;
  EXPECT_NE(out.find("csv:     " + out_dir + "/runs.csv"), std::string::npos) << out;
  const auto lines = [](const std::string& text) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      std::vector<std::string> fields;
      std::istringstream f(line);
      for (std::string field; std::getline(f, field, ',');) fields.push_back(field);
      if (!line.empty() && line.back() == ',') fields.push_back("");
      rows.push_back(fields);
    }
    return rows;
  };
  const auto runs = lines(read_text_file(out_dir + "/runs.csv"));
  ASSERT_EQ(runs.size(), 1u + 11u);  // 4 arms x 3 seeds, rd's seed 3 missing
  EXPECT_EQ(runs[0], (std::vector<std::string>{"group", "arm", "seed", "params", "test_nll", "final_val_nll",
                                               "final_tokens", "tokens_per_sec", "step_time_ms", "peak_rss_bytes",
                                               "unstable"}));
  bool found = false;
  for (const auto& row : runs) {
    if (row.size() != 11 || row[1] != "rd" || row[2] != "2") continue;
    found = true;
    EXPECT_EQ(row[0], "main");
    EXPECT_EQ(row[3], "1064");
    EXPECT_EQ(std::stod(row[4]), 5.2 + 0.01 * 2 + testing::arm_offset("rd", 2));
    EXPECT_EQ(std::stod(row[5]), testing::base_nll(8000, 2) + testing::arm_offset("rd", 2));
    EXPECT_EQ(row[6], "8000");
    EXPECT_EQ(row[7], "900");  // integers as integers (900.0 in the file)
    EXPECT_EQ(row[9], std::to_string(220 << 20));
    EXPECT_EQ(row[10], "false");
  }
  EXPECT_TRUE(found) << read_text_file(out_dir + "/runs.csv");
  const auto milestones = lines(read_text_file(out_dir + "/milestones.csv"));
  ASSERT_EQ(milestones.size(), 1u + 11u * 4u);
  EXPECT_EQ(milestones[0], (std::vector<std::string>{"group", "arm", "seed", "step", "tokens", "val_nll"}));
  EXPECT_EQ(milestones[1][0], "main");
  EXPECT_EQ(milestones[1][3], "");  // the fixture's milestones record no step
  EXPECT_EQ(std::stod(milestones[1][5]), testing::base_nll(std::stoll(milestones[1][4]), std::stoi(milestones[1][2])) +
                                             testing::arm_offset(milestones[1][1], std::stoi(milestones[1][2])));
  std::filesystem::remove_all(out_dir);
}

}  // namespace
}  // namespace attnres::experiment
