#include "analysis/pool_report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "analysis/format.hpp"
#include "analysis/report.hpp"
#include "analysis/svg.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

namespace fs = std::filesystem;

constexpr const char* kNotRecorded = "not recorded";
constexpr const char* kPooledColor = "#D55E00";  // vermillion: the pooled estimate and the −E line
constexpr const char* kDesignColor = "#0072B2";  // blue: the designs

// The study's name: the directory's last component ("docs/results/cpu-v2/" -> "cpu-v2").
std::string study_name(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().empty() ? dir : p.filename().string();
}

std::string design_label(const results::PoolDesign& d) {
  return d.design == "main" ? study_name(d.dir) : study_name(d.dir) + " · " + d.design;
}

std::string count_or(std::int64_t n) { return n > 0 ? std::to_string(n) : kNotRecorded; }

std::string cpus_of(const results::PoolDesign& d) {
  std::string out;
  for (const auto& c : d.cpus) out += (out.empty() ? "" : "; ") + c;
  return out.empty() ? kNotRecorded : out;
}

std::string interval(double lo, double hi) {
  return std::isfinite(lo) ? "[" + format_signed(lo, 4) + ", " + format_signed(hi, 4) + "]" : "n/a";
}

std::string weight_of(const results::PoolDesign& d) {
  return d.pooled ? format_number(100 * d.weight, 1) + "%" : "not pooled";
}

}  // namespace

Table pool_table(const results::Pool& p) {
  Table t;
  t.title = concat(p.arm, " − ", p.baseline, ": every design's paired ΔNLL (validation NLL at its last milestone)");
  t.header = {"study", "design", "width", "depth", "lr", "tokens", "precision", "CPU", "seeds", "ΔNLL", "s.e.",
              "95% CI", "weight"};
  t.left_columns = 2;
  for (const results::PoolDesign& d : p.designs)
    t.rows.push_back({study_name(d.dir), d.design == "main" || d.design == d.kind ? d.design : d.design + " (" + d.kind + ")", count_or(d.width),
                      count_or(d.depth), std::isfinite(d.lr) ? format_printf("%g", d.lr) : kNotRecorded,
                      format_tokens(static_cast<double>(d.tokens)), d.precision.empty() ? kNotRecorded : d.precision,
                      cpus_of(d), std::to_string(d.n), format_signed(d.mean, 4), format_number(d.se, 4),
                      interval(d.ci_low, d.ci_high), weight_of(d)});
  t.notes = {"ΔNLL = " + p.arm + " − " + p.baseline + " per seed finished in both (negative: " + p.arm +
                 " better); s.e. = sd/√n; 95% CI: t with n − 1 df.",
             "weight: the design's share of the random-effects weights 1/(s.e.² + τ²)."};
  for (const results::PoolDesign& d : p.designs)
    if (!d.pooled) t.notes.push_back(design_label(d) + " is not pooled: " + d.not_pooled + ".");
  return t;
}

std::string format_pool_text(const results::Pool& p) {
  return format_table_text(pool_table(p)) + "\n" + p.summary + "\n" + "Futility: " + p.futility + "\n";
}

