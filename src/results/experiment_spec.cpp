#include "results/experiment_spec.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::results {

using nlohmann::json;

namespace {

// A list of distinct valid names (arms or groups).
std::vector<std::string> read_names(const JsonValue& list, const char* what) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const JsonValue& v : list.array()) {
    if (!v.raw().is_string() || v.raw().get<std::string>().empty()) v.bad("must be a non-empty string");
    const std::string name = v.string();
    if (!valid_name(name)) v.bad(concat("'", name, "' is not a valid ", what, " name"));
    if (!seen.insert(name).second) v.bad(concat("repeats ", what, " '", name, "'"));
    names.push_back(name);
  }
  if (names.empty()) list.bad("must not be empty");
  return names;
}

std::string read_baseline(JsonObject& in, const std::vector<std::string>& arms) {
  const JsonValue baseline = in.get("baseline");
  const std::string b = baseline.string();
  if (std::find(arms.begin(), arms.end(), b) == arms.end()) baseline.bad(concat("'", b, "' is not one of 'arms'"));
  return b;
}

std::vector<std::int64_t> read_milestones(JsonObject& in) {
  const JsonValue milestones = in.get("milestones");
  std::vector<std::int64_t> out;
  for (const JsonValue& v : milestones.array()) {
    const std::int64_t m = v.integer();
    if (m <= 0) v.bad("must be positive");
    if (!out.empty() && m <= out.back()) v.bad("must be larger than the one before");
    out.push_back(m);
  }
  if (out.empty()) milestones.bad("must not be empty");
  return out;
}

std::int64_t read_tokens(JsonObject& in) {
  const JsonValue tokens = in.get("tokens");
  const std::int64_t t = tokens.integer();
  if (t <= 0) tokens.bad("must be positive");
  return t;
}

json read_passthrough_object(JsonObject& in, const char* key) {
  if (const auto v = in.find(key)) {
    if (!v->raw().is_object()) v->bad("must be an object");
    return v->raw();
  }
  return json::object();
}

}  // namespace

bool valid_name(const std::string& name) {
  return !name.empty() && name.find_first_of("/\\<>&\"' ") == std::string::npos && name != "." && name != "..";
}

json to_json(const Protocol& p) {
  return {{"arms", p.arms},     {"baseline", p.baseline},     {"seeds", p.seeds},
          {"tokens", p.tokens}, {"milestones", p.milestones}, {"preset", p.preset}};
}

void from_json(JsonObject& in, Protocol& p) {
  p.arms = read_names(in.get("arms"), "arm");
  p.baseline = read_baseline(in, p.arms);
  const JsonValue seeds = in.get("seeds");
  std::set<std::int64_t> seen_seeds;
  for (const JsonValue& v : seeds.array()) {
    const std::int64_t seed = v.integer();
    if (!seen_seeds.insert(seed).second) v.bad(concat("repeats seed ", seed));
    p.seeds.push_back(seed);
  }
  if (p.seeds.empty()) seeds.bad("must not be empty");
  p.tokens = read_tokens(in);
  p.milestones = read_milestones(in);
  if (const auto preset = in.find("preset")) p.preset = preset->string();
}

json to_json(const GroupSpec& g) {
  json j = {{"name", g.name},
          {"kind", g.kind},
          {"arms", g.arms},
          {"baseline", g.baseline},
          {"baseline_from_main", g.baseline_from_main},
          {"tokens", g.tokens},
          {"milestones", g.milestones},
          {"settings", g.settings},
          {"model", g.model},
          {"train", g.train}};
  if (g.seed_count > 0) j["seed_count"] = g.seed_count;
  return j;
}

