// A minimal SVG writer and the axis, tick and legend drawing the report's plots share
// (analysis/plots.cpp). No xmlns attribute: inline SVG in HTML5 needs none, and the page must
// not reference any URL.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace attnres::analysis {

using Point = std::pair<double, double>;

inline constexpr const char* kInk = "#1f2937";
inline constexpr const char* kMuted = "#6b7280";
inline constexpr const char* kGrid = "#e5e7eb";

// Pixel coordinates: one decimal is below what any screen shows and keeps the file small.
std::string px(double v);

// `extra` carries further attributes (written as given); text and tooltips are escaped here.
class Svg {
 public:
  Svg(double width, double height, std::string label) : width_(width), height_(height), label_(std::move(label)) {}

  void line(double x1, double y1, double x2, double y2, const std::string& stroke, double width,
            const std::string& extra = "");
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra = "",
            const std::string& tooltip = "");
  void circle(double cx, double cy, double r, const std::string& fill, const std::string& extra = "",
              const std::string& tooltip = "");
  // An open line through the points (an SVG path in relative steps, svg.cpp says why).
  void polyline(const std::vector<Point>& points, const std::string& stroke, double width,
                const std::string& extra = "");
  void text(double x, double y, const std::string& s, const std::string& extra = "");
  void raw(const std::string& s) { body_ += s; }

  std::string str() const;

 private:
  double width_, height_;
  std::string label_;
  std::string body_;
};

// Data to pixels along one axis.
struct Axis {
  double lo = 0, hi = 1;    // data range
  double px0 = 0, px1 = 1;  // pixel range (px0 maps lo; for a y axis px0 is the bottom)
  bool log = false;
  double operator()(double v) const;
};

// Axis ticks at 1, 2 or 5 × 10^k covering [lo, hi], about target_count of them.
std::vector<double> nice_ticks(double lo, double hi, int target_count);

// Extends [lo, hi] to whole tick steps and returns the ticks.
std::vector<double> nice_range(double& lo, double& hi, int target);

// Decimals that show a tick step of 1, 2 or 5 × 10^k exactly.
int tick_decimals(const std::vector<double>& ticks);

// Grid lines, tick labels, the frame's left and bottom edges and the axis labels.
void draw_axes(Svg& svg, const Axis& x, const Axis& y, const std::vector<double>& xticks,
               const std::vector<double>& yticks, const std::function<std::string(double)>& xlabel_of,
               const std::function<std::string(double)>& ylabel_of, const std::string& xlabel,
               const std::string& ylabel);

struct LegendEntry {
  std::string label;
  std::string color;
  std::string extra = "";  // attributes of the line sample (e.g. an opacity)
};

// One entry per line from (x, y) down; a line sample, or a dot with `dots`.
void draw_legend(Svg& svg, double x, double y, const std::vector<LegendEntry>& entries, bool dots = false);

}  // namespace attnres::analysis
