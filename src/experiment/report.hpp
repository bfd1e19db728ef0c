// The human-readable report of a paired experiment: DIR/report.md (the tables) and DIR/report.html,
// one self-contained page (inline CSS and SVG, no scripts, no external resources) with plots of
// validation NLL against tokens, paired ΔNLL per seed, depth-routing heatmaps, JS per layer,
// training loss, and the systems table.
#pragma once

#include <string>
#include <vector>

#include "experiment/summary.hpp"

namespace attnres::experiment {

struct ReportFiles {
  std::string markdown;
  std::string html;
};

std::string render_markdown(const ExperimentSummary& summary);
std::string render_html(const ExperimentSummary& summary);

// Writes report.md and report.html into out_dir (created if missing), atomically; returns their paths.
ReportFiles write_report(const ExperimentSummary& summary, const std::string& out_dir);

// Axis ticks at 1, 2 or 5 × 10^k covering [lo, hi], about target_count of them.
std::vector<double> nice_ticks(double lo, double hi, int target_count);

// The colour of an arm in every plot: fixed for the known arms (colour-blind-safe palette), else by
// its index in the experiment's arm list.
std::string arm_color(const std::string& arm, std::size_t index);

}  // namespace attnres::experiment
