#include "analysis/tables.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "analysis/format.hpp"
#include "analysis/provenance.hpp"
#include "analysis/stats.hpp"
#include "analysis/verdict.hpp"
#include "results/instability.hpp"
#include "model/arms.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
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

std::string delta_cell(const ArmComparison& a, const PairedSummary& p) {
  if (a.is_baseline) return "baseline";
  if (p.n == 0) return "n/a";
  if (identical_to_baseline(a)) return "0 (identical)";
  std::string s = format_signed_nats(p.mean);
  if (p.n > 1) s += " ± " + format_nats(p.sd);
  return s;
}

std::string ci_cell(const ArmComparison& a, const PairedSummary& p) {
  if (a.is_baseline) return "";
  if (std::isnan(p.ci_low)) return "n/a";
  return "[" + format_signed_nats(p.ci_low) + ", " + format_signed_nats(p.ci_high) + "]";
}

std::string delta_cell(const ArmComparison& a) { return delta_cell(a, a.stats); }
std::string ci_cell(const ArmComparison& a) { return ci_cell(a, a.stats); }

// The twin of a compared arm (rd~) is that arm's floor: its row is its ΔNLL against its own arm, seed
// by seed, not against the baseline (where it would repeat its arm's row). None for other arms.
std::optional<PairedSummary> against_own_arm(const Comparison& c, const ArmComparison& a, const std::string& baseline) {
  if (!is_twin(a.arm) || twin_original(a.arm) == baseline) return std::nullopt;
  const ArmComparison* own = c.find(twin_original(a.arm));
  if (own == nullptr) return std::nullopt;
  std::vector<double> d;
  for (const SeedValue& t : a.values)
    for (const SeedValue& o : own->values)
      if (o.seed == t.seed) d.push_back(t.value - o.value);
  const PairedStats p = paired_stats(d);
  PairedSummary out;
  out.n = p.n;
  out.mean = p.n > 0 ? p.mean : results::kNotAvailable;
  out.sd = p.n > 1 ? p.sd : results::kNotAvailable;
  out.ci_low = p.n > 1 ? p.ci_low : results::kNotAvailable;
  out.ci_high = p.n > 1 ? p.ci_high : results::kNotAvailable;
  out.p_value = p.n > 1 ? p.p_value : results::kNotAvailable;
  out.wins = p.wins;
  return out;
}

Table comparison_table(const ExperimentSummary& s, const std::vector<const Comparison*>& rows, const std::string& title,
                       bool tokens_column) {
  Table t;
  t.title = title;
  if (tokens_column) t.header.push_back("tokens");
  const bool floor = std::any_of(rows.begin(), rows.end(), [](const Comparison* c) {
    return std::any_of(c->arms.begin(), c->arms.end(), [](const ArmComparison& a) { return a.floor.has_value(); });
  });
  for (const char* h : {"arm", "seeds", "mean NLL", "ΔNLL ± sd", "95% CI", "p", "wins", "ppl change"})
    t.header.push_back(h);
  if (floor) t.header.push_back("floor");
  t.left_columns = tokens_column ? 2 : 1;
  for (const Comparison* c : rows) {
    for (const auto& a : c->arms) {
      std::vector<std::string> row;
      // The milestone is named once, on its first row, so the groups stand out.
      if (tokens_column) row.push_back(&a == &c->arms.front() ? format_tokens(static_cast<double>(c->tokens)) : "");
      const std::optional<PairedSummary> own = against_own_arm(*c, a, s.spec.baseline);
      const PairedSummary& p = own ? *own : a.stats;
      row.push_back(own ? concat(a.arm, " (vs ", twin_original(a.arm), ")") : a.arm);
      // Unstable runs are flagged wherever their numbers appear.
      const std::size_t unstable = s.unstable_seeds(a.arm).size();
      row.push_back(std::to_string(a.values.size()) + (unstable > 0 ? concat(" (", unstable, " unstable)") : ""));
      row.push_back(format_number(a.mean, 4));
      row.push_back(delta_cell(a, p));
      row.push_back(ci_cell(a, p));
      row.push_back(a.is_baseline ? "" : format_p_value(p.p_value));
      row.push_back(a.is_baseline ? "" : concat(p.wins, "/", p.n));
      row.push_back(a.is_baseline || own ? "" : format_percent(a.ppl_change, 2));
      if (floor) row.push_back(a.floor ? a.floor->state : is_twin(a.arm) ? concat(twin_original(a.arm), "'s floor") : "");
      t.rows.push_back(std::move(row));
    }
  }
  t.notes = {
      concat("ΔNLL = arm − ", s.spec.baseline,
             " per seed finished in both (negative: the arm is better); mean ± sample sd over those seeds."),
      "95% CI: mean ± t(0.975, n−1)·sd/√n; p: two-sided paired t-test; wins: seeds where the arm's NLL is lower.",
      "ppl change = exp(mean ΔNLL) − 1 (negative: lower perplexity). n/a: fewer than two paired seeds."};
  if (floor) {
    const Comparison& c = *rows.back();
    std::string margin;
    for (const auto& a : c.arms)
      if (a.floor) margin = format_number(a.floor->margin, 4);
    t.notes.push_back(concat("A twin \"<arm>~\" is its arm trained again with the initial weights perturbed at a relative ",
                             format_printf("%.0e", s.spec.twin_perturbation),
                             ": its ΔNLL against its arm is that arm's noise floor (a twin of a compared arm, \"rd~ (vs "
                             "rd)\", is listed against its arm, not against the baseline). floor: the arm against the floors of ",
                             s.spec.baseline, "~ and its own twin — beyond (its interval excludes 0, or its seeds' "
                             "differences vary more than rounding makes them: F test at 5%), inside (neither, and its "
                             "90% CI lies within the margin ±", margin, ": indistinguishable from rounding) or "
                             "undetermined (neither: the interval is wider than the margin)."));
  }
  if (std::find(s.spec.arms.begin(), s.spec.arms.end(), "rd-average") != s.spec.arms.end())
    t.notes.push_back("rd-average is symmetric: both queries start at zero and receive identical gradients, so it "
                      "follows its parent up to rounding and clipping; its closeness to block is structural, not "
                      "evidence (attnres-spec §5.1).");
  return t;
}

