// `attnres report`: statistics and the Markdown/HTML report of a paired experiment directory.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "cli/commands.hpp"
#include "analysis/pool_report.hpp"
#include "analysis/report.hpp"
#include "analysis/stats.hpp"
#include "analysis/summary.hpp"
#include "analysis/verdict.hpp"
#include "analysis/tables.hpp"
#include "experiment/pool.hpp"
#include "results/summary.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::cli {
namespace {

struct ReportArgs {
  std::string experiment;
  std::string out;  // directory for report.md / report.html; default: the experiment directory
  bool quiet = false;
  bool csv = false;    // also runs.csv and milestones.csv
  double effect = 0;   // 0: none
  std::string answer;  // an arm: print only its one-line answer
  std::vector<std::string> pool;  // experiment directories: pool the answer for `answer` over them
  std::string baseline;           // with pool: the baseline ("" the first directory's)
};

// `--pool DIR... --answer ARM`: every design of every directory comparing ARM with the baseline,
// and their random-effects meta-analysis (experiment/pool.hpp, docs/experiments.md "Pooling studies").
void run_pool(const ReportArgs& args) {
  require(!args.answer.empty(), "--pool needs --answer ARM: the arm whose comparison with the baseline is pooled");
  experiment::PoolOptions options;
  options.arm = args.answer;
  options.baseline = args.baseline;
  options.effect = args.effect != 0 ? args.effect : analysis::kPaperEffectNats;
  const results::Pool pool = experiment::pool_studies(args.pool, options);
  if (!args.quiet) std::printf("%s", analysis::format_pool_text(pool).c_str());
  if (args.out.empty()) return;
  const analysis::PoolFiles files = analysis::write_pool_report(pool, args.out);
  std::printf("pool:    %s\nreport:  %s\nreport:  %s\n", files.json.c_str(), files.markdown.c_str(), files.html.c_str());
}

void run_report(const ReportArgs& args) {
  if (!args.pool.empty()) return run_pool(args);
  require(!args.experiment.empty(), "report needs --experiment DIR (or --pool DIR ... --answer ARM)");
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
      "Unfinished runs are reported as missing.\n"
      "With --pool DIR [DIR ...] --answer ARM instead: what every given study says about ARM against the baseline,\n"
      "one estimate per design (the main arms and each group comparing ARM with it) and their random-effects\n"
      "meta-analysis (DerSimonian-Laird, Hartung-Knapp-Sidik-Jonkman interval), with a futility statement at\n"
      "--effect (default 0.030); --out writes pool.json, pool.md and pool.html (a forest plot). See\n"
      "docs/experiments.md.");
  CLI::Option* experiment =
      cmd->add_option("--experiment", args->experiment, "Experiment directory (holds experiment.json and runs/)");
  CLI::Option* pool = cmd->add_option("--pool", args->pool,
                                      "Experiment directories whose designs comparing --answer ARM with the baseline "
                                      "are pooled (instead of --experiment)")
                          ->expected(1, -1);
  experiment->excludes(pool);
  cmd->add_option("--baseline", args->baseline, "With --pool: the baseline arm (default: the first directory's)")
      ->needs(pool);
  cmd->add_option("--out", args->out,
                  "Directory for summary.json, report.md and report.html (default: the experiment directory); with "
                  "--pool, for pool.json, pool.md and pool.html (default: none written)");
  cmd->add_flag("--quiet", args->quiet, "Do not print the summary table (with --pool: the table and pooled line)");
  cmd->add_flag("--csv", args->csv,
                "Also write runs.csv (a row per finished run) and milestones.csv (a row per run and validation "
                "milestone) for other tools; columns: docs/experiments.md");
  cmd->add_option("--effect", args->effect,
                  "Also give, for every comparison, the seeds needed to detect this |ΔNLL| in nats with 80% power "
                  "(the paper's 0.030 is always given); with --pool, the effect of the futility statement "
                  "(default 0.030)")
      ->check(CLI::Range(1e-6, 10.0));
  cmd->add_option("--answer", args->answer,
                  "Print only the one-line answer for this arm against the baseline at the last milestone "
                  "(e.g. --answer rd) and write nothing; with --pool, the arm whose comparison is pooled");
  cmd->callback([args] { run_report(*args); });
}

}  // namespace attnres::cli
