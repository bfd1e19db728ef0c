#include "analysis/plots.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "analysis/format.hpp"
#include "model/arms.hpp"
#include "analysis/stats.hpp"
#include "analysis/verdict.hpp"
#include "analysis/svg.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

// Bucket means: keeps long training curves to a few hundred points and smooths their noise.
std::vector<Point> downsample(const std::vector<Point>& pts, std::size_t max_points) {
  if (pts.size() <= max_points) return pts;
  std::vector<Point> out;
  const double per = static_cast<double>(pts.size()) / static_cast<double>(max_points);
  for (std::size_t b = 0; b < max_points; ++b) {
    const auto i0 = static_cast<std::size_t>(static_cast<double>(b) * per);
    const auto i1 = std::max(i0 + 1, static_cast<std::size_t>(static_cast<double>(b + 1) * per));
    double sx = 0, sy = 0;
    for (std::size_t i = i0; i < i1 && i < pts.size(); ++i) {
      sx += pts[i].first;
      sy += pts[i].second;
    }
    const double n = static_cast<double>(std::min(i1, pts.size()) - i0);
    out.push_back({sx / n, sy / n});
  }
  return out;
}

std::vector<std::string> arms_with_runs(const ExperimentSummary& s) {
  std::vector<std::string> out;
  for (const auto& arm : s.spec.arms)
    for (const auto seed : s.spec.seeds)
      if (s.find_run(arm, seed)) {
        out.push_back(arm);
        break;
      }
  return out;
}

}  // namespace

