#include "experiment/tables.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "experiment/format.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
namespace {

std::size_t display_width(const std::string& s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;  // count UTF-8 code points, not bytes
  return n;
}

std::string pad(const std::string& s, std::size_t width, bool left) {
  const std::string fill(width > display_width(s) ? width - display_width(s) : 0, ' ');
  return left ? s + fill : fill + s;
}

std::string delta_cell(const ArmComparison& a) {
  if (a.is_baseline) return "baseline";
  if (a.stats.n == 0) return "n/a";
  if (identical_to_baseline(a)) return "0 (identical)";
  std::string s = format_signed(a.stats.mean, 4);
  if (a.stats.n > 1) s += " ± " + format_number(a.stats.sd, 4);
  return s;
}

std::string ci_cell(const ArmComparison& a) {
  if (a.is_baseline) return "";
  if (std::isnan(a.stats.ci_low)) return "n/a";
  return "[" + format_signed(a.stats.ci_low, 4) + ", " + format_signed(a.stats.ci_high, 4) + "]";
}

Table comparison_table(const ExperimentSummary& s, const std::vector<const Comparison*>& rows, const std::string& title,
                       bool tokens_column) {
  Table t;
  t.title = title;
  if (tokens_column) t.header.push_back("tokens");
  for (const char* h : {"arm", "seeds", "mean NLL", "ΔNLL ± sd", "95% CI", "p", "wins", "ppl change"})
    t.header.push_back(h);
  t.left_columns = tokens_column ? 2 : 1;
  for (const Comparison* c : rows) {
    for (const auto& a : c->arms) {
      std::vector<std::string> row;
      // The milestone is named once, on its first row, so the groups stand out.
      if (tokens_column) row.push_back(&a == &c->arms.front() ? format_tokens(static_cast<double>(c->tokens)) : "");
      row.push_back(a.arm);
      row.push_back(std::to_string(a.values.size()));
      row.push_back(format_number(a.mean, 4));
      row.push_back(delta_cell(a));
      row.push_back(ci_cell(a));
      row.push_back(a.is_baseline ? "" : format_p_value(a.stats.p_value));
      row.push_back(a.is_baseline ? "" : concat(a.stats.wins, "/", a.stats.n));
      row.push_back(a.is_baseline ? "" : format_percent(a.ppl_change, 2));
      t.rows.push_back(std::move(row));
    }
  }
  t.notes = {
      concat("ΔNLL = arm − ", s.spec.baseline,
             " per seed finished in both (negative: the arm is better); mean ± sample sd over those seeds."),
      "95% CI: mean ± t(0.975, n−1)·sd/√n; p: two-sided paired t-test; wins: seeds where the arm's NLL is lower.",
      "ppl change = exp(mean ΔNLL) − 1 (negative: lower perplexity). n/a: fewer than two paired seeds."};
  return t;
}

std::string mib(double bytes) { return std::isfinite(bytes) ? format_printf("%.1f MiB", bytes / 1048576.0) : "n/a"; }

std::string ratio_cell(double r) { return std::isfinite(r) ? format_printf("%.3f×", r) : "n/a"; }

}  // namespace

