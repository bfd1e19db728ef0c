// The human-readable report of a paired experiment: DIR/report.md (the tables) and DIR/report.html,
// one self-contained page (inline CSS and SVG, no scripts, no external resources) with plots of
// validation NLL against tokens, paired ΔNLL per seed, depth-routing heatmaps, JS per layer,
// training loss, and the tables. The page is assembled here from analysis/plots.hpp and
// analysis/tables.hpp.
#pragma once

#include <string>

#include "analysis/summary.hpp"
#include "analysis/tables.hpp"

namespace attnres::analysis {

struct ReportFiles {
  std::string markdown;
  std::string html;
};

std::string render_markdown(const ExperimentSummary& summary);

// The pieces of the page other reports share (analysis/pool_report.hpp): a table in Markdown, in
// HTML (no arm swatches), and the page's style sheet.
std::string markdown_table(const Table& table);
std::string html_table(const Table& table);
const char* report_css();
std::string render_html(const ExperimentSummary& summary);

// Writes report.md and report.html into out_dir (created if missing), atomically; returns their paths.
ReportFiles write_report(const ExperimentSummary& summary, const std::string& out_dir);

}  // namespace attnres::analysis