std::string arm_color(const std::string& arm, std::size_t index) {
  // Okabe–Ito: distinguishable with the common colour-vision deficiencies.
  static const std::map<std::string, std::string> kKnown = {
      {"prenorm", "#6b7280"},  {"full", "#E69F00"},     {"block", "#0072B2"},    {"rd", "#D55E00"},
      {"rd-tied", "#56B4E9"},  {"rd-average", "#009E73"}, {"rd-frozen", "#CC79A7"}};
  static constexpr const char* kCycle[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"};
  if (is_twin(arm)) {
    // A twin: its original's colour halfway to grey, so "block~" is never another arm's colour.
    const std::string base = arm_color(twin_original(arm), index);
    static constexpr char kHex[] = "0123456789ABCDEF";
    std::string out = "#";
    for (int i = 0; i < 3; ++i) {
      const int c = (std::stoi(base.substr(1 + 2 * i, 2), nullptr, 16) + 0xB0) / 2;
      out += kHex[c / 16];
      out += kHex[c % 16];
    }
    return out;
  }
  if (const auto it = kKnown.find(arm); it != kKnown.end()) return it->second;
  return kCycle[index % std::size(kCycle)];
}

std::string arm_color(const ExperimentSummary& s, const std::string& arm) {
  // A twin takes its original's place in the cycle (then its tint).
  const auto it = std::find(s.spec.arms.begin(), s.spec.arms.end(), is_twin(arm) ? twin_original(arm) : arm);
  return arm_color(arm, static_cast<std::size_t>(it - s.spec.arms.begin()));
}

// (a) Validation NLL against tokens: a thin line per seed, a bold line with markers for the arm's mean.
std::string plot_validation(const ExperimentSummary& s) {
  const double W = kPlotWidth, H = 420, left = 84, right = 190, top = 20, bottom = 60;
  std::vector<std::pair<std::string, std::vector<std::vector<Point>>>> seeds;  // per arm, per seed
  std::vector<std::pair<std::string, std::vector<Point>>> means;
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  auto extend = [&](double x, double y) {
    xmin = std::min(xmin, x), xmax = std::max(xmax, x), ymin = std::min(ymin, y), ymax = std::max(ymax, y);
  };
  for (const auto& arm : arms_with_runs(s)) {
    std::vector<std::vector<Point>> lines;
    for (const auto seed : s.spec.seeds) {
      const RunResult* r = s.find_run(arm, seed);
      if (!r) continue;
      std::vector<Point> pts;
      for (const auto& m : r->milestones) {
        pts.push_back({static_cast<double>(m.tokens), m.val_nll});
        extend(pts.back().first, pts.back().second);
      }
      lines.push_back(std::move(pts));
    }
    std::vector<Point> mean;
    for (const auto& c : s.milestones)
      if (const ArmComparison* a = c.find(arm); a && std::isfinite(a->mean))
        mean.push_back({static_cast<double>(c.tokens), a->mean});
    seeds.push_back({arm, std::move(lines)});
    means.push_back({arm, std::move(mean)});
  }
  if (seeds.empty()) return "";

  Axis x{xmin, xmax, left, W - right};
  x.log = xmin > 0 && xmax / xmin >= 4;  // milestones at N/8 … N are evenly spaced on a log axis
  std::vector<double> xticks;
  if (x.log) {
    xticks.assign(s.spec.milestones.begin(), s.spec.milestones.end());
    // Margins so the first and last markers are not on the frame.
    x.lo = xmin / std::pow(xmax / xmin, 0.04);
    x.hi = xmax * std::pow(xmax / xmin, 0.04);
  } else {
    xticks = nice_range(x.lo, x.hi, 6);
  }
  const double pad = 0.03 * (ymax - ymin);  // keeps extreme markers off the frame
  Axis y{ymin - pad, ymax + pad, H - bottom, top};
  const std::vector<double> yticks = nice_range(y.lo, y.hi, 6);
  const int yd = tick_decimals(yticks);

  Svg svg(W, H, "Validation NLL against training tokens, per arm");
  draw_axes(
      svg, x, y, xticks, yticks, [](double t) { return format_tokens(t); },
      [yd](double t) { return format_number(t, yd); }, std::string("training tokens") + (x.log ? " (log scale)" : ""),
      "validation NLL (nats/token)");
  for (const auto& [arm, lines] : seeds) {
    const std::string color = arm_color(s, arm);
    for (const auto& line : lines) {
      std::vector<Point> p;
      for (const auto& [tx, ty] : line) p.push_back({x(tx), y(ty)});
      svg.polyline(p, color, 1.2, " stroke-opacity=\"0.55\"");
    }
  }
  std::vector<LegendEntry> legend;
  for (const auto& [arm, mean] : means) {
    const std::string color = arm_color(s, arm);
    std::vector<Point> p;
    for (const auto& [tx, ty] : mean) p.push_back({x(tx), y(ty)});
    svg.polyline(p, color, 2.5);
    for (std::size_t i = 0; i < p.size(); ++i)
      svg.circle(p[i].first, p[i].second, 4, color, " stroke=\"#fff\" stroke-width=\"1.5\"",
                 arm + " at " + format_tokens(mean[i].first) + " tokens: mean NLL " + format_number(mean[i].second, 4));
    legend.push_back({arm + (arm == s.spec.baseline ? " (baseline)" : ""), color});
  }
  draw_legend(svg, W - right + 24, top + 14, legend);
  svg.text(W - right + 24, top + 14 + 20.0 * static_cast<double>(legend.size()) + 10,
           "thin: single seeds", " class=\"legend muted\"");
  return svg.str();
}

// (b) Paired ΔNLL per seed at each milestone and on the test split: dots per seed, the mean as a bar
// with its 95% CI, and the zero line (no difference from the baseline).
std::string plot_deltas(const ExperimentSummary& s) {
  std::vector<const Comparison*> groups;
  for (const auto& c : s.milestones) groups.push_back(&c);
  groups.push_back(&s.test);
  // The arms against the baseline: a twin of a compared arm (rd~) is that arm's floor, not a comparison
  // with the baseline (its ΔNLL against its own arm is in the tables), so it is not drawn.
  std::vector<std::string> arms;
  for (const auto& a : s.test.arms)
    if (!a.is_baseline && !(is_twin(a.arm) && twin_original(a.arm) != s.spec.baseline)) arms.push_back(a.arm);
  double ymin = 0, ymax = 0;
  bool any = false;
  for (const Comparison* c : groups)
    for (const auto& a : c->arms) {
      if (std::find(arms.begin(), arms.end(), a.arm) == arms.end()) continue;
      for (const auto& d : a.deltas) {
        ymin = std::min(ymin, d.value), ymax = std::max(ymax, d.value);
        any = true;
      }
      for (double v : {a.stats.ci_low, a.stats.ci_high})
        if (std::isfinite(v)) ymin = std::min(ymin, v), ymax = std::max(ymax, v);
    }
  if (!any) return "";

  const double W = kPlotWidth, H = 420, left = 84, right = 190, top = 20, bottom = 60;
  const double pad = 0.04 * (ymax - ymin);  // keeps extreme dots off the frame
  Axis y{ymin - pad, ymax + pad, H - bottom, top};
  const std::vector<double> yticks = nice_range(y.lo, y.hi, 7);
  const int yd = tick_decimals(yticks);
  const double gw = (W - left - right) / static_cast<double>(groups.size());
  const double slot = std::min(46.0, gw * 0.8 / static_cast<double>(arms.size()));

  Svg svg(W, H, "Paired NLL difference against the baseline per seed, at each milestone and on the test split");
  Axis x{0, 1, left, W - right};
  draw_axes(
      svg, x, y, {}, yticks, [](double) { return std::string(); }, [yd](double t) { return format_signed(t, yd); },
      "training tokens (validation milestones) and the test split at the end",
      "ΔNLL vs " + s.spec.baseline + " (nats)");
  svg.line(left, y(0), W - right, y(0), kInk, 1.2, " stroke-dasharray=\"5 4\"");
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double gx = left + gw * (static_cast<double>(g) + 0.5);
    if (g > 0) svg.line(left + gw * static_cast<double>(g), top, left + gw * static_cast<double>(g), H - bottom, kGrid, 1);
    const std::string label =
        groups[g]->split == "test" ? "test" : format_tokens(static_cast<double>(groups[g]->tokens));
    svg.text(gx, H - bottom + 19, label, " text-anchor=\"middle\" class=\"tick\"");
    for (std::size_t k = 0; k < arms.size(); ++k) {
      const ArmComparison* a = groups[g]->find(arms[k]);
      if (!a || a->deltas.empty()) continue;
      const std::string color = arm_color(s, arms[k]);
      const double cx = gx + (static_cast<double>(k) - (static_cast<double>(arms.size()) - 1) / 2) * slot;
      const std::string where = groups[g]->split == "test" ? "test" : format_tokens(static_cast<double>(groups[g]->tokens));
      if (std::isfinite(a->stats.ci_low)) {
        svg.line(cx, y(a->stats.ci_low), cx, y(a->stats.ci_high), color, 2);
        for (double v : {a->stats.ci_low, a->stats.ci_high}) svg.line(cx - 5, y(v), cx + 5, y(v), color, 2);
      }
      // Seeds spread sideways in a fixed order so equal values stay visible.
      const double n = static_cast<double>(a->deltas.size());
      for (std::size_t i = 0; i < a->deltas.size(); ++i) {
        const double dx = n > 1 ? (static_cast<double>(i) / (n - 1) - 0.5) * slot * 0.5 : 0;
        svg.circle(cx + dx, y(a->deltas[i].value), 3.2, color, " fill-opacity=\"0.55\"",
                   concat(arms[k], " seed ", a->deltas[i].seed, " at ", where, ": ΔNLL ",
                          format_signed(a->deltas[i].value, 4)));
      }
      svg.rect(cx - slot * 0.32, y(a->stats.mean) - 1.75, slot * 0.64, 3.5, color, "",
               concat(arms[k], " at ", where, ": mean ΔNLL ", format_signed(a->stats.mean, 4), ", 95% CI ",
                      std::isfinite(a->stats.ci_low)
                          ? "[" + format_signed(a->stats.ci_low, 4) + ", " + format_signed(a->stats.ci_high, 4) + "]"
                          : std::string("n/a"),
                      ", wins ", a->stats.wins, "/", a->stats.n));
    }
  }
  std::vector<LegendEntry> legend;
  for (const auto& arm : arms) legend.push_back({arm, arm_color(s, arm)});
  draw_legend(svg, W - right + 24, top + 14, legend, true);
  const double ly = top + 14 + 20.0 * static_cast<double>(legend.size()) + 10;
  svg.text(W - right + 24, ly, "dots: seeds", " class=\"legend muted\"");
  svg.text(W - right + 24, ly + 18, "bar: mean, line: 95% CI", " class=\"legend muted\"");
  svg.text(W - right + 24, ly + 36, "below 0: better than", " class=\"legend muted\"");
  svg.text(W - right + 24, ly + 52, s.spec.baseline, " class=\"legend muted\"");
  return svg.str();
}

