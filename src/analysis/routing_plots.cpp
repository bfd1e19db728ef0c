// The depth-routing plots (analysis/plots.hpp): heatmaps of the mean depth distributions and the
// Jensen–Shannon divergence between the routes per layer.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "analysis/format.hpp"
#include "analysis/plots.hpp"
#include "analysis/stats.hpp"
#include "analysis/svg.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

// Perceptually uniform sequential colours (viridis), linear between nine anchors.
std::string viridis(double t) {
  static constexpr int kAnchors[9][3] = {{68, 1, 84},    {71, 45, 123},  {59, 82, 139},  {44, 114, 142}, {33, 145, 140},
                                         {40, 174, 128}, {94, 201, 98},  {173, 220, 48}, {253, 231, 37}};
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * 8;
  const int i = std::min(7, static_cast<int>(t));
  const double f = t - i;
  char buf[16];
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = static_cast<int>(std::lround(kAnchors[i][k] + f * (kAnchors[i + 1][k] - kAnchors[i][k])));
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c[0], c[1], c[2]);
  return buf;
}

// The spec's names of a read's sources: b0 is the token embedding (shown "emb"), b1, b2, ... the
// block representations, the last of a read's the current block's partial sum where present.
std::string source_label(int s) { return s == 0 ? "emb" : "b" + std::to_string(s); }

}  // namespace

double heatmap_scale(const ExperimentSummary& s) {
  // Single-source layers (weight 1 by construction) are left out of the range, so they do not wash
  // out the rest; they and anything above the range take the top colour.
  double vmax = 0;
  for (const auto& a : s.routing)
    for (const auto& l : a.layers) {
      if (l.sources == 1) continue;
      for (const auto* route : {&l.qk_mean, &l.k_mean, &l.v_mean})
        for (double v : *route) vmax = std::max(vmax, v);
    }
  return std::clamp(std::ceil(vmax * 10 - 1e-9) / 10, 0.1, 1.0);
}

// Sources are rows (the embedding at the bottom), layers columns.
std::string plot_heatmap(const ExperimentSummary& s, const ArmRouting& a, Route which, double vmax) {
  require(which != Route::k || a.k_route, "plot_heatmap: arm ", a.arm, " has no K route");
  int rows = 0;
  for (const auto& l : a.layers) rows = std::max(rows, l.sources);
  const int cols = static_cast<int>(a.layers.size());
  const double cw = std::clamp(380.0 / cols, 12.0, 44.0), ch = std::clamp(260.0 / rows, 12.0, 30.0);
  const double left = 48, top = 30, bottom = 44;
  const std::string route = which == Route::v   ? "V route"
                            : which == Route::k ? "K route"
                            : a.k_route         ? "Q route"
                                                : "Q/K route";
  const std::string title = a.arm + " · " + route + (a.two_routes ? "" : " (single route)");
  // Wide enough for its title (about 7.5 px a character at the title's 13 px bold).
  const double W = std::max(left + cw * cols + 12, 24 + 7.5 * static_cast<double>(title.size())),
               H = top + ch * rows + bottom;
  Svg svg(W, H, a.arm + ": mean depth distribution of the " + route);
  svg.rect(0, 6, 10, 14, arm_color(s, a.arm), " rx=\"2\"");
  svg.text(16, 18, title, " class=\"heat-title\"");
  const bool labels = cw >= 30 && ch >= 16;
  const int every = std::max(1, static_cast<int>(std::ceil(22.0 / cw)));
  for (int c = 0; c < cols; ++c) {
    const LayerRoutingSummary& l = a.layers[c];
    const auto& dist = which == Route::v ? l.v_mean : which == Route::k ? l.k_mean : l.qk_mean;
    const double x0 = left + cw * c;
    for (int r = 0; r < rows; ++r) {
      const double y0 = top + ch * (rows - 1 - r);
      if (r >= l.sources) {
        svg.rect(x0 + 0.5, y0 + 0.5, cw - 1, ch - 1, "#f3f4f6");
        continue;
      }
      const double v = dist[r];
      svg.rect(x0 + 0.5, y0 + 0.5, cw - 1, ch - 1, viridis(v / vmax), "",
               concat(a.arm, " ", route, ", layer ", l.layer, ", source ", source_label(r), ": ", format_number(v, 3)));
      if (labels) {
        std::string label = format_number(v, 2);
        if (label.rfind("0.", 0) == 0) label.erase(0, 1);  // ".42": fits narrow cells
        svg.text(x0 + cw / 2, y0 + ch / 2 + 3.5, label,
                 std::string(" text-anchor=\"middle\" class=\"cell ") + (v / vmax < 0.6 ? "on-dark" : "on-light") +
                     "\"");
      }
    }
    if (c % every == 0)
      svg.text(x0 + cw / 2, top + ch * rows + 15, std::to_string(l.layer), " text-anchor=\"middle\" class=\"tick\"");
  }
  const int row_every = std::max(1, static_cast<int>(std::ceil(13.0 / ch)));
  for (int r = 0; r < rows; r += row_every)
    svg.text(left - 6, top + ch * (rows - 1 - r) + ch / 2 + 4, source_label(r), " text-anchor=\"end\" class=\"tick\"");
  svg.text(left + cw * cols / 2, H - 8, "layer", " text-anchor=\"middle\" class=\"axis-label\"");
  return svg.str();
}

