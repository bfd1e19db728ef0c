// The verdict of a comparison in words: what `attnres report --answer`, the tables and the report
// page say of an arm against the baseline (analysis/summary.hpp computes the numbers).
#pragma once

#include <string>

#include "analysis/summary.hpp"

namespace attnres::analysis {

// One sentence a newcomer can read: the verdict of arm `a` of comparison `c` against the baseline,
// naming the split and budget, e.g. "rd vs block, validation NLL at 1.93M tokens: ΔNLL −0.0123 ±
// 0.0020 (s.e.) over 5 seeds, p = 0.003 (95% CI ...; rd better in 5/5 seeds); noise floor ±0.0030
// (...)" when the paired test rejects no difference at α = 0.05, else "...: not resolved at this
// size: ...; about N seeds would be needed ...", with the noise floor where the experiment has the
// baseline's twin (and whether the interval lies inside it).
std::string verdict_sentence(const ExperimentSummary& summary, const Comparison& c, const ArmComparison& a);

// The sequential decision in one clause: "sequential seeds: resolved at the look at 8 seeds
// (repeated 95% CI [...], adjusted p = ...)", "... futile ...", "... not resolved at max_seeds ...",
// "... continuing ... next look at N seeds".
std::string sequential_clause(const results::SequentialSummary& sequential);

// verdict_sentence of `arm` at the last validation milestone, with the sequential clause for the
// primary arm of a sequential experiment and the unstable runs of the arm and the baseline. An Error when the arm is not a
// compared arm of the experiment.
std::string answer_line(const ExperimentSummary& summary, const std::string& arm);

// True when every paired difference is exactly 0: the arm reproduced the baseline bit for bit
// (expected of rd-tied).
bool identical_to_baseline(const ArmComparison& a);

}  // namespace attnres::analysis
