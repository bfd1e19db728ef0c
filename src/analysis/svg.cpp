#include "analysis/svg.hpp"

#include <algorithm>
#include <cmath>

#include "analysis/format.hpp"

namespace attnres::analysis {

std::string px(double v) { return format_printf("%.1f", v); }

void Svg::line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
               const std::string& extra) {
  body_ += "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) +
           "\" stroke=\"" + stroke + "\" stroke-width=\"" + format_printf("%.2g", width) + "\"" + extra + "/>";
}

void Svg::rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra,
               const std::string& tooltip) {
  body_ += "<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" + px(h) +
           "\" fill=\"" + fill + "\"" + extra;
  body_ += tooltip.empty() ? "/>" : "><title>" + escape_html(tooltip) + "</title></rect>";
}

void Svg::circle(double cx, double cy, double r, const std::string& fill, const std::string& extra,
                 const std::string& tooltip) {
  body_ += "<circle cx=\"" + px(cx) + "\" cy=\"" + px(cy) + "\" r=\"" + px(r) + "\" fill=\"" + fill + "\"" + extra;
  body_ += tooltip.empty() ? "/>" : "><title>" + escape_html(tooltip) + "</title></circle>";
}

namespace {

// A coordinate in tenths of a pixel (px's resolution) written as a number: "12.3", "-4", "0.7".
std::string tenths(long long t) {
  const long long a = t < 0 ? -t : t;
  return (t < 0 ? "-" : "") + std::to_string(a / 10) + (a % 10 ? "." + std::to_string(a % 10) : "");
}

}  // namespace

// An open path in relative steps rather than a polyline of absolute points: the steps between
// neighbouring points are short numbers, which keeps a report of many long curves small (72
// per-seed loss curves of 240 points made one page over 1 MiB). The steps are differences of the
// points rounded to px's tenths, so they add up to the rounded points exactly: no drift.
void Svg::polyline(const std::vector<Point>& points, const std::string& stroke, double width,
                   const std::string& extra) {
  if (points.size() < 2) return;
  std::string d;
  long long x0 = 0, y0 = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const long long x = std::llround(points[i].first * 10), y = std::llround(points[i].second * 10);
    d += i == 0 ? "M" + tenths(x) + "," + tenths(y) + "l" : (i > 1 ? " " : "") + tenths(x - x0) + "," + tenths(y - y0);
    x0 = x;
    y0 = y;
  }
  body_ += "<path d=\"" + d + "\" fill=\"none\" stroke=\"" + stroke + "\" stroke-width=\"" +
           format_printf("%.2g", width) + "\" stroke-linejoin=\"round\" stroke-linecap=\"round\"" + extra + "/>";
}

void Svg::text(double x, double y, const std::string& s, const std::string& extra) {
  body_ += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\"" + extra + ">" + escape_html(s) + "</text>";
}

std::string Svg::str() const {
  return "<svg class=\"plot\" viewBox=\"0 0 " + px(width_) + " " + px(height_) + "\" width=\"" + px(width_) +
         "\" height=\"" + px(height_) + "\" role=\"img\" aria-label=\"" + escape_html(label_) + "\"><title>" +
         escape_html(label_) + "</title>" + body_ + "</svg>";
}

double Axis::operator()(double v) const {
  const double t = log ? (std::log(v) - std::log(lo)) / (std::log(hi) - std::log(lo)) : (v - lo) / (hi - lo);
  return px0 + t * (px1 - px0);
}

std::vector<double> nice_ticks(double lo, double hi, int target_count) {
  std::vector<double> ticks;
  if (!std::isfinite(lo) || !std::isfinite(hi) || target_count < 1) return ticks;
  if (hi < lo) std::swap(lo, hi);
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / target_count;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  // Integer multiples of the step, so labels do not accumulate rounding error.
  const auto first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  const auto last = static_cast<long long>(std::floor(hi / step + 1e-9));
  for (long long k = first; k <= last; ++k) ticks.push_back(k == 0 ? 0.0 : static_cast<double>(k) * step);
  return ticks;
}

std::vector<double> nice_range(double& lo, double& hi, int target) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  std::vector<double> ticks = nice_ticks(lo, hi, target);
  if (ticks.size() >= 2) {
    const double step = ticks[1] - ticks[0];
    if (ticks.front() > lo + 1e-12 * step) ticks.insert(ticks.begin(), ticks.front() - step);
    if (ticks.back() < hi - 1e-12 * step) ticks.push_back(ticks.back() + step);
    lo = ticks.front();
    hi = ticks.back();
  }
  return ticks;
}

int tick_decimals(const std::vector<double>& ticks) {
  if (ticks.size() < 2) return 2;
  const double step = std::abs(ticks[1] - ticks[0]);
  return std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 8);
}

void draw_axes(Svg& svg, const Axis& x, const Axis& y, const std::vector<double>& xticks,
               const std::vector<double>& yticks, const std::function<std::string(double)>& xlabel_of,
               const std::function<std::string(double)>& ylabel_of, const std::string& xlabel,
               const std::string& ylabel) {
  for (double t : yticks) {
    svg.line(x.px0, y(t), x.px1, y(t), kGrid, 1);
    svg.text(x.px0 - 8, y(t) + 4, ylabel_of(t), " text-anchor=\"end\" class=\"tick\"");
  }
  for (double t : xticks) {
    svg.line(x(t), y.px0, x(t), y.px1, kGrid, 1);
    svg.line(x(t), y.px0, x(t), y.px0 + 5, kInk, 1);
    svg.text(x(t), y.px0 + 19, xlabel_of(t), " text-anchor=\"middle\" class=\"tick\"");
  }
  svg.line(x.px0, y.px0, x.px1, y.px0, kInk, 1);
  svg.line(x.px0, y.px0, x.px0, y.px1, kInk, 1);
  svg.text((x.px0 + x.px1) / 2, y.px0 + 42, xlabel, " text-anchor=\"middle\" class=\"axis-label\"");
  const double ly = (y.px0 + y.px1) / 2, lx = x.px0 - 58;
  svg.text(lx, ly, ylabel,
           " text-anchor=\"middle\" class=\"axis-label\" transform=\"rotate(-90 " + px(lx) + " " + px(ly) + ")\"");
}

void draw_legend(Svg& svg, double x, double y, const std::vector<LegendEntry>& entries, bool dots) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const double yy = y + 20.0 * static_cast<double>(i);
    if (dots) svg.circle(x + 9, yy - 4, 5, entries[i].color);
    else svg.line(x, yy - 4, x + 18, yy - 4, entries[i].color, 3, entries[i].extra);
    svg.text(x + 26, yy, entries[i].label, " class=\"legend\"");
  }
}

}  // namespace attnres::analysis