std::string seeds_cell(const results::PowerSummary& p, int seeds) {
  if (!p.available) return "n/a";
  return seeds > 0 ? std::to_string(seeds) : "> 100,000";
}

Table power_table(const ExperimentSummary& s) {
  Table t;
  t.title = "Power: what these seeds can detect (80% power, two-sided α = 0.05, paired t on the observed per-seed sd)";
  const bool user = std::isfinite(s.user_effect);
  t.header = {"split", "tokens", "arm", "seeds", "sd of ΔNLL", "detectable |ΔNLL|",
              concat("seeds for ", format_number(kPaperEffectNats, 3))};
  if (user) t.header.push_back(concat("seeds for ", format_number(std::abs(s.user_effect), 4)));
  t.left_columns = 3;
  std::vector<const Comparison*> rows;
  for (const auto& c : s.milestones) rows.push_back(&c);
  rows.push_back(&s.test);
  std::vector<std::string> reasons;
  for (const Comparison* c : rows) {
    for (const auto& a : c->arms) {
      if (a.is_baseline || a.stats.n == 0 || is_twin(a.arm)) continue;  // a twin's row is a floor, not a comparison
      std::vector<std::string> row = {c->split, format_tokens(static_cast<double>(c->tokens)), a.arm,
                                      std::to_string(a.stats.n), format_number(a.stats.sd, 4),
                                      a.power.available ? format_number(a.power.mde, 4) : "n/a",
                                      seeds_cell(a.power, a.power.seeds_for_paper)};
      if (user) row.push_back(seeds_cell(a.power, a.power.seeds_for_user));
      t.rows.push_back(std::move(row));
      if (!a.power.available && std::find(reasons.begin(), reasons.end(), a.power.reason) == reasons.end())
        reasons.push_back(a.power.reason);
    }
  }
  t.notes = {concat("detectable |ΔNLL|: the smallest true mean difference the paired t-test finds with 80% probability "
                    "at these seeds, given the sd observed (non-central t); seeds for ",
                    format_number(kPaperEffectNats, 3), ": the seeds needed for the RD-AttnRes paper's effect at 120M "
                    "(−0.030 nats) with the same sd.")};
  for (const auto& r : reasons) t.notes.push_back("n/a: " + r + ".");
  if (s.sequential && (s.sequential->outcome == "resolved" || s.sequential->outcome == "futile"))
    t.notes.push_back(concat("The sequential design has answered for ", s.sequential->design.primary, " (",
                             s.sequential->outcome, "): these fixed-sample numbers are no advice to add seeds."));
  return t;
}

