#include "analysis/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "analysis/format.hpp"
#include "analysis/stats.hpp"
#include "analysis/verdict.hpp"
#include "model/arms.hpp"
#include "analysis/plots.hpp"
#include "analysis/provenance.hpp"
#include "analysis/tables.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

namespace fs = std::filesystem;

// The headline sentences at the top of the page.
std::vector<std::string> key_results(const ExperimentSummary& s) {
  std::vector<std::string> out;
  if (s.milestones.empty()) return out;
  // Every compared arm's verdict at the last milestone, as `report --answer` gives it (the twin's
  // row is the noise floor, named in every other sentence).
  const Comparison& last = s.milestones.back();
  for (const auto& a : last.arms) {
    if (a.is_baseline || is_twin(a.arm)) continue;
    std::string line = answer_line(s, a.arm) + ".";
    const bool answered = s.sequential && s.sequential->design.primary == a.arm &&
                          (s.sequential->outcome == "resolved" || s.sequential->outcome == "futile");
    if (a.stats.n >= 2 && !identical_to_baseline(a))
      line += concat(" Perplexity ", format_percent(a.ppl_change, 2), ".");
    if (!answered && a.power.available && a.stats.p_value >= kPowerAlpha)
      line += concat(" These seeds detect |ΔNLL| ≥ ", format_number(a.power.mde, 4), " with 80% probability.");
    out.push_back(line);
  }
  if (last.noise_floor) {
    const results::NoiseFloor& f = *last.noise_floor;
    out.push_back(concat("Noise floor: ", f.twin, " (", twin_original(f.twin),
                         " with its initial weights perturbed at a relative ",
                         s.spec.twin_perturbation > 0 ? format_printf("%.0e", s.spec.twin_perturbation) : "n/a",
                         ") against ", twin_original(f.twin), ": ΔNLL mean ", format_signed_nats(f.mean), ", sd ",
                         format_nats(f.sd), " over ", f.n, " seeds: the spread that rounding-sized differences "
                         "alone give one pair of runs by this budget."));
  }
  for (const results::NoiseFloor& f : last.arm_floors)
    out.push_back(concat("Noise floor of ", twin_original(f.twin), ": ", f.twin, " against it, ΔNLL mean ",
                         format_signed_nats(f.mean), ", sd ", format_nats(f.sd), " over ", f.n, " seeds."));
  if (auto ranking = ranking_sentence(s)) out.push_back(std::move(*ranking));
  for (const auto& r : s.routing) {
    if (is_twin(r.arm)) continue;  // a twin routes as its arm does, up to rounding
    if (!std::isnan(r.max_weight))
      out.push_back(concat(r.arm, ": routing_max_weight ", format_number(r.max_weight, 4),
                           " (Delta AttnRes's routing-collapse statistic, docs/delta-gated-spec.md §1.8: per depth "
                           "read with more than one source the mean over evaluation tokens of its largest weight, "
                           "averaged over the reads and seeds; 1/n for uniform reads)."));
    if (!r.two_routes) continue;
    const std::string estimate = r.per_token_js ? "." : " (JS of mean distributions: a lower bound).";
    if (!r.k_route) {
      out.push_back(concat(r.arm, ": mean JS between routes ", format_number(r.all_layers.nats, 4), " nats (",
                           format_number(r.all_layers.bits, 4), " bits) over all ", r.all_layers.layers,
                           " attention sublayers, ", format_number(r.multi_source_layers.nats, 4), " nats over the ",
                           r.multi_source_layers.layers, " with more than one source", estimate));
      continue;
    }
    auto pair = [](const char* name, const JsLayerMean& all, const JsLayerMean& multi) {
      return concat(name, " ", format_number(all.nats, 4), " nats (", format_number(all.bits, 4), " bits; ",
                    format_number(multi.nats, 4), " over the ", multi.layers, " multi-source)");
    };
    out.push_back(concat(r.arm, ": mean JS between its Q, K and V ways over all ", r.all_layers.layers,
                         " blocks, ", pair("Q~V", r.all_layers, r.multi_source_layers), ", ",
                         pair("K~V", r.k_all_layers, r.k_multi_source_layers), ", per token with ",
                         kMuddRoutingDefinition, estimate));
  }
  return out;
}