void from_json(JsonObject& in, GroupSpec& g) {
  const JsonValue name = in.get("name");
  g.name = name.string();
  if (!valid_name(g.name) || g.name == "main") name.bad(concat("'", g.name, "' is not a valid group name"));
  const JsonValue kind = in.get("kind");
  g.kind = kind.string();
  if (g.kind != "controls" && g.kind != "probe") kind.bad(concat("is '", g.kind, "'; expected controls or probe"));
  g.arms = read_names(in.get("arms"), "arm");
  g.baseline = read_baseline(in, g.arms);
  g.baseline_from_main = in.get("baseline_from_main").boolean();
  g.tokens = read_tokens(in);
  g.milestones = read_milestones(in);
  for (const JsonValue& v : in.get("settings").array()) g.settings.push_back(v.string());
  g.model = read_passthrough_object(in, "model");
  g.train = read_passthrough_object(in, "train");
  if (const auto n = in.find("seed_count")) {
    g.seed_count = static_cast<int>(n->integer());
    if (g.seed_count < 2) n->bad("must be at least 2 (a paired comparison needs two seeds)");
  }
}

json to_json(const SequentialSpec& s) {
  return {{"looks", s.looks},   {"max_seeds", s.max_seeds}, {"alpha", s.alpha},
          {"spending", s.spending}, {"effect", s.effect},   {"primary", s.primary}};
}

void from_json(JsonObject& in, SequentialSpec& s) {
  const JsonValue looks = in.get("looks");
  for (const JsonValue& v : looks.array()) {
    const std::int64_t n = v.integer();
    if (n < 2) v.bad("must be at least 2 (a paired t-test needs two seeds)");
    if (!s.looks.empty() && n <= s.looks.back()) v.bad("must be larger than the look before");
    s.looks.push_back(static_cast<int>(n));
  }
  if (s.looks.empty()) looks.bad("must not be empty");
  const JsonValue max_seeds = in.get("max_seeds");
  s.max_seeds = static_cast<int>(max_seeds.integer());
  if (s.max_seeds != s.looks.back()) max_seeds.bad(concat("is ", s.max_seeds, " but the last look is ", s.looks.back()));
  const JsonValue alpha = in.get("alpha");
  s.alpha = alpha.number();
  if (!(s.alpha > 0 && s.alpha < 1)) alpha.bad("must be in (0, 1)");
  const JsonValue spending = in.get("spending");
  s.spending = spending.string();
  if (s.spending != "obrien-fleming" && s.spending != "pocock")
    spending.bad(concat("is '", s.spending, "'; expected obrien-fleming or pocock"));
  const JsonValue effect = in.get("effect");
  s.effect = effect.number();
  if (!(s.effect > 0)) effect.bad("must be a positive number of nats");
  s.primary = in.get("primary").string();
}

json to_json(const FailureRule& f) {
  return {{"clipped_fraction", f.clipped_fraction}, {"stall_nats", f.stall_nats}, {"stall_steps", f.stall_steps}};
}

void from_json(JsonObject& in, FailureRule& f) {
  const JsonValue clipped = in.get("clipped_fraction");
  f.clipped_fraction = clipped.number();
  if (!(f.clipped_fraction > 0 && f.clipped_fraction <= 1)) clipped.bad("must be in (0, 1]");
  const JsonValue nats = in.get("stall_nats");
  f.stall_nats = nats.number();
  if (!(f.stall_nats > 0)) nats.bad("must be a positive number of nats");
  const JsonValue steps = in.get("stall_steps");
  f.stall_steps = static_cast<int>(steps.integer());
  if (f.stall_steps < 1) steps.bad("must be at least 1");
}

std::vector<std::int64_t> ExperimentSpec::seeds_of(const std::string& group, const std::string& arm) const {
  int count = 0;
  if (group.empty()) {
    if (!arm.empty() && arm.back() == '~') count = twin_seeds;
  } else if (const GroupSpec* g = find_group(group)) {
    count = g->seed_count;
  }
  if (count <= 0 || count >= static_cast<int>(seeds.size())) return seeds;
  return {seeds.begin(), seeds.begin() + count};
}

const GroupSpec* ExperimentSpec::find_group(const std::string& group) const {
  for (const auto& g : groups)
    if (g.name == group) return &g;
  return nullptr;
}

