#include "results/experiment_spec.hpp"

#include <filesystem>
#include <set>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::results {

using nlohmann::json;

json to_json(const Protocol& p) {
  return {{"arms", p.arms},     {"baseline", p.baseline},     {"seeds", p.seeds},
          {"tokens", p.tokens}, {"milestones", p.milestones}, {"preset", p.preset}};
}

void from_json(JsonObject& in, Protocol& p) {
  const JsonValue arms = in.get("arms");
  std::set<std::string> seen_arms;
  for (const JsonValue& v : arms.array()) {
    if (!v.raw().is_string() || v.raw().get<std::string>().empty()) v.bad("must be a non-empty string");
    const std::string arm = v.string();
    // Arm names become directory names and HTML ids.
    if (arm.find_first_of("/\\<>&\"' ") != std::string::npos || arm == "." || arm == "..")
      v.bad(concat("'", arm, "' is not a valid arm name"));
    if (!seen_arms.insert(arm).second) v.bad(concat("repeats arm '", arm, "'"));
    p.arms.push_back(arm);
  }
  if (p.arms.empty()) arms.bad("must not be empty");
  const JsonValue baseline = in.get("baseline");
  p.baseline = baseline.string();
  if (!seen_arms.count(p.baseline)) baseline.bad(concat("'", p.baseline, "' is not one of 'arms'"));

  const JsonValue seeds = in.get("seeds");
  std::set<std::int64_t> seen_seeds;
  for (const JsonValue& v : seeds.array()) {
    const std::int64_t seed = v.integer();
    if (!seen_seeds.insert(seed).second) v.bad(concat("repeats seed ", seed));
    p.seeds.push_back(seed);
  }
  if (p.seeds.empty()) seeds.bad("must not be empty");

  const JsonValue tokens = in.get("tokens");
  p.tokens = tokens.integer();
  if (p.tokens <= 0) tokens.bad("must be positive");
  const JsonValue milestones = in.get("milestones");
  for (const JsonValue& v : milestones.array()) {
    const std::int64_t m = v.integer();
    if (m <= 0) v.bad("must be positive");
    if (!p.milestones.empty() && m <= p.milestones.back()) v.bad("must be larger than the one before");
    p.milestones.push_back(m);
  }
  if (p.milestones.empty()) milestones.bad("must not be empty");

  if (const auto preset = in.find("preset")) p.preset = preset->string();
}

json to_json(const ExperimentSpec& s) {
  json j = to_json(static_cast<const Protocol&>(s));
  j["version"] = s.version;
  if (!s.data.empty()) j["data"] = s.data;
  j["model"] = s.model;
  j["train"] = s.train;
  return j;
}

void from_json(JsonObject& in, ExperimentSpec& s) {
  const JsonValue version = in.get("version");
  s.version = static_cast<int>(version.integer());
  if (s.version != 1) version.bad(concat("is ", s.version, "; this build reads version 1"));
  from_json(in, static_cast<Protocol&>(s));
  if (const auto data = in.find("data")) s.data = data->string();
  for (auto [key, target] : {std::pair{"model", &s.model}, std::pair{"train", &s.train}}) {
    if (const auto v = in.find(key)) {
      if (!v->raw().is_object()) v->bad("must be an object");
      *target = v->raw();
    }
  }
}

std::string experiment_spec_path(const std::string& dir) {
  return (std::filesystem::path(dir) / "experiment.json").string();
}

void write_experiment_spec(const std::string& path, const ExperimentSpec& s) {
  write_text_atomically(path, to_json(s).dump(1));
}

ExperimentSpec read_experiment_spec(const std::string& path) {
  require(std::filesystem::exists(path), path, ": not found (is this an experiment directory?)");
  return read_json_file<ExperimentSpec>(path);
}

}  // namespace attnres::results
