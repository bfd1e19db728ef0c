// The depth diagnostics of an experiment's arms, over their seeds: the routing of the AttnRes
// family (mean depth distributions and the JS between routes, spec §7), the signed connections of
// the baselines (DenseFormer's DWA weights, MUDD's, GR's gates) and the n-stream modes' Amax gains.
// compute_summary (analysis/summary.hpp) fills ExperimentSummary's routing, connections and
// amax_gain with them. Every seed of an arm must agree on the shapes (layers, sources, rows): an
// Error names the two files that differ.
#pragma once

#include <vector>

#include "analysis/summary.hpp"

namespace attnres::analysis {

// Per arm with routing, its layers' seed-mean distributions and JS (bits and nats).
std::vector<ArmRouting> summarize_routing(const ExperimentSummary& summary);

// Per arm and connection name, the seed mean of every weight.
std::vector<ArmConnections> summarize_connections(const ExperimentSummary& summary);

// Per arm with Amax gains: the composite's means averaged over seeds, every max the max.
std::vector<ArmGain> summarize_gain(const ExperimentSummary& summary);

}  // namespace attnres::analysis