std::vector<Table> summary_tables(const ExperimentSummary& s, bool detailed) {
  std::vector<Table> tables;
  std::vector<const Comparison*> val;
  for (const auto& c : s.milestones) val.push_back(&c);
  tables.push_back(comparison_table(s, val, "Validation NLL at each milestone, paired against " + s.spec.baseline, true));
  tables.push_back(comparison_table(s, {&s.test},
                                    "Test NLL after " + format_tokens(static_cast<double>(s.spec.tokens)) +
                                        " tokens, paired against " + s.spec.baseline,
                                    false));

  if (!s.routing.empty()) {
    Table t;
    t.title = "Depth routing: Jensen–Shannon divergence between the Q/K and V routes (mean over layers)";
    t.header = {"arm", "routes", "seeds", "JS all layers (nats)", "(bits)", "JS multi-source layers (nats)", "(bits)",
                "estimate"};
    t.left_columns = 2;
    for (const auto& a : s.routing) {
      if (!a.two_routes) {
        t.rows.push_back({a.arm, "Q/K only", std::to_string(a.n_seeds), "", "", "", "", ""});
        continue;
      }
      t.rows.push_back({a.arm, "Q/K + V", std::to_string(a.n_seeds),
                        concat(format_number(a.all_layers.nats, 4), " (", a.all_layers.layers, ")"),
                        format_number(a.all_layers.bits, 4),
                        concat(format_number(a.multi_source_layers.nats, 4), " (", a.multi_source_layers.layers, ")"),
                        format_number(a.multi_source_layers.bits, 4),
                        a.per_token_js ? "per-token" : "of means"});
    }
    t.notes = {
        "Per attention sublayer, JS between the two routes' depth weights, averaged over evaluation tokens, then over "
        "layers (count in brackets).",
        "'all layers' counts single-source sublayers (JS = 0); 'multi-source' leaves them out. Max: ln 2 nats = 1 bit.",
        "estimate 'per-token': the runs' per-token average (the headline); 'of means': JS of the token-averaged "
        "distributions, a lower bound."};
    tables.push_back(std::move(t));

    if (detailed) {
      std::vector<const ArmRouting*> two;
      for (const auto& a : s.routing)
        if (a.two_routes) two.push_back(&a);
      if (!two.empty()) {
        Table d;
        d.title = "Jensen–Shannon divergence per attention sublayer (nats)";
        d.header = {"layer", "sources"};
        for (const auto* a : two) d.header.push_back(a->arm);
        std::map<int, std::vector<std::string>> rows;
        for (std::size_t k = 0; k < two.size(); ++k) {
          for (const auto& l : two[k]->layers) {
            auto& row = rows[l.layer];
            if (row.empty()) row = std::vector<std::string>(2 + two.size(), "");
            row[0] = std::to_string(l.layer);
            row[1] = std::to_string(l.sources);
            row[2 + k] = format_number(l.js_nats, 4);
          }
        }
        for (auto& [layer, row] : rows) d.rows.push_back(std::move(row));
        tables.push_back(std::move(d));
      }
      Table m;
      m.title = "Depth routing: mean distribution over sources per attention sublayer (mean over tokens and seeds)";
      m.header = {"arm", "layer", "sources", "Q/K route", "V route"};
      m.left_columns = 1;
      auto list = [](const std::vector<double>& v) {
        std::string out;
        for (double x : v) out += (out.empty() ? "" : " ") + format_number(x, 3);
        return out;
      };
      for (const auto& a : s.routing)
        for (const auto& l : a.layers)
          m.rows.push_back({a.arm, std::to_string(l.layer), std::to_string(l.sources), list(l.qk_mean),
                            a.two_routes ? list(l.v_mean) : "(one route)"});
      m.notes = {"Sources in order: the token embedding, the completed blocks, then the current block's partial sum "
                 "where the sublayer has one."};
      tables.push_back(std::move(m));
    }
  }

  if (!s.systems.empty()) {
    Table t;
    t.title = "Systems (mean over finished seeds; ratios against " + s.spec.baseline + ")";
    t.header = {"arm", "runs", "params", "Δparams", "tokens/s", "ratio", "step ms", "ratio", "peak RSS", "ratio"};
    for (const auto& a : s.systems) {
      t.rows.push_back({a.arm, std::to_string(a.runs), format_count(a.params),
                        std::isfinite(a.params_overhead) ? format_percent(a.params_overhead, 3) : "n/a",
                        format_number(a.tokens_per_sec, 0), ratio_cell(a.tokens_per_sec_ratio),
                        format_number(a.step_time_ms, 1), ratio_cell(a.step_time_ratio), mib(a.peak_rss_bytes),
                        ratio_cell(a.peak_rss_ratio)});
    }
    t.notes = {"Measured on whatever machine ran each arm; compare ratios only between runs on the same machine."};
    tables.push_back(std::move(t));
  }
  return tables;
}

std::string format_summary_table(const ExperimentSummary& s) {
  std::string out = concat("Experiment ", s.dir, ": ", s.spec.arms.size(), " arms, ", s.spec.seeds.size(), " seeds, ",
                           format_tokens(static_cast<double>(s.spec.tokens)), " tokens per run",
                           s.spec.preset.empty() ? "" : ", preset " + s.spec.preset, "; baseline ", s.spec.baseline,
                           "\n");
  out += concat("Finished runs: ", s.runs.size(), " of ", s.runs.size() + s.missing.size());
  if (!s.missing.empty()) {
    out += "; missing:";
    for (const auto& m : s.missing) out += concat(" ", m.arm, "/seed-", m.seed);
  }
  out += "\n";
  for (const Table& t : summary_tables(s, false)) {
    std::vector<std::size_t> width(t.header.size(), 0);
    for (std::size_t c = 0; c < t.header.size(); ++c) width[c] = display_width(t.header[c]);
    for (const auto& row : t.rows)
      for (std::size_t c = 0; c < row.size() && c < width.size(); ++c)
        width[c] = std::max(width[c], display_width(row[c]));
    auto line = [&](const std::vector<std::string>& cells) {
      std::string l = " ";
      for (std::size_t c = 0; c < width.size(); ++c) {
        const std::string cell = c < cells.size() ? cells[c] : "";
        l += " " + pad(cell, width[c], static_cast<int>(c) < t.left_columns);
      }
      while (!l.empty() && l.back() == ' ') l.pop_back();
      return l + "\n";
    };
    out += "\n" + t.title + "\n" + line(t.header);
    std::size_t total = 1;
    for (auto w : width) total += w + 1;
    out += "  " + std::string(total - 2, '-') + "\n";
    for (const auto& row : t.rows) out += line(row);
    for (const auto& n : t.notes) out += "  " + n + "\n";
  }
  return out;
}

}  // namespace attnres::experiment
