// `attnres report`: statistics and the Markdown/HTML report of a paired experiment directory.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "experiment/report.hpp"
#include "experiment/summary.hpp"
#include "experiment/tables.hpp"

namespace attnres::cli {
namespace {

struct ReportArgs {
  std::string experiment;
  std::string out;  // directory for report.md / report.html; default: the experiment directory
  bool quiet = false;
};

void run_report(const ReportArgs& args) {
  const experiment::ExperimentSummary summary = experiment::summarize(args.experiment);
  if (!args.quiet) std::printf("%s\n", experiment::format_summary_table(summary).c_str());
  const experiment::ReportFiles files =
      experiment::write_report(summary, args.out.empty() ? args.experiment : args.out);
  std::printf("summary: %s\n", (std::filesystem::path(args.experiment) / "summary.json").c_str());
  std::printf("report:  %s\n", files.markdown.c_str());
  std::printf("report:  %s\n", files.html.c_str());
}

}  // namespace

void register_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Summarise a paired experiment: paired NLL statistics against the baseline, depth-routing JS divergence,\n"
      "systems costs. Writes DIR/summary.json, DIR/report.md and DIR/report.html (one self-contained page with\n"
      "plots) and prints the summary table. Unfinished runs are reported as missing. See docs/experiments.md.");
  cmd->add_option("--experiment", args->experiment, "Experiment directory (holds experiment.json and runs/)")
      ->required();
  cmd->add_option("--out", args->out, "Directory for report.md and report.html (default: the experiment directory)");
  cmd->add_flag("--quiet", args->quiet, "Do not print the summary table");
  cmd->callback([args] { run_report(*args); });
}

}  // namespace attnres::cli
