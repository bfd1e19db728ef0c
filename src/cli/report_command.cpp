// `attnres report`: statistics and the Markdown/HTML report of a paired experiment directory.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "cli/commands.hpp"
#include "analysis/report.hpp"
#include "analysis/summary.hpp"
#include "analysis/verdict.hpp"
#include "analysis/tables.hpp"
#include "results/summary.hpp"
#include "util/atomic_file.hpp"

namespace attnres::cli {
namespace {

struct ReportArgs {
  std::string experiment;
  std::string out;  // directory for report.md / report.html; default: the experiment directory
  bool quiet = false;
  bool csv = false;    // also runs.csv and milestones.csv
  double effect = 0;   // 0: none
  std::string answer;  // an arm: print only its one-line answer
};

void run_report(const ReportArgs& args) {
  analysis::SummaryOptions options;
  if (args.effect != 0) options.effect = args.effect;
  if (!args.answer.empty()) {
    const analysis::ExperimentSummary summary = analysis::compute_summary(args.experiment, options);
    std::printf("%s\n", analysis::answer_line(summary, args.answer).c_str());
    return;
  }
  const analysis::ExperimentSummary summary = analysis::compute_summary(args.experiment, options);
  if (!args.quiet) std::printf("%s\n", analysis::format_summary_table(summary).c_str());
  // Everything goes to --out (the report's "All numbers: summary.json" is the one beside it); the
  // experiment directory is only read then, so a committed or shared one stays as it is.
  const std::string out = args.out.empty() ? args.experiment : args.out;
  const analysis::ReportFiles files = analysis::write_report(summary, out);
  const std::string summary_path = results::summary_path(out);
  results::write_summary(summary_path, analysis::summary_file(summary));
  std::printf("summary: %s\n", summary_path.c_str());
  std::printf("report:  %s\n", files.markdown.c_str());
  std::printf("report:  %s\n", files.html.c_str());
  if (args.csv) {
    for (const auto& [name, text] : {std::pair{"runs.csv", analysis::runs_csv(summary)},
                                     std::pair{"milestones.csv", analysis::milestones_csv(summary)}}) {
      const std::string path = (std::filesystem::path(out) / name).string();
      write_text_atomically(path, text);
      std::printf("csv:     %s\n", path.c_str());
    }
  }
}

}  // namespace

void register_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Summarise a paired experiment: paired NLL statistics against the baseline, depth-routing JS divergence,\n"
      "systems costs. Writes summary.json, report.md and report.html (one self-contained page with plots) into\n"
      "--out (default: the experiment directory, which is otherwise only read) and prints the summary table.\n"
      "Unfinished runs are reported as missing. See docs/experiments.md.");
  cmd->add_option("--experiment", args->experiment, "Experiment directory (holds experiment.json and runs/)")
      ->required();
  cmd->add_option("--out", args->out, "Directory for summary.json, report.md and report.html (default: the experiment directory)");
  cmd->add_flag("--quiet", args->quiet, "Do not print the summary table");
  cmd->add_flag("--csv", args->csv,
                "Also write runs.csv (a row per finished run) and milestones.csv (a row per run and validation "
                "milestone) for other tools; columns: docs/experiments.md");
  cmd->add_option("--effect", args->effect,
                  "Also give, for every comparison, the seeds needed to detect this |ΔNLL| in nats with 80% power "
                  "(the paper's 0.030 is always given)")
      ->check(CLI::Range(1e-6, 10.0));
  cmd->add_option("--answer", args->answer,
                  "Print only the one-line answer for this arm against the baseline at the last milestone "
                  "(e.g. --answer rd) and write nothing");
  cmd->callback([args] { run_report(*args); });
}

}  // namespace attnres::cli