std::string mib(double bytes) { return std::isfinite(bytes) ? format_printf("%.1f MiB", bytes / 1048576.0) : "n/a"; }

std::string ratio_cell(double r) { return std::isfinite(r) ? format_printf("%.3f×", r) : "n/a"; }

}  // namespace

std::optional<Table> sequential_table(const ExperimentSummary& s) {
  if (!s.sequential) return std::nullopt;
  const results::SequentialSummary& q = *s.sequential;
  Table t;
  const std::string level = format_number(100 * (1 - q.design.alpha), 0);
  t.title = concat("Sequential seeds: ", q.design.primary, " vs ", s.spec.baseline, ", validation NLL at ",
                   s.milestones.empty() ? std::string("n/a") : format_tokens(double(s.milestones.back().tokens)),
                   " tokens, look by look");
  t.header = {"look", "seeds", "ΔNLL", "sd", "repeated " + level + "% CI", "t", "t boundary", "adjusted p", "crosses"};
  t.left_columns = 1;
  for (std::size_t k = 0; k < q.looks.size(); ++k) {
    const results::SequentialLook& l = q.looks[k];
    t.rows.push_back({concat(k + 1, " of ", q.design.looks.size()), std::to_string(l.n), format_signed(l.mean, 4),
                      format_number(l.sd, 4), concat("[", format_signed(l.ci_low, 4), ", ", format_signed(l.ci_high, 4), "]"),
                      format_number(l.t, 3), format_number(l.t_boundary, 3), format_p_value(l.p_adjusted),
                      l.crossed ? "yes" : "no"});
  }
  std::string looks;
  for (int n : q.design.looks) looks += (looks.empty() ? "" : ", ") + std::to_string(n);
  t.notes = {concat("Design: looks at ", looks, " seeds, ", q.design.spending, " error spending (Lan–DeMets), α = ",
                    format_number(q.design.alpha, 3), " two-sided; the t looks test at the calibrated level α* = ",
                    format_printf("%.4f", q.nominal_alpha), " (simulated type-I error ",
                    format_printf("%.4f", q.type_one_error), "); effect of interest ", format_number(q.design.effect, 4),
                    " nats."),
             "Repeated CI: covers the true ΔNLL at every look at once; the study stops when it excludes 0 (resolved) "
             "or lies inside ±the effect (futile). Adjusted p: the repeated p-value (the smallest level whose repeated "
             "CI excludes 0), on the design's own scale.",
             concat("Outcome: ", sequential_clause(q), ".")};
  return t;
}

std::optional<Table> twin_table(const ExperimentSummary& s) {
  if (s.twin_drift.empty()) return std::nullopt;
  Table t;
  t.title = concat("Baseline and twin: how far ", s.spec.baseline, " and ", twin_of(s.spec.baseline),
                   " drift apart in training");
  t.header = {"seed", "parted at step", "max |Δ loss|", "final |Δ loss|", "steps"};
  for (const auto& d : s.twin_drift)
    t.rows.push_back({std::to_string(d.seed), d.part_step ? std::to_string(*d.part_step) : "never",
                      format_printf("%.3g", d.max_abs_delta), format_printf("%.3g", d.final_abs_delta),
                      std::to_string(d.steps)});
  t.notes = {concat("|Δ loss|: the per-step training losses of the two runs, which read the same batches, so only their "
                    "weights differ. Parted: the first step with |Δ loss| ≥ ",
                    format_printf("%g", results::kTwinPartNats), " nats. Final: the mean over the last 10% of the steps.")};
  return t;
}