// (e) Training loss against tokens: thin per-seed curves (bucket means), a bold mean per arm when
// the seeds share their token grid.
std::string plot_training_loss(const ExperimentSummary& s) {
  std::vector<std::pair<std::string, std::vector<std::vector<Point>>>> curves;
  for (const auto& arm : arms_with_runs(s)) {
    std::vector<std::vector<Point>> lines;
    for (const auto seed : s.spec.seeds)
      if (const RunResult* r = s.find_run(arm, seed); r && r->curve.size() >= 2) {
        std::vector<Point> p;
        for (const auto& c : r->curve) p.push_back({static_cast<double>(c.tokens), c.train_loss});
        lines.push_back(std::move(p));
      }
    if (!lines.empty()) curves.push_back({arm, std::move(lines)});
  }
  if (curves.empty()) return "";
  constexpr std::size_t kPoints = 240;
  double xmax = 0, ymin = INFINITY, ymax = -INFINITY;
  std::vector<std::pair<std::string, std::vector<Point>>> means;
  for (auto& [arm, lines] : curves) {
    bool same_grid = lines.size() > 1;
    for (const auto& l : lines) {
      same_grid = same_grid && l.size() == lines.front().size();
      for (std::size_t i = 0; same_grid && i < l.size(); ++i) same_grid = l[i].first == lines.front()[i].first;
    }
    std::vector<Point> mean;
    if (same_grid) {
      mean = lines.front();
      for (std::size_t i = 0; i < mean.size(); ++i) {
        double sum = 0;
        for (const auto& l : lines) sum += l[i].second;
        mean[i].second = sum / static_cast<double>(lines.size());
      }
      mean = downsample(mean, kPoints);
    }
    for (auto& l : lines) l = downsample(l, kPoints);
    for (const auto& l : lines)
      for (const auto& [tx, ty] : l) xmax = std::max(xmax, tx);
    means.push_back({arm, std::move(mean)});
  }
  // The first steps' loss (≈ ln vocab) would flatten the rest: scale y to the last 90% of training
  // and clip what lies above.
  for (const auto& [arm, lines] : curves)
    for (const auto& l : lines)
      for (const auto& [tx, ty] : l) {
        if (!std::isfinite(ty)) continue;
        ymin = std::min(ymin, ty);
        if (tx >= 0.1 * xmax) ymax = std::max(ymax, ty);
      }
  if (!std::isfinite(ymin) || !std::isfinite(ymax)) return "";
  const double W = kPlotWidth, H = 380, left = 84, right = 190, top = 20, bottom = 60;
  Axis x{0, xmax, left, W - right};
  const std::vector<double> xticks = nice_ticks(x.lo, x.hi, 8);
  Axis y{ymin, ymax, H - bottom, top};
  const std::vector<double> yticks = nice_range(y.lo, y.hi, 6);
  const int yd = tick_decimals(yticks);
  Svg svg(W, H, "Training loss against tokens, per arm");
  draw_axes(
      svg, x, y, xticks, yticks, [](double t) { return format_tokens(t); },
      [yd](double t) { return format_number(t, yd); }, "training tokens", "training loss (nats/token)");
  svg.raw("<clipPath id=\"attnres-loss-clip\"><rect x=\"" + px(left) + "\" y=\"" + px(top) + "\" width=\"" +
          px(W - left - right) + "\" height=\"" + px(H - top - bottom) + "\"/></clipPath><g clip-path=\"url(#attnres-loss-clip)\">");
  auto to_px = [&](const std::vector<Point>& pts) {
    std::vector<Point> p;
    for (const auto& [tx, ty] : pts) p.push_back({x(tx), y(ty)});
    return p;
  };
  std::vector<LegendEntry> legend;
  for (std::size_t a = 0; a < curves.size(); ++a) {
    const std::string color = arm_color(s, curves[a].first);
    const bool has_mean = !means[a].second.empty();
    for (const auto& l : curves[a].second)
      svg.polyline(to_px(l), color, has_mean ? 1.2 : 1.6, has_mean ? " stroke-opacity=\"0.5\"" : "");
    if (has_mean) svg.polyline(to_px(means[a].second), color, 2.2);
    legend.push_back({curves[a].first, color});
  }
  svg.raw("</g>");
  draw_legend(svg, W - right + 24, top + 14, legend);
  svg.text(W - right + 24, top + 14 + 20.0 * static_cast<double>(legend.size()) + 10, "thin: single seeds",
           " class=\"legend muted\"");
  return svg.str();
}

