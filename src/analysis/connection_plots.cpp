// Heatmaps of the depth connections (results::Connections): signed mixing weights, so a diverging
// scale centred on 0, one per plot (their ranges differ by mode).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "analysis/format.hpp"
#include "analysis/plots.hpp"
#include "analysis/svg.hpp"
#include "model/family.hpp"
#include "util/error.hpp"

namespace attnres::analysis {
namespace {

// Blue (negative) through white (0) to red (positive), t in [-1, 1]: ColorBrewer RdBu's ends.
std::string diverging(double t) {
  static constexpr int kNegative[3] = {33, 102, 172}, kWhite[3] = {247, 247, 247}, kPositive[3] = {178, 24, 43};
  t = std::clamp(std::isfinite(t) ? t : 0.0, -1.0, 1.0);
  const int* end = t < 0 ? kNegative : kPositive;
  const double f = std::abs(t);
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = static_cast<int>(std::lround(kWhite[k] + f * (end[k] - kWhite[k])));
  char buf[16];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", c[0], c[1], c[2]);
  return buf;
}

}  // namespace

std::string plot_connections(const ExperimentSummary& s, const ArmConnections& a) {
  const auto& rows = a.connections.rows;
  if (rows.empty()) return "";
  int max_source = 0;
  double vmax = 0;
  for (const auto& r : rows) {
    max_source = std::max(max_source, r.sources.back());
    for (double w : r.weights) vmax = std::max(vmax, std::abs(w));
  }
  if (vmax == 0) vmax = 1;
  const int cols = max_source + 1, n_rows = static_cast<int>(rows.size());
  const double cw = std::clamp(380.0 / cols, 14.0, 48.0), ch = std::clamp(260.0 / n_rows, 14.0, 30.0);
  const double left = 56, top = 30, bottom = 70;
  const std::string what = a.arm + " '" + a.connections.name + "'";
  // What the columns are: the family's record says (model/family.hpp); the embedding and the blocks
  // by default.
  const ConnectionKind* kind = connection_kind(a.connections.name);
  const ConnectionAxis axis = kind != nullptr ? kind->axis : ConnectionAxis::source;
  const std::string title = what + " · mean over " + std::to_string(a.n_seeds) + " seeds";
  const double W = std::max({left + cw * cols + 12, 320.0, 24 + 7.5 * static_cast<double>(title.size())}),
               H = top + ch * n_rows + bottom;
  Svg svg(W, H, what + ": mean depth-connection weights");
  svg.rect(0, 6, 10, 14, arm_color(s, a.arm), " rx=\"2\"");
  svg.text(16, 18, title, " class=\"heat-title\"");
  const bool labels = cw >= 30 && ch >= 16;
  for (int i = 0; i < n_rows; ++i) {
    const results::ConnectionRow& r = rows[static_cast<std::size_t>(i)];
    const double y0 = top + ch * i;
    for (int c = 0; c < cols; ++c) svg.rect(left + cw * c + 0.5, y0 + 0.5, cw - 1, ch - 1, "#f3f4f6");
    for (std::size_t k = 0; k < r.sources.size(); ++k) {
      const double v = r.weights[k], x0 = left + cw * r.sources[k];
      svg.rect(x0 + 0.5, y0 + 0.5, cw - 1, ch - 1, diverging(v / vmax), "",
               concat(what, ", target ", r.target, ", source ", r.sources[k], ": ", format_number(v, 3)));
      if (labels)
        svg.text(x0 + cw / 2, y0 + ch / 2 + 3.5, format_number(v, 2),
                 std::string(" text-anchor=\"middle\" class=\"cell ") +
                     (std::abs(v) / vmax > 0.6 ? "on-dark" : "on-light") + "\"");
    }
    svg.text(left - 6, y0 + ch / 2 + 4, std::to_string(r.target), " text-anchor=\"end\" class=\"tick\"");
  }
  for (int c = 0; c < cols; ++c)
    svg.text(left + cw * c + cw / 2, top + ch * n_rows + 15, connection_tick_label(axis, c),
             " text-anchor=\"middle\" class=\"tick\"");
  svg.text(left + cw * cols / 2, top + ch * n_rows + 32, to_string(axis),
           " text-anchor=\"middle\" class=\"axis-label\"");
  // The scale: -vmax .. 0 .. +vmax.
  const double sx = left, sy = H - 22, sw = std::min(200.0, W - left - 70);
  for (int i = 0; i < 40; ++i) svg.rect(sx + sw * i / 40, sy, sw / 40 + 0.6, 8, diverging((i + 0.5) / 20 - 1));
  svg.text(sx, sy + 20, format_number(-vmax, 2), " text-anchor=\"middle\" class=\"tick\"");
  svg.text(sx + sw / 2, sy + 20, "0", " text-anchor=\"middle\" class=\"tick\"");
  svg.text(sx + sw, sy + 20, format_number(vmax, 2), " text-anchor=\"middle\" class=\"tick\"");
  return svg.str();
}

}  // namespace attnres::analysis