std::optional<Table> instability_table(const ExperimentSummary& s, bool every_run) {
  Table t;
  t.title = every_run ? "Instability of every run" : "Unstable runs";
  t.header = {"arm", "seed", "sustained spikes", "spike steps", "largest spike", "clipped steps", "max grad norm",
              "unstable"};
  t.left_columns = 1;
  for (const auto& r : s.instability) {
    const results::Instability& i = r.instability;
    if (!every_run && !i.unstable) continue;
    t.rows.push_back({r.arm, std::to_string(r.seed), std::to_string(i.sustained_spike_events), std::to_string(i.spike_steps),
                      i.largest_spike_step ? concat(format_number(i.largest_spike_nats, 3), " at ", *i.largest_spike_step)
                                           : "",
                      std::isnan(i.clipped_fraction) ? "n/a" : format_percent(i.clipped_fraction, 1).substr(1),
                      i.max_grad_norm_step ? concat(format_number(i.max_grad_norm, 3), " at ", *i.max_grad_norm_step) : "n/a",
                      i.unstable ? "yes" : "no"});
  }
  if (t.rows.empty()) return std::nullopt;
  t.notes = {std::string("The rule: ") + results::kUnstableRule + ".",
             "Largest spike: nats above the median of the 50 steps before it, at its step. Clipped steps: gradient norm "
             "above train.grad_clip (n/a for runs recorded before gradient norms were)."};
  return t;
}

// The failure rule fixed before the runs (results::FailureRule): per arm, the failed runs and Fisher's
// exact test against the baseline; each failed run with its reason; the secondary analysis.
std::optional<Table> failure_table(const ExperimentSummary& s) {
  if (s.failure_counts.empty() || !s.spec.failure) return std::nullopt;
  const results::FailureRule& rule = *s.spec.failure;
  Table t;
  t.title = "Failed runs (the rule was fixed before the runs)";
  t.header = {"arm", "failed", "Fisher p", "which", "without them: ΔNLL [95% CI]"};
  t.left_columns = 1;
  for (const auto& c : s.failure_counts) {
    std::string which;
    for (const auto& f : s.failures)
      if (f.arm == c.arm && f.failed) which += concat(which.empty() ? "" : "; ", "seed ", f.seed, ": ", f.reason);
    std::string secondary;
    if (s.without_failures)
      if (const ArmComparison* w = s.without_failures->find(c.arm); w && !w->is_baseline && w->stats.n >= 2)
        secondary = concat(format_signed(w->stats.mean, 4), " ", ci_cell(*w), " over ", w->stats.n, " seeds");
    t.rows.push_back({c.arm, concat(c.failed, "/", c.runs), c.arm == s.spec.baseline ? "" : format_p_value(c.fisher_p),
                      which, secondary});
  }
  t.notes = {concat("A run failed when more than ", format_percent(rule.clipped_fraction, 0).substr(1),
                    " of its steps were clipped, or when its training loss, averaged over ", rule.stall_steps,
                    " consecutive steps, sat more than ", format_number(rule.stall_nats, 2),
                    " nats above its reference (the baseline's run of the same seed; for the baseline and its twin the "
                    "median of the baseline's runs). The primary analysis keeps every seed; the last column is the "
                    "secondary analysis, at the last milestone, without the seeds in which the arm or the baseline failed.")};
  return t;
}