json to_json(const ExperimentSpec& s) {
  json j = to_json(static_cast<const Protocol&>(s));
  j["version"] = s.version;
  if (s.version >= 2) {
    j["name"] = s.name;
    if (!s.description.empty()) j["description"] = s.description;
    j["dataset"] = s.dataset;
  }
  if (!s.data.empty()) j["data"] = s.data;
  j["model"] = s.model;
  j["train"] = s.train;
  if (s.version >= 2) {
    json groups = json::array();
    for (const auto& g : s.groups) groups.push_back(to_json(g));
    j["groups"] = std::move(groups);
    if (s.sequential) j["sequential"] = to_json(*s.sequential);
    if (s.failure) j["failure"] = to_json(*s.failure);
  }
  if (s.twin_perturbation > 0) j["twin_perturbation"] = s.twin_perturbation;
  if (s.twin_seeds > 0) j["twin_seeds"] = s.twin_seeds;
  if (s.floor_margin > 0) j["floor_margin"] = s.floor_margin;
  return j;
}

void from_json(JsonObject& in, ExperimentSpec& s) {
  const JsonValue version = in.get("version");
  s.version = static_cast<int>(version.integer());
  if (s.version != 1 && s.version != 2) version.bad(concat("is ", s.version, "; this build reads versions 1 and 2"));
  from_json(in, static_cast<Protocol&>(s));
  if (const auto data = in.find("data")) s.data = data->string();
  s.model = read_passthrough_object(in, "model");
  s.train = read_passthrough_object(in, "train");
  if (const auto p = in.find("twin_perturbation")) {
    s.twin_perturbation = p->number();
    if (!(s.twin_perturbation > 0 && s.twin_perturbation <= 0.01)) p->bad("must be in (0, 0.01]");
  }
  if (const auto t = in.find("twin_seeds")) {
    s.twin_seeds = static_cast<int>(t->integer());
    if (s.twin_seeds < 2) t->bad("must be at least 2 (a floor needs two seeds)");
  }
  if (const auto m = in.find("floor_margin")) {
    s.floor_margin = m->number();
    if (!(s.floor_margin > 0)) m->bad("must be a positive number of nats");
  }
  if (s.version == 1) return;
  if (const auto f = in.find("failure")) s.failure = read_object<FailureRule>(*f);
  s.name = in.get("name").string();
  if (const auto d = in.find("description")) s.description = d->string();
  s.dataset = read_passthrough_object(in, "dataset");
  const JsonValue groups = in.get("groups");
  std::set<std::string> names(s.arms.begin(), s.arms.end());
  for (const JsonValue& v : groups.array()) {
    GroupSpec g = read_object<GroupSpec>(v);
    if (!names.insert(g.name).second) v.bad(concat("group name '", g.name, "' repeats a group or an arm name"));
    if (g.baseline_from_main) {
      if (std::find(s.arms.begin(), s.arms.end(), g.baseline) == s.arms.end())
        v.bad(concat("reuses the main runs of its baseline '", g.baseline, "', which is not a main arm"));
      for (const auto m : g.milestones)
        if (std::find(s.milestones.begin(), s.milestones.end(), m) == s.milestones.end())
          v.bad(concat("reuses the main runs of its baseline but its milestone ", m, " is not a main milestone"));
    }
    s.groups.push_back(std::move(g));
  }
  if (const auto seq = in.find("sequential")) {
    s.sequential = read_object<SequentialSpec>(*seq);
    const std::string& primary = s.sequential->primary;
    if (primary == s.baseline || std::find(s.arms.begin(), s.arms.end(), primary) == s.arms.end())
      seq->bad(concat("names primary arm '", primary, "', which is not a compared arm of 'arms'"));
    if (static_cast<int>(s.seeds.size()) < s.sequential->max_seeds)
      seq->bad(concat("has max_seeds ", s.sequential->max_seeds, " but 'seeds' lists ", s.seeds.size()));
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