std::string plot_forest(const results::Pool& p) {
  if (p.designs.empty()) return "";
  double lo = std::min(0.0, -p.effect), hi = 0;
  for (const auto& d : p.designs)
    for (double v : {d.mean, d.ci_low, d.ci_high})
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (p.pooled) lo = std::min(lo, p.pooled->ci_low), hi = std::max(hi, p.pooled->ci_high);
  const double row = 30, top = 34, bottom = 60, left = 250, right = 300, W = 1000;
  const double rows = static_cast<double>(p.designs.size()) + (p.pooled ? 1.5 : 0);
  const double H = top + row * rows + 10 + bottom;
  Axis x{lo, hi, left, W - right};
  const std::vector<double> xticks = nice_range(x.lo, x.hi, 7);
  const int xd = tick_decimals(xticks);
  const Axis y{0, 1, H - bottom, top};
  Svg svg(W, H, "Forest plot: " + p.arm + " − " + p.baseline + " per design and pooled");
  draw_axes(
      svg, x, y, xticks, {}, [xd](double v) { return format_signed(v, xd); }, [](double) { return std::string(); },
      "ΔNLL " + p.arm + " − " + p.baseline + " (nats; left of 0: " + p.arm + " better)", "");
  svg.text(left - 12, top - 12, "design (seeds)", " text-anchor=\"end\" class=\"muted\"");
  svg.text(W - right + 14, top - 12, "ΔNLL [95% CI]  weight", " class=\"muted\"");
  // The zero line, and the gain of E.
  svg.line(x(0), top - 8, x(0), H - bottom, kInk, 1.2, " stroke-dasharray=\"5 4\"");
  svg.line(x(-p.effect), top - 8, x(-p.effect), H - bottom, kPooledColor, 1.2, " stroke-dasharray=\"2 3\"");
  svg.text(x(-p.effect), top - 12, "−E = −" + format_number(p.effect, 3), " text-anchor=\"middle\" class=\"muted\"");
  double max_w = 0;
  for (const auto& d : p.designs)
    if (d.pooled) max_w = std::max(max_w, d.weight);
  for (std::size_t i = 0; i < p.designs.size(); ++i) {
    const results::PoolDesign& d = p.designs[i];
    const double cy = top + row * (static_cast<double>(i) + 0.5);
    svg.text(left - 12, cy + 4, design_label(d) + " (" + std::to_string(d.n) + ")", " text-anchor=\"end\" class=\"tick\"");
    const std::string color = d.pooled ? kDesignColor : kMuted;
    const std::string tip = concat(design_label(d), ": ΔNLL ", format_signed(d.mean, 4), ", 95% CI ",
                                   interval(d.ci_low, d.ci_high), ", ", d.n, " seeds, weight ", weight_of(d));
    if (std::isfinite(d.ci_low)) {
      svg.line(x(d.ci_low), cy, x(d.ci_high), cy, color, 1.8);
      for (double v : {d.ci_low, d.ci_high}) svg.line(x(v), cy - 5, x(v), cy + 5, color, 1.8);
    }
    // A square whose area is proportional to the weight (the largest 16 px wide).
    const double side = d.pooled && max_w > 0 ? std::max(4.0, 16 * std::sqrt(d.weight / max_w)) : 6;
    if (std::isfinite(d.mean)) svg.rect(x(d.mean) - side / 2, cy - side / 2, side, side, color, "", tip);
    svg.text(W - right + 14, cy + 4, format_signed(d.mean, 4) + " " + interval(d.ci_low, d.ci_high) + "  " + weight_of(d),
             " class=\"tick\"");
  }
  if (p.pooled) {
    const results::PoolEstimate& e = *p.pooled;
    const double cy = top + row * (static_cast<double>(p.designs.size()) + 1.0);
    svg.line(left - 200, cy - row * 0.75, W - 20, cy - row * 0.75, kGrid, 1);
    svg.text(left - 12, cy + 4, concat("pooled, k = ", e.k), " text-anchor=\"end\" class=\"tick\" font-weight=\"600\"");
    const std::string points = px(x(e.ci_low)) + "," + px(cy) + " " + px(x(e.mean)) + "," + px(cy - 8) + " " +
                               px(x(e.ci_high)) + "," + px(cy) + " " + px(x(e.mean)) + "," + px(cy + 8);
    svg.raw("<polygon points=\"" + points + "\" fill=\"" + kPooledColor + "\"><title>" +
            escape_html(concat("pooled ΔNLL ", format_signed(e.mean, 4), ", 95% CI ", interval(e.ci_low, e.ci_high),
                               " (HKSJ, t with ", e.k - 1, " df)")) +
            "</title></polygon>");
    svg.text(W - right + 14, cy + 4, format_signed(e.mean, 4) + " " + interval(e.ci_low, e.ci_high) + "  100%",
             " class=\"tick\" font-weight=\"600\"");
  }
  return svg.str();
}

std::string render_pool_markdown(const results::Pool& p) {
  std::string out = "# What every study says: " + p.arm + " vs " + p.baseline + "\n\n";
  out += "Studies: ";
  std::vector<std::string> seen;
  for (const auto& d : p.designs)
    if (std::find(seen.begin(), seen.end(), d.dir) == seen.end()) {
      out += (seen.empty() ? "`" : ", `") + d.dir + "`";
      seen.push_back(d.dir);
    }
  out += "  \nEach estimate: " + p.metric + ".  \nMethod: " + p.method + ".\n\n";
  out += "- " + p.summary + ".\n- Futility at E = " + format_number(p.effect, 3) + ": " + p.futility + ".\n\n";
  out += markdown_table(pool_table(p));
  out += "Forest plot: pool.html beside this file. All numbers: pool.json.\n";
  return out;
}

std::string render_pool_html(const results::Pool& p) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>";
  h += escape_html("attnres pool: " + p.arm + " vs " + p.baseline) + "</title>\n<style>" + report_css() +
       "</style>\n</head>\n<body>\n<main>\n";
  h += "<h1>What every study says: " + escape_html(p.arm + " vs " + p.baseline) + "</h1>\n";
  h += "<p class=\"meta\">Each estimate: " + escape_html(p.metric) + ". Method: " + escape_html(p.method) + ".</p>\n";
  h += "<ul class=\"keys\"><li>" + escape_html(p.summary) + ".</li><li>Futility at E = " +
       escape_html(format_number(p.effect, 3)) + ": " + escape_html(p.futility) + ".</li></ul>\n";
  h += "<h2>Forest plot</h2>\n<figure>" + plot_forest(p) +
       "<figcaption>Each design's paired ΔNLL with its own 95% CI (t with n − 1 df); the square's area is its "
       "random-effects weight (grey: not pooled). Diamond: the pooled estimate and its 95% CI. Dashed: no "
       "difference; dotted: a gain of E. Hover a mark for its numbers.</figcaption></figure>\n";
  h += "<h2>Designs</h2>\n" + html_table(pool_table(p));
  h += "<footer>Generated by <span class=\"path\">attnres report --pool</span> from the studies' experiment.json and "
       "result.json files; every number is also in pool.json.</footer>\n</main>\n</body>\n</html>\n";
  return h;
}

PoolFiles write_pool_report(const results::Pool& pool, const std::string& out_dir) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  require(!ec && fs::is_directory(out_dir), "cannot create report directory '", out_dir, "': ", ec.message());
  PoolFiles files{results::pool_path(out_dir), (fs::path(out_dir) / "pool.md").string(),
                  (fs::path(out_dir) / "pool.html").string()};
  results::write_pool(files.json, pool);
  write_text_atomically(files.markdown, render_pool_markdown(pool));
  write_text_atomically(files.html, render_pool_html(pool));
  return files;
}

}  // namespace attnres::analysis