std::vector<Table> summary_tables(const ExperimentSummary& s, bool detailed) {
  std::vector<Table> tables;
  std::vector<const Comparison*> val;
  for (const auto& c : s.milestones) val.push_back(&c);
  tables.push_back(comparison_table(s, val, "Validation NLL at each milestone, paired against " + s.spec.baseline, true));
  tables.push_back(comparison_table(s, {&s.test},
                                    "Test NLL after " + format_tokens(static_cast<double>(s.spec.tokens)) +
                                        " tokens, paired against " + s.spec.baseline,
                                    false));

  tables.push_back(power_table(s));
  if (auto t = sequential_table(s)) tables.push_back(std::move(*t));
  if (auto t = ranking_table(s)) tables.push_back(std::move(*t));
  if (auto t = throughput_table(s)) tables.push_back(std::move(*t));
  if (auto t = twin_table(s)) tables.push_back(std::move(*t));
  if (auto t = instability_table(s, detailed)) tables.push_back(std::move(*t));
  if (auto t = failure_table(s)) tables.push_back(std::move(*t));

  for (Table& t : depth_tables(s, detailed)) tables.push_back(std::move(t));

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

std::string group_title(const GroupResults& g) {
  const results::GroupSpec& spec = g.spec;
  std::string settings;
  for (const auto& x : spec.settings) settings += (settings.empty() ? "" : ", ") + x;
  if (spec.kind == "controls")
    return concat("Controls '", spec.name, "' at ", format_tokens(static_cast<double>(spec.tokens)),
                  " tokens, against ", spec.baseline,
                  spec.baseline_from_main ? " (the main runs at this milestone)" : " trained to the same budget",
                  settings.empty() ? "" : "; " + settings);
  return concat("Probe '", spec.name, "' (", settings.empty() ? "main settings" : settings, "), ",
                format_tokens(static_cast<double>(spec.tokens)), " tokens, against ", spec.baseline);
}

std::vector<Table> group_tables(const GroupResults& g, bool detailed) {
  std::vector<Table> tables = summary_tables(g.summary, detailed);
  const std::string title = group_title(g);
  for (Table& t : tables) t.title = title + " — " + t.title;
  if (g.spec.baseline_from_main && !tables.empty())
    tables.front().notes.push_back(concat(
        "The baseline was not retrained: its runs would equal the main ", g.spec.baseline,
        " runs' first steps (same schedule up to this budget), so their validation NLL at this milestone is used; "
        "no test NLL is compared."));
  return tables;
}

namespace {

std::string model_value(const nlohmann::json& model, const char* key) {
  const auto it = model.find(key);
  return it == model.end() ? "?" : it->dump();
}

}  // namespace

std::optional<Table> probe_table(const ExperimentSummary& s) {
  std::vector<const GroupResults*> probes;
  for (const auto& g : s.groups)
    if (g.spec.kind == "probe") probes.push_back(&g);
  if (probes.empty()) return std::nullopt;
  Table t;
  t.title = "Probes: the main comparison beside each probe's, at the last validation milestone";
  t.header = {"group", "layers", "d_model", "tokens", "arm", "seeds", "ΔNLL ± sd", "95% CI", "p", "wins",
              "detectable |ΔNLL|", "JS (nats)"};
  t.left_columns = 1;
  auto add = [&](const std::string& name, const ExperimentSummary& x) {
    if (x.milestones.empty()) return;
    const Comparison& c = x.milestones.back();
    for (const auto& a : c.arms) {
      if (a.is_baseline) continue;
      std::string js;
      for (const auto& r : x.routing) {
        if (r.arm != a.arm || !r.two_routes) continue;
        js = format_number(r.all_layers.nats, 4);
        if (r.k_route) js = concat("Q~V ", js, ", K~V ", format_number(r.k_all_layers.nats, 4));
      }
      t.rows.push_back({name, model_value(x.spec.model, "n_layers"), model_value(x.spec.model, "d_model"),
                        format_tokens(static_cast<double>(c.tokens)), concat(a.arm, " vs ", x.spec.baseline),
                        std::to_string(a.stats.n), delta_cell(a), ci_cell(a), format_p_value(a.stats.p_value),
                        concat(a.stats.wins, "/", a.stats.n), a.power.available ? format_number(a.power.mde, 4) : "n/a",
                        js});
    }
  };
  add("main", s);
  for (const auto* g : probes) add(g->spec.name, g->summary);
  t.notes = {"Each row is a paired comparison of its own group (same seeds); JS: mean over all attention sublayers."};
  return t;
}

std::vector<Table> all_tables(const ExperimentSummary& s, bool detailed) {
  std::vector<Table> tables = summary_tables(s, detailed);
  if (auto p = probe_table(s)) tables.push_back(std::move(*p));
  for (const auto& g : s.groups)
    for (Table& t : group_tables(g, detailed)) tables.push_back(std::move(t));
  return tables;
}

std::string experiment_brief(const ExperimentSummary& s) {
  if (s.spec.name.empty()) return s.spec.preset.empty() ? "" : "preset " + s.spec.preset;
  return concat("protocol ", s.spec.name, " · ", model_value(s.spec.model, "n_layers"), " layers × ",
                model_value(s.spec.model, "d_model"));
}

std::string format_table_text(const Table& t) {
  std::vector<std::size_t> width(t.header.size(), 0);
  for (std::size_t c = 0; c < t.header.size(); ++c) width[c] = display_width(t.header[c]);
  for (const auto& row : t.rows)
    for (std::size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], display_width(row[c]));
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l = " ";
    for (std::size_t c = 0; c < width.size(); ++c) {
      const std::string cell = c < cells.size() ? cells[c] : "";
      l += " " + pad(cell, width[c], static_cast<int>(c) < t.left_columns);
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    return l + "\n";
  };
  std::string out = t.title + "\n" + line(t.header);
  std::size_t total = 1;
  for (auto w : width) total += w + 1;
  out += "  " + std::string(total - 2, '-') + "\n";
  for (const auto& row : t.rows) out += line(row);
  for (const auto& n : t.notes) out += "  " + n + "\n";
  return out;
}

