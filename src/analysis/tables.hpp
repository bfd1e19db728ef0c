// The summary as tables: validation and test NLL statistics, routing JS, systems. A Table is
// rendering-neutral; format_summary_table renders the headline ones as aligned text for the
// terminal, the report (analysis/report.hpp) renders them all as Markdown and HTML.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "analysis/summary.hpp"

namespace attnres::analysis {

// MUDD's routing distributions (baselines-spec §6.5), stated next to its numbers wherever they are
// shown (tables, the report): the definition, and a note that says what it is made of.
inline constexpr const char* kMuddRoutingDefinition = "p_c(j) = |dw[c,j]|·‖X_j‖ / Σ_j |dw[c,j]|·‖X_j‖";
std::string mudd_routing_note();

struct Table {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> notes;  // short lines printed under the table
  int left_columns = 1;            // leading text columns; the rest are numbers, right-aligned
};

// Headline tables of one set of arms (the main ones, or a group's): validation NLL per milestone,
// test NLL, power, routing JS means, systems. `detailed` adds JS and the mean depth distributions
// per layer.
std::vector<Table> summary_tables(const ExperimentSummary& summary, bool detailed);

// The looks of a sequential experiment (none without), the baseline-and-twin drift per seed (none
// without a twin), and the runs' instability (every run, or only the unstable ones; none when there
// is nothing to show).
std::optional<Table> sequential_table(const ExperimentSummary& summary);
// Each arm's ΔNLL beside its step-time ratio, its equal-compute multiplier (the baseline tokens
// that reach the arm's NLL, over the arm's) and what that is worth at equal wall-clock time.
std::optional<Table> throughput_table(const ExperimentSummary& summary);
// The arms ranked by validation ΔNLL at the last milestone, with Holm-adjusted p-values over the
// arms compared (ranking_table.cpp); none with fewer than two arms beside the baseline and its twin.
std::optional<Table> ranking_table(const ExperimentSummary& summary);
// The same ranking in one sentence, for the report's key results.
std::optional<std::string> ranking_sentence(const ExperimentSummary& summary);
std::optional<Table> twin_table(const ExperimentSummary& summary);
std::optional<Table> instability_table(const ExperimentSummary& summary, bool every_run);

// A group's title ("Controls 'controls' at 184K tokens, against block trained to the same budget")
// and its tables, titled with it.
std::string group_title(const GroupResults& group);
std::vector<Table> group_tables(const GroupResults& group, bool detailed);

// The depth diagnostics as tables (depth_tables.cpp): routing JS per arm (with `detailed`, per
// layer and the mean distributions), every arm's connections, the n-stream modes' Amax gains.
std::vector<Table> depth_tables(const ExperimentSummary& summary, bool detailed);

// The main comparison beside each probe group's, when there are probes.
std::optional<Table> probe_table(const ExperimentSummary& summary);

// summary_tables of the main arms, the probe table, then every group's tables.
std::vector<Table> all_tables(const ExperimentSummary& summary, bool detailed);

// "One learning rate for every arm (lr 0.004), tuned for none of them: ..." beside a ranking or a
// throughput view: the arms of one comparison ran the baseline's training settings.
std::string one_learning_rate_note(const ExperimentSummary& summary);

// One table as aligned plain text: its title, the header, a rule, the rows and the notes.
std::string format_table_text(const Table& table);
// The experiment line, the finished/missing runs and the headline tables as aligned plain text.
std::string format_summary_table(const ExperimentSummary& summary);
// The finished runs as CSV for other tools (report --csv; docs/experiments.md lists the columns),
// the main arms' then each group's, with a header line. runs.csv: one row per run ("group,arm,seed,
// params,test_nll,final_val_nll,final_tokens,tokens_per_sec,step_time_ms,peak_rss_bytes,unstable");
// milestones.csv: one row per run and validation milestone ("group,arm,seed,step,tokens,val_nll").
// The group of the main arms is "main"; numbers are written exactly (shortest round-trip form),
// integers as integers, an unknown value as an empty field.
std::string runs_csv(const ExperimentSummary& summary);
std::string milestones_csv(const ExperimentSummary& summary);

// What was trained, for a summary's first line: "protocol cpu · 12 layers × 64" for an experiment
// from a protocol file (its model is the file's, over a base preset), "preset small" otherwise.
std::string experiment_brief(const ExperimentSummary& summary);

}  // namespace attnres::analysis