std::string meta_line(const ExperimentSummary& s) {
  const std::string brief = experiment_brief(s);
  // A sequential study lists the seeds it ran (the design's maximum in words), not seeds never needed.
  std::string seeds;
  std::size_t listed = s.spec.seeds.size();
  if (s.sequential && s.sequential->look >= 0)
    listed = std::min<std::size_t>(listed, static_cast<std::size_t>(s.sequential->looks[static_cast<std::size_t>(s.sequential->look)].n));
  for (std::size_t i = 0; i < listed; ++i) seeds += (seeds.empty() ? "" : ", ") + std::to_string(s.spec.seeds[i]);
  if (listed < s.spec.seeds.size()) seeds += concat(" (of up to ", s.spec.seeds.size(), ", sequential)");
  std::string ms;
  for (const auto m : s.spec.milestones) ms += (ms.empty() ? "" : ", ") + format_tokens(static_cast<double>(m));
  return concat(brief.empty() ? "" : brief + " · ", s.spec.arms.size(), " arms · seeds ",
                seeds, " · ", format_tokens(static_cast<double>(s.spec.tokens)), " tokens per run · milestones ", ms,
                " · baseline ", s.spec.baseline, " · ", s.runs.size(), " of ", s.runs.size() + s.missing.size(),
                " runs finished");
}

// The provenance notes of the main runs and of each group (analysis/provenance.hpp): the runs of
// one comparison came from different binaries, CPUs or GEMM setups.
std::vector<std::string> provenance_notes(const ExperimentSummary& s) {
  std::vector<std::string> out;
  if (const auto note = provenance_note(s)) out.push_back("main arms: " + *note);
  for (const GroupResults& g : s.groups)
    if (const auto note = provenance_note(g.summary)) out.push_back("group '" + g.spec.name + "': " + *note);
  return out;
}

std::string missing_line(const ExperimentSummary& s) {
  std::string out;
  for (const auto& m : s.missing) out += concat(out.empty() ? "" : ", ", m.arm, "/seed-", m.seed);
  return out;
}

std::string markdown_cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string markdown_table_of(const Table& t) {
  std::string out = "### " + t.title + "\n\n|";
  for (const auto& h : t.header) out += " " + markdown_cell(h) + " |";
  out += "\n|";
  for (std::size_t c = 0; c < t.header.size(); ++c) out += static_cast<int>(c) < t.left_columns ? " --- |" : " ---: |";
  out += "\n";
  for (const auto& row : t.rows) {
    out += "|";
    for (std::size_t c = 0; c < t.header.size(); ++c) out += " " + markdown_cell(c < row.size() ? row[c] : "") + " |";
    out += "\n";
  }
  if (!t.notes.empty()) {
    out += "\n";
    for (const auto& n : t.notes) out += "*" + n + "*  \n";
  }
  return out + "\n";
}

// `s` null: no arm swatches.
std::string html_table_of(const ExperimentSummary* s, const Table& t) {
  std::string out = "<div class=\"table-wrap\"><table><caption>" + escape_html(t.title) + "</caption><thead><tr>";
  int arm_col = -1;
  for (std::size_t c = 0; c < t.header.size(); ++c) {
    if (t.header[c] == "arm") arm_col = static_cast<int>(c);
    out += std::string("<th") + (static_cast<int>(c) < t.left_columns ? "" : " class=\"num\"") + ">" +
           escape_html(t.header[c]) + "</th>";
  }
  out += "</tr></thead><tbody>";
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    const auto& row = t.rows[r];
    // A row that names a new milestone starts a visual group.
    const bool group = r > 0 && t.header.front() == "tokens" && !row.empty() && !row[0].empty();
    out += group ? "<tr class=\"group\">" : "<tr>";
    for (std::size_t c = 0; c < t.header.size(); ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      out += static_cast<int>(c) < t.left_columns ? "<td>" : "<td class=\"num\">";
      // The arm's swatch; "rd~ (vs rd)" (a twin against its own arm) is rd~'s.
      const std::string arm = cell.substr(0, cell.find(" (vs "));
      if (s != nullptr && static_cast<int>(c) == arm_col &&
          std::find(s->spec.arms.begin(), s->spec.arms.end(), arm) != s->spec.arms.end())
        out += "<span class=\"swatch\" style=\"background:" + arm_color(*s, arm) + "\"></span>";
      out += escape_html(cell) + "</td>";
    }
    out += "</tr>";
  }
  out += "</tbody></table></div>";
  for (const auto& n : t.notes) out += "<p class=\"note\">" + escape_html(n) + "</p>";
  return out;
}

