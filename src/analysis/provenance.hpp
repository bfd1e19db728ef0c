// The note the report gives when the runs of one comparison (the main arms', or a group's) came
// from different binaries, CPUs or GEMM setups (results/provenance.hpp says what each run records;
// summary.json's "provenance" lists the distinct origins with their run counts).
#pragma once

#include <optional>
#include <string>

#include "analysis/summary.hpp"
#include "results/provenance.hpp"

namespace attnres::analysis {

// E.g. "the runs came from 2 binaries: 0123456789ab (10 runs), ba9876543210-dirty (1 run)";
// nullopt when every run that records a provenance agrees and none lacks one.
inline std::optional<std::string> provenance_note(const ExperimentSummary& s) {
  return results::provenance_note(s.runs);
}

}  // namespace attnres::analysis