std::string format_summary_table(const ExperimentSummary& s) {
  const std::string brief = experiment_brief(s);
  std::string out = concat("Experiment ", s.dir, ": ", s.spec.arms.size(), " arms, ", s.spec.seeds.size(), " seeds, ",
                           format_tokens(static_cast<double>(s.spec.tokens)), " tokens per run",
                           brief.empty() ? "" : ", " + brief, "; baseline ", s.spec.baseline,
                           "\n");
  out += concat("Finished runs: ", s.runs.size(), " of ", s.runs.size() + s.missing.size());
  if (!s.missing.empty()) {
    out += "; missing:";
    for (const auto& m : s.missing) out += concat(" ", m.arm, "/seed-", m.seed);
  }
  if (!s.not_needed.empty()) {
    out += concat("; ", s.not_needed.size(), " runs of later seeds not needed (the study stopped ",
                  s.sequential ? s.sequential->outcome : std::string("early"), ")");
  }
  out += "\n";
  if (const auto note = provenance_note(s)) out += "Provenance: " + *note + "\n";
  for (const auto& g : s.groups) {
    const std::size_t n = g.summary.runs.size(), total = n + g.summary.missing.size();
    out += concat("Group '", g.spec.name, "' (", g.spec.kind, "): ", n, " of ", total, " runs finished\n");
    if (const auto note = provenance_note(g.summary)) out += "  provenance: " + *note + "\n";
  }
  for (const Table& t : all_tables(s, false)) out += "\n" + format_table_text(t);
  return out;
}

namespace {

// A CSV field: as it is, or in double quotes (a quote doubled) when it holds a comma, quote or newline.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string out = "\"";
  for (const char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// The shortest form that reads back to the same double (as in the JSON files), a whole number
// without ".0"; "" when not finite.
std::string csv_number(double v) {
  if (!std::isfinite(v)) return {};
  if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) return std::to_string(static_cast<std::int64_t>(v));
  return nlohmann::json(v).dump();
}

std::string csv_row(const std::vector<std::string>& fields) {
  std::string line;
  for (const std::string& f : fields) line += (line.empty() ? "" : ",") + csv_field(f);
  return line + "\n";
}

// The main summary, then each group's, each with its group name.
template <class Visit>
void for_each_summary(const ExperimentSummary& summary, Visit visit) {
  visit(std::string("main"), summary);
  for (const GroupResults& g : summary.groups) visit(g.spec.name, g.summary);
}

}  // namespace

std::string runs_csv(const ExperimentSummary& summary) {
  std::string out = csv_row({"group", "arm", "seed", "params", "test_nll", "final_val_nll", "final_tokens",
                             "tokens_per_sec", "step_time_ms", "peak_rss_bytes", "unstable"});
  for_each_summary(summary, [&](const std::string& group, const ExperimentSummary& s) {
    for (const RunResult& r : s.runs) {
      const std::vector<std::int64_t> unstable = s.unstable_seeds(r.arm);
      const bool is_unstable = std::find(unstable.begin(), unstable.end(), r.seed) != unstable.end();
      const bool any = !r.milestones.empty();
      out += csv_row({group, r.arm, std::to_string(r.seed), std::to_string(r.params), csv_number(r.test_nll),
                      any ? csv_number(r.milestones.back().val_nll) : "",
                      any ? std::to_string(r.milestones.back().tokens) : "", csv_number(r.tokens_per_sec),
                      csv_number(r.step_time_ms), std::to_string(r.peak_rss_bytes), is_unstable ? "true" : "false"});
    }
  });
  return out;
}

std::string milestones_csv(const ExperimentSummary& summary) {
  std::string out = csv_row({"group", "arm", "seed", "step", "tokens", "val_nll"});
  for_each_summary(summary, [&](const std::string& group, const ExperimentSummary& s) {
    for (const RunResult& r : s.runs)
      for (const results::Milestone& m : r.milestones)
        out += csv_row({group, r.arm, std::to_string(r.seed), m.step ? std::to_string(*m.step) : "",
                        std::to_string(m.tokens), csv_number(m.val_nll)});
  });
  return out;
}

}  // namespace attnres::analysis