std::string html_table(const ExperimentSummary& s, const Table& t) { return html_table_of(&s, t); }

constexpr const char* kCss = R"css(
:root { --ink:#1f2937; --muted:#6b7280; --line:#e5e7eb; --bg:#ffffff; --panel:#f9fafb; --accent:#0072B2; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", "DejaVu Sans", sans-serif; }
main { max-width: 1080px; margin: 0 auto; padding: 32px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; letter-spacing: -0.01em; }
h2 { font-size: 19px; margin: 40px 0 8px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 22px 0 6px; color: var(--ink); }
p { margin: 6px 0; }
.meta { color: var(--muted); font-size: 13.5px; }
.path { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace; font-size: 13px; }
.lead { color: var(--muted); font-size: 14px; max-width: 860px; }
.keys { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 18px 10px 34px; margin: 18px 0; }
.keys li { margin: 4px 0; }
.warn { background:#fff7ed; border:1px solid #fed7aa; color:#9a3412; border-radius:8px; padding:8px 14px; margin:14px 0; font-size:14px; }
figure { margin: 14px 0 6px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; max-width: 900px; }
svg.plot { max-width: 100%; height: auto; display: block; }
svg text { font-family: inherit; fill: var(--ink); }
svg .tick { font-size: 12px; fill: #374151; font-variant-numeric: tabular-nums; }
svg .axis-label { font-size: 13px; fill: #374151; }
svg .legend { font-size: 13px; }
svg .muted { fill: var(--muted); font-size: 12px; }
svg .heat-title { font-size: 13px; font-weight: 600; }
svg .cell { font-size: 9.5px; font-variant-numeric: tabular-nums; }
svg .cell.on-dark { fill: #ffffff; }
svg .cell.on-light { fill: var(--ink); }
.heatmaps { display: grid; grid-template-columns: repeat(2, minmax(0, max-content)); gap: 10px 36px; align-items: start; }
.table-wrap { overflow-x: auto; margin: 14px 0 4px; }
table { border-collapse: collapse; font-size: 13.5px; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-weight: 600; padding: 0 0 6px; font-size: 14px; }
th, td { padding: 5px 12px; border-bottom: 1px solid var(--line); white-space: nowrap; text-align: left; }
th { background: var(--panel); font-weight: 600; border-bottom: 1px solid #d1d5db; }
td.num, th.num { text-align: right; }
tr.group td { border-top: 2px solid #d1d5db; }
tbody tr:hover td { background: #f3f4f6; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:7px; vertical-align:baseline; }
.note { color: var(--muted); font-size: 12.5px; margin: 2px 0; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px; font-size: 12.5px; overflow-x: auto; }
footer { margin-top: 48px; color: var(--muted); font-size: 12.5px; }
)css";

}  // namespace

std::string markdown_table(const Table& table) { return markdown_table_of(table); }
std::string html_table(const Table& table) { return html_table_of(nullptr, table); }
const char* report_css() { return kCss; }

std::string render_markdown(const ExperimentSummary& s) {
  std::string out = "# Paired experiment report\n\n";
  out += "Experiment directory: `" + s.dir + "`  \n" + meta_line(s) + "\n\n";
  if (!s.missing.empty())
    out += "> **Missing runs** (no result.json; statistics use the seeds finished in both the arm and the baseline): " +
           missing_line(s) + "\n\n";
  for (const std::string& note : provenance_notes(s)) out += "> **Provenance**: " + note + ".\n\n";
  if (!s.not_needed.empty())
    out += concat("> The sequential study stopped (", s.sequential->outcome, "): ", s.not_needed.size(),
                  " runs of later seeds were not needed.\n\n");
  const auto keys = key_results(s);
  if (!keys.empty()) {
    out += "## Key results\n\n";
    for (const auto& k : keys) out += "- " + k + "\n";
    out += "\n";
  }
  out += "## Tables\n\n";
  for (const Table& t : all_tables(s, true)) out += markdown_table_of(t);
  out += "Plots: see report.html beside this file. All numbers: summary.json.\n";
  return out;
}

std::string render_html(const ExperimentSummary& s) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>";
  h += escape_html("attnres report: " + fs::path(s.dir).filename().string()) + "</title>\n<style>" + kCss +
       "</style>\n</head>\n<body>\n<main>\n";
  h += "<h1>Paired experiment report</h1>\n<p class=\"meta\"><span class=\"path\">" + escape_html(s.dir) +
       "</span></p>\n";
  h += "<p class=\"meta\">" + escape_html(meta_line(s)) + "</p>\n";
  if (!s.not_needed.empty())
    h += "<p class=\"lead\">" +
         escape_html(concat("The sequential study stopped (", s.sequential->outcome, "): ", s.not_needed.size(),
                            " runs of later seeds were not needed.")) +
         "</p>\n";
  if (!s.missing.empty())
    h += "<div class=\"warn\"><strong>Missing runs</strong> (no result.json): " + escape_html(missing_line(s)) +
         ". Statistics use the seeds finished in both the arm and the baseline.</div>\n";
  for (const std::string& note : provenance_notes(s))
    h += "<div class=\"warn\"><strong>Provenance</strong>: " + escape_html(note) + ".</div>\n";
  const auto keys = key_results(s);
  if (!keys.empty()) {
    h += "<ul class=\"keys\">";
    for (const auto& k : keys) h += "<li>" + escape_html(k) + "</li>";
    h += "</ul>\n";
  }
  const std::vector<Table> tables = summary_tables(s, true);
  auto table_titled = [&](const std::string& prefix) {
    std::string out;
    for (const auto& t : tables)
      if (t.title.rfind(prefix, 0) == 0) out += html_table(s, t);
    return out;
  };

  h += "<h2>Validation loss</h2>\n";
  if (const std::string plot = plot_validation(s); !plot.empty())
    h += "<figure>" + plot +
         "<figcaption>Validation NLL (nats per token) at each evaluation milestone. Bold: the mean over an arm's "
         "finished seeds; thin: each seed.</figcaption></figure>\n";
  h += table_titled("Validation NLL");

  h += "<h2>Paired differences against " + escape_html(s.spec.baseline) + "</h2>\n";
  h += "<p class=\"lead\">Each seed of an arm shares its initialisation and data order with the same seed of the "
       "baseline, so the comparison is the per-seed difference ΔNLL = arm − baseline.</p>\n";
  if (const std::string plot = plot_deltas(s); !plot.empty())
    h += "<figure>" + plot +
         "<figcaption>Dots: ΔNLL of each seed. Bar: mean over seeds; line: 95% confidence interval (Student t, "
         "n − 1 degrees of freedom). Below the dashed zero line the arm has the lower loss.</figcaption></figure>\n";
  h += table_titled("Test NLL");
  h += table_titled("Ranking");
  h += table_titled("Power");
  if (s.sequential) {
    h += "<h2>Sequential seeds</h2>\n<p class=\"lead\">The seeds are run in looks; after each, the primary "
         "comparison is tested against boundaries that spend the type-I error over the looks, so that stopping "
         "early keeps it at α. Outcome: " + escape_html(sequential_clause(*s.sequential)) + ".</p>\n";
    h += table_titled("Sequential seeds");
  }
  if (!s.twin_drift.empty()) {
    const std::string twin = twin_of(s.spec.baseline);
    std::string others;
    for (const results::NoiseFloor& f : s.milestones.back().arm_floors)
      others += concat(", and ", f.twin, " likewise ", twin_original(f.twin), "'s");
    h += "<h2>Baseline and twin: the noise floor</h2>\n<p class=\"lead\">" + escape_html(twin) + " is " +
         escape_html(s.spec.baseline) +
         " trained from the same seed on the same batches with its initial weights perturbed at a relative " +
         escape_html(format_printf("%g", s.spec.twin_perturbation)) +
         ", as rounding would. Its ΔNLL against " + escape_html(s.spec.baseline) + " (the tables above) measures " +
         escape_html(s.spec.baseline) + "'s noise floor" + escape_html(others) +
         ". Each comparison is tested against the floors of its two arms (the floor column): inside it, the arm is "
         "indistinguishable from rounding; beyond it, the arms differ by more than rounding makes them, which says "
         "nothing yet of how much. Below: how far " + escape_html(s.spec.baseline) + " and " + escape_html(twin) +
         "'s training losses drift apart.</p>\n";
    if (const std::string plot = plot_twin_drift(s); !plot.empty())
      h += "<figure>" + plot + "<figcaption>|Δ training loss| between " + escape_html(s.spec.baseline) + " and " +
           escape_html(twin) + " per seed (bucket means, log scale). A chaotic setting grows the initial "
           "difference to the size of the loss's own noise; a stable one keeps it near where it started."
           "</figcaption></figure>\n";
    h += table_titled("Baseline and twin");
  }
  h += table_titled("Unstable runs") + table_titled("Instability of every run") + table_titled("Failed runs");

  if (!s.routing.empty()) {
    h += "<h2>Depth routing</h2>\n";
    // One colour scale for every heatmap, so routes and arms compare directly.
    const double vmax = heatmap_scale(s);
    const bool any_k = std::any_of(s.routing.begin(), s.routing.end(), [](const ArmRouting& a) { return a.k_route; });
    h += "<p class=\"lead\">Mean depth-attention weight of each source (rows; emb = the token embedding b0, then the block "
         "representations in order, the last being the current block's partial sum where present) for each attention "
         "sublayer (columns), averaged over evaluation tokens and seeds. Hover a cell for its value.</p>\n";
    if (any_k) h += "<p class=\"lead\">" + escape_html(mudd_routing_note()) + "</p>\n";
    h += "<figure>" + plot_heatmap_legend(vmax) + "</figure>\n<div class=\"heatmaps\">\n";
    // Two per row: Q/K (or Q) and V, then an arm's K route on a row of its own.
    for (const auto& a : s.routing) {
      h += "<figure>" + plot_heatmap(s, a, Route::qk, vmax) + "</figure>";
      h += a.two_routes ? "<figure>" + plot_heatmap(s, a, Route::v, vmax) + "</figure>\n" : "<div></div>\n";
      if (a.k_route) h += "<figure>" + plot_heatmap(s, a, Route::k, vmax) + "</figure><div></div>\n";
    }
    h += "</div>\n";
    if (const std::string plot = plot_js(s); !plot.empty())
      h += "<h3>Jensen–Shannon divergence between the routes</h3><figure>" + plot +
           "<figcaption>JS(α<sub>QK</sub>, α<sub>V</sub>) per attention sublayer, averaged over evaluation tokens "
           "(per-token average) and seeds; at most ln 2 nats = 1 bit. Single-source sublayers (†) are 0 by "
           "construction." +
           std::string(any_k ? " MUDD: JS(p<sub>Q</sub>, p<sub>V</sub>) and, lighter, JS(p<sub>K</sub>, "
                               "p<sub>V</sub>) per block, with " +
                                   escape_html(kMuddRoutingDefinition) + "."
                             : "") +
           "</figcaption></figure>\n";
    h += table_titled("Depth routing: Jensen");
    h += table_titled("Jensen");
  }

  if (!s.connections.empty()) {
    h += "<h2>Depth connections</h2>\n<p class=\"lead\">The mixing weights of modes whose depth connections are "
         "not depth distributions (signed, not normalised), averaged over seeds: targets (rows) read sources "
         "(columns; emb = the token embedding). GR's gr.read and gr.write: per module (rows; the last row of "
         "gr.read is the final mixer) the read gates' mean over channels and the write gates of each branch "
         "(columns). Hover a cell for its value.</p>\n<div class=\"heatmaps\">\n";
    for (const auto& a : s.connections) h += "<figure>" + plot_connections(s, a) + "</figure>\n";
    h += "</div>\n" + table_titled("Depth connections");
  }
  if (!s.amax_gain.empty()) {
    h += "<h2>Amax gain of the stream mixing</h2>\n<p class=\"lead\">How much the n-stream modes' residual "
         "mixing amplifies a signal common to all streams on the way up (forward) or a gradient on the way down "
         "(backward), through all sublayers (composite) or one; 1 is neutral. mHC's Sinkhorn constraint holds "
         "them close to 1 (the forward gain exactly in the paper's order, col→row); HC's mixing is unconstrained "
         "(MHC-P §3.1).</p>\n";
    h += table_titled("Amax gain");
  }
  if (!s.systems.empty()) {
    h += "<h2>Systems</h2>\n" + table_titled("Systems") + table_titled("Throughput-adjusted");
  }
  if (const auto probes = probe_table(s)) h += "<h2>Probes</h2>\n" + html_table(s, *probes);
  for (const GroupResults& g : s.groups) {
    h += "<h2>" + escape_html(group_title(g)) + "</h2>\n";
    if (const std::string plot = plot_deltas(g.summary); !plot.empty())
      h += "<figure>" + plot + "<figcaption>ΔNLL per seed against " + escape_html(g.spec.baseline) +
           " in this group; bar: mean, line: 95% CI.</figcaption></figure>\n";
    for (const Table& t : group_tables(g, false)) h += html_table(g.summary, t);
  }
  if (const std::string plot = plot_training_loss(s); !plot.empty())
    h += "<h2>Training loss</h2>\n<figure>" + plot +
         "<figcaption>Training loss as logged by each run (bucket means, at most 240 points per curve). The first "
         "steps are clipped to keep the rest readable.</figcaption></figure>\n";

  h += "<h2>Configuration</h2>\n";
  h += "<h3>Model (baseline arm)</h3><pre>" + escape_html(s.spec.model.dump(2)) + "</pre>\n";
  // Multi-line strings (the runner records the training TOML as one) read better verbatim than as
  // escaped JSON strings.
  nlohmann::json train_rest = nlohmann::json::object();
  std::string train_text;
  for (const auto& [key, value] : s.spec.train.items()) {
    if (value.is_string() && value.get<std::string>().find('\n') != std::string::npos)
      train_text += "<p class=\"note\">" + escape_html(key) + "</p><pre>" + escape_html(value.get<std::string>()) + "</pre>\n";
    else train_rest[key] = value;
  }
  h += "<h3>Training</h3>";
  if (!train_rest.empty() || train_text.empty()) h += "<pre>" + escape_html(train_rest.dump(2)) + "</pre>\n";
  h += train_text;
  h += "<footer>Generated by <span class=\"path\">attnres report</span> from experiment.json and the runs' "
       "result.json files; every number is also in summary.json.</footer>\n";
  h += "</main>\n</body>\n</html>\n";
  return h;
}

ReportFiles write_report(const ExperimentSummary& summary, const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  require(!ec && fs::is_directory(out_dir), "cannot create report directory '", out_dir, "': ", ec.message());
  ReportFiles files{(fs::path(out_dir) / "report.md").string(), (fs::path(out_dir) / "report.html").string()};
  write_text_atomically(files.markdown, render_markdown(summary));
  write_text_atomically(files.html, render_html(summary));
  return files;
}

}  // namespace attnres::analysis