std::string plot_heatmap_legend(double vmax) {
  const double W = 520, H = 46, x0 = 10, w = 300;
  Svg svg(W, H, "Colour scale of the routing heatmaps");
  const int steps = 60;
  for (int i = 0; i < steps; ++i)
    svg.rect(x0 + w * i / steps, 6, w / steps + 0.6, 14, viridis((i + 0.5) / steps));
  svg.rect(x0 + w + 14, 6, 14, 14, "#f3f4f6", " stroke=\"#d1d5db\"");
  const std::vector<double> ticks = nice_ticks(0, vmax, 5);
  for (double t : ticks) {
    const double x = x0 + w * t / vmax;
    svg.line(x, 20, x, 25, kInk, 1);
    svg.text(x, 38, format_number(t, tick_decimals(ticks)) + (t == ticks.back() && vmax < 1 ? "+" : ""),
             " text-anchor=\"middle\" class=\"tick\"");
  }
  svg.text(x0 + w + 34, 17, "no such source", " class=\"tick\"");
  return svg.str();
}

// (d) JS between the routes per layer: grouped bars, nats on the left axis, bits on the right, each
// series' layer mean as a dashed line. A series is an arm's Q/K ~ V, or for an arm with a K route
// its Q ~ V and, in the arm's colour lightened, K ~ V.
std::string plot_js(const ExperimentSummary& s) {
  struct Series {
    const ArmRouting* arm;
    bool k;  // K ~ V (else Q/K ~ V, or Q ~ V)
    double layer_js(const LayerRoutingSummary& l) const { return k ? l.js_k_nats : l.js_nats; }
    const JsLayerMean& mean() const { return k ? arm->k_all_layers : arm->all_layers; }
    std::string name() const { return arm->arm + (arm->k_route ? (k ? " K~V" : " Q~V") : ""); }
    std::string extra() const { return k ? " fill-opacity=\"0.45\" stroke-opacity=\"0.45\"" : ""; }
  };
  std::vector<Series> series;
  for (const auto& a : s.routing) {
    if (a.two_routes) series.push_back({&a, false});
    if (a.k_route) series.push_back({&a, true});
  }
  if (series.empty()) return "";
  std::vector<int> layers;
  std::map<int, int> sources;
  double ymax = 0;
  for (const auto& c : series)
    for (const auto& l : c.arm->layers) {
      if (!sources.count(l.layer)) layers.push_back(l.layer);
      sources[l.layer] = l.sources;
      if (std::isfinite(c.layer_js(l))) ymax = std::max(ymax, c.layer_js(l));
    }
  std::sort(layers.begin(), layers.end());
  const double W = kPlotWidth, H = 360, left = 84, right = 250, top = 20, bottom = 60;
  Axis y{0, std::max(ymax * 1.1, 1e-3), H - bottom, top};
  const std::vector<double> yticks = nice_range(y.lo, y.hi, 6);
  const int yd = tick_decimals(yticks);
  Axis x{0, 1, left, W - right};
  Svg svg(W, H, "Jensen–Shannon divergence between the routes per attention sublayer");
  draw_axes(
      svg, x, y, {}, yticks, [](double) { return std::string(); }, [yd](double t) { return format_number(t, yd); },
      "layer (attention sublayer; † = single source)", "JS (nats)");
  // Bits on the right: the same scale divided by ln 2.
  svg.line(W - right, y.px0, W - right, y.px1, kInk, 1);
  const std::vector<double> bticks = nice_ticks(0, nats_to_bits(y.hi), 6);
  for (double b : bticks) {
    if (b * kLn2 > y.hi + 1e-12) continue;
    svg.line(W - right, y(b * kLn2), W - right + 5, y(b * kLn2), kInk, 1);
    svg.text(W - right + 8, y(b * kLn2) + 4, format_number(b, tick_decimals(bticks)), " class=\"tick\"");
  }
  const double bx = W - right + 52, by = (y.px0 + y.px1) / 2;
  svg.text(bx, by, "JS (bits)",
           " text-anchor=\"middle\" class=\"axis-label\" transform=\"rotate(90 " + px(bx) + " " + px(by) + ")\"");

  const double n = static_cast<double>(series.size());
  const double gw = (W - left - right) / static_cast<double>(layers.size());
  const double bw = std::min(28.0, gw * 0.8 / n);
  const int every = std::max(1, static_cast<int>(std::ceil(26.0 / gw)));
  for (std::size_t g = 0; g < layers.size(); ++g) {
    const double gx = left + gw * (static_cast<double>(g) + 0.5);
    if (static_cast<int>(g) % every == 0)
      svg.text(gx, H - bottom + 19, std::to_string(layers[g]) + (sources[layers[g]] == 1 ? "†" : ""),
               " text-anchor=\"middle\" class=\"tick\"");
    for (std::size_t k = 0; k < series.size(); ++k) {
      const Series& c = series[k];
      for (const auto& l : c.arm->layers) {
        const double js = c.layer_js(l);
        if (l.layer != layers[g] || !std::isfinite(js)) continue;
        const double x0 = gx + (static_cast<double>(k) - n / 2) * bw;
        svg.rect(x0 + 0.5, y(js), bw - 1, y.px0 - y(js), arm_color(s, c.arm->arm), c.extra(),
                 concat(c.name(), " layer ", l.layer, " (", l.sources, " sources): JS ", format_number(js, 4),
                        " nats = ", format_number(nats_to_bits(js), 4), " bits"));
      }
    }
  }
  std::vector<LegendEntry> legend;
  for (const auto& c : series) {
    const std::string color = arm_color(s, c.arm->arm);
    if (std::isfinite(c.mean().nats))
      svg.line(left, y(c.mean().nats), W - right, y(c.mean().nats), color, 1.5,
               " stroke-dasharray=\"6 4\"" + std::string(c.k ? " stroke-opacity=\"0.45\"" : " stroke-opacity=\"0.9\""));
    legend.push_back({c.name() + " · " + format_number(c.mean().nats, 3) + (c.arm->per_token_js ? "" : "*"), color,
                      c.extra()});
  }
  draw_legend(svg, W - right + 84, top + 14, legend);
  double ly = top + 14 + 20.0 * static_cast<double>(legend.size()) + 10;
  svg.text(W - right + 84, ly, "dashed: mean over all", " class=\"legend muted\"");
  svg.text(W - right + 84, ly + 16, "layers (nats)", " class=\"legend muted\"");
  if (std::any_of(series.begin(), series.end(), [](const Series& c) { return !c.arm->per_token_js; })) {
    ly += 18;
    svg.text(W - right + 84, ly + 16, "* JS of mean distributions", " class=\"legend muted\"");
  }
  if (std::any_of(series.begin(), series.end(), [](const Series& c) { return c.k; })) {
    svg.text(W - right + 84, ly + 34, "MUDD: p ∝ |dw|·‖X‖", " class=\"legend muted\"");
  }
  return svg.str();
}

}  // namespace attnres::analysis