std::string plot_twin_drift(const ExperimentSummary& s) {
  const std::string twin = twin_of(s.spec.baseline);
  std::vector<std::pair<std::int64_t, std::vector<Point>>> lines;  // per seed: (tokens, |Δ loss|)
  double xmax = 0, ymax = 0;
  for (const auto seed : s.spec.seeds) {
    const RunResult* a = s.find_run(s.spec.baseline, seed);
    const RunResult* b = s.find_run(twin, seed);
    if (a == nullptr || b == nullptr || a->curve.size() < 2 || a->curve.size() != b->curve.size()) continue;
    std::vector<Point> p;
    for (std::size_t i = 0; i < a->curve.size(); ++i)
      p.push_back({static_cast<double>(a->curve[i].tokens), std::abs(b->curve[i].train_loss - a->curve[i].train_loss)});
    p = downsample(p, 240);  // bucket means of |Δ loss|
    for (const auto& [tx, ty] : p) {
      xmax = std::max(xmax, tx);
      ymax = std::max(ymax, ty);
    }
    lines.push_back({seed, std::move(p)});
  }
  if (lines.empty() || ymax <= 0) return "";
  // Log scale from 1e-7 nats (a rounding-sized difference) to the largest bucket.
  const double ylo = 1e-7, yhi = std::pow(10.0, std::ceil(std::log10(std::max(ymax, 1e-6))));
  const double W = kPlotWidth, H = 340, left = 84, right = 190, top = 20, bottom = 60;
  const Axis x{0, xmax, left, W - right};
  const Axis y{ylo, yhi, H - bottom, top, true};
  std::vector<double> yticks;
  for (double t = ylo; t <= yhi * 1.0001; t *= 10) yticks.push_back(t);
  Svg svg(W, H, "How far " + s.spec.baseline + " and its twin drift apart in training");
  draw_axes(
      svg, x, y, nice_ticks(x.lo, x.hi, 8), yticks, [](double t) { return format_tokens(t); },
      [](double t) { return format_printf("%.0e", t); }, "training tokens", "|Δ training loss| (nats)");
  const double part = y(results::kTwinPartNats);
  svg.line(left, part, W - right, part, kMuted, 1, " stroke-dasharray=\"5 4\"");
  svg.text(W - right - 4, part - 5, "parted: " + format_printf("%g", results::kTwinPartNats) + " nats",
           " text-anchor=\"end\" class=\"muted\"");
  static constexpr const char* kSeedColors[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00",
                                                "#56B4E9", "#000000", "#6b7280"};
  std::vector<LegendEntry> legend;
  for (std::size_t k = 0; k < lines.size(); ++k) {
    std::vector<Point> p;
    for (const auto& [tx, ty] : lines[k].second) p.push_back({x(tx), y(std::clamp(ty, ylo, yhi))});
    const std::string color = kSeedColors[k % std::size(kSeedColors)];
    svg.polyline(p, color, 1.6);
    legend.push_back({concat("seed ", lines[k].first), color});
  }
  draw_legend(svg, W - right + 24, top + 14, legend);
  return svg.str();
}

}  // namespace attnres::analysis
