// The renderings of a pooled comparison (results/pool.hpp, made by experiment/pool.hpp): the table
// of designs and the pooled line for the terminal, pool.md, and pool.html with a forest plot.
#pragma once

#include <string>

#include "analysis/tables.hpp"
#include "results/pool.hpp"

namespace attnres::analysis {

// One row per design: the study, its design (width, depth, lr, tokens, precision, CPU, seeds), its
// ΔNLL with s.e. and 95% CI, and its random-effects weight.
Table pool_table(const results::Pool& pool);

// The table, the pooled line and the futility statement, as printed by `attnres report --pool`.
std::string format_pool_text(const results::Pool& pool);

// The forest plot: each design's ΔNLL with its 95% CI (a square sized by its weight), the pooled
// diamond, the zero line and the −E line (a gain of the futility effect).
std::string plot_forest(const results::Pool& pool);

std::string render_pool_markdown(const results::Pool& pool);
std::string render_pool_html(const results::Pool& pool);

struct PoolFiles {
  std::string json, markdown, html;
};

// Writes pool.json, pool.md and pool.html into out_dir (created if missing), each atomically.
PoolFiles write_pool_report(const results::Pool& pool, const std::string& out_dir);

}  // namespace attnres::analysis
