// The report's SVG plots of a summary (docs/experiments.md, "attnres report"). Each returns one
// <svg> element, or "" when the summary has nothing to plot. Every arm has one colour everywhere.
// plots.cpp draws (a), (b), (e) and (f), routing_plots.cpp (c) and (d), connection_plots.cpp the
// connections.
#pragma once

#include <cstddef>
#include <string>

#include "analysis/summary.hpp"

namespace attnres::analysis {

inline constexpr double kPlotWidth = 1000;  // the width of the wide plots, in SVG user units

// The colour of an arm in every plot: fixed for the known arms (colour-blind-safe palette), else by
// its index in the experiment's arm list.
std::string arm_color(const std::string& arm, std::size_t index);
std::string arm_color(const ExperimentSummary& summary, const std::string& arm);

// (a) Validation NLL against tokens: a thin line per seed, a bold line with markers per arm's mean.
std::string plot_validation(const ExperimentSummary& summary);

// (b) Paired ΔNLL per seed at each milestone and on the test split, with the mean, its 95% CI and
// the zero line.
std::string plot_deltas(const ExperimentSummary& summary);

// (c) The mean depth distribution of one route of one arm (sources × layers), on a colour scale
// from 0 to vmax shared by every heatmap (heatmap_scale), and that scale's legend. Route::qk is the
// Q/K route (an arm with a K route: its Q route), Route::k the K route of an arm with one (MUDD).
enum class Route { qk, k, v };
double heatmap_scale(const ExperimentSummary& summary);
std::string plot_heatmap(const ExperimentSummary& summary, const ArmRouting& arm, Route route, double vmax);
std::string plot_heatmap_legend(double vmax);

// One arm's depth connections (signed weights, targets as rows, sources as columns) on a diverging
// scale of its own (connection_plots.cpp).
std::string plot_connections(const ExperimentSummary& summary, const ArmConnections& connections);

// (d) JS between the routes per attention sublayer, nats and bits, with each arm's layer mean: Q/K ~ V,
// and for an arm with a K route (MUDD) Q ~ V and K ~ V.
std::string plot_js(const ExperimentSummary& summary);

// (e) Training loss against tokens, when the runs logged a curve.
std::string plot_training_loss(const ExperimentSummary& summary);

// (f) How far the baseline and its twin drift apart: |Δ training loss| per step (bucket means, log
// scale), one line per seed, with the line at which they count as parted (results::kTwinPartNats).
std::string plot_twin_drift(const ExperimentSummary& summary);

}  // namespace attnres::analysis
