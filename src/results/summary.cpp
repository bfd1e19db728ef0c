#include "results/summary.hpp"

#include <cmath>
#include <filesystem>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::results {

using nlohmann::json;

namespace {

template <class T>
json array_json(const std::vector<T>& items) {
  json out = json::array();
  for (const auto& item : items) out.push_back(to_json(item));
  return out;
}

template <class T>
std::vector<T> read_array(const JsonValue& v) {
  std::vector<T> out;
  for (const JsonValue& item : v.array()) out.push_back(read_object<T>(item));
  return out;
}

}  // namespace

json to_json(const SeedValue& v) { return {{"seed", v.seed}, {"value", number_or_null(v.value)}}; }

void from_json(JsonObject& in, SeedValue& v) {
  v.seed = in.get("seed").integer();
  v.value = in.get("value").number_or_null();
}

json to_json(const PowerSummary& p) {
  json j = {{"available", p.available}};
  if (!p.available) {
    j["reason"] = p.reason;
    return j;
  }
  auto seeds = [](int n) { return n > 0 ? json(n) : json(nullptr); };
  j["mde"] = number_or_null(p.mde);
  j["seeds_for_paper_effect"] = seeds(p.seeds_for_paper);
  j["seeds_for_user_effect"] = seeds(p.seeds_for_user);
  return j;
}

void from_json(JsonObject& in, PowerSummary& p) {
  p.available = in.get("available").boolean();
  if (!p.available) {
    p.reason = in.get("reason").string();
    return;
  }
  auto seeds = [&](const char* key) {
    const JsonValue v = in.get(key);
    if (v.is_null()) return 0;
    const auto n = v.integer();
    if (n < 2) v.bad("must be at least 2 or null");
    return static_cast<int>(n);
  };
  p.mde = in.get("mde").number_or_null();
  p.seeds_for_paper = seeds("seeds_for_paper_effect");
  p.seeds_for_user = seeds("seeds_for_user_effect");
}

json to_json(const PairedSummary& p) {
  return {{"n", p.n},
          {"mean", number_or_null(p.mean)},
          {"sd", number_or_null(p.sd)},
          {"ci95_low", number_or_null(p.ci_low)},
          {"ci95_high", number_or_null(p.ci_high)},
          {"t", number_or_null(p.t)},
          {"p_value", number_or_null(p.p_value)},
          {"wins", p.wins}};
}

void from_json(JsonObject& in, PairedSummary& p) {
  p.n = static_cast<int>(in.get("n").integer());
  p.mean = in.get("mean").number_or_null();
  p.sd = in.get("sd").number_or_null();
  p.ci_low = in.get("ci95_low").number_or_null();
  p.ci_high = in.get("ci95_high").number_or_null();
  p.t = in.get("t").number_or_null();
  p.p_value = in.get("p_value").number_or_null();
  p.wins = static_cast<int>(in.get("wins").integer());
}

json to_json(const ArmComparison& a) {
  json j = {{"arm", a.arm},
            {"baseline", a.is_baseline},
            {"nll", array_json(a.values)},
            {"mean_nll", number_or_null(a.mean)}};
  if (!a.is_baseline) {
    j["delta_nll"] = array_json(a.deltas);
    j["paired"] = to_json(a.stats);
    j["ppl_change"] = number_or_null(a.ppl_change);
    j["ppl_reduction"] = number_or_null(-a.ppl_change);
    j["ppl_change_ci95"] = {number_or_null(a.ppl_change_ci_low), number_or_null(a.ppl_change_ci_high)};
    j["power"] = to_json(a.power);
    if (a.floor) j["floor"] = to_json(*a.floor);
  }
  return j;
}

void from_json(JsonObject& in, ArmComparison& a) {
  a.arm = in.get("arm").string();
  a.is_baseline = in.get("baseline").boolean();
  a.values = read_array<SeedValue>(in.get("nll"));
  a.mean = in.get("mean_nll").number_or_null();
  if (a.is_baseline) return;
  a.deltas = read_array<SeedValue>(in.get("delta_nll"));
  a.stats = read_object<PairedSummary>(in.get("paired"));
  a.ppl_change = in.get("ppl_change").number_or_null();
  in.get("ppl_reduction").number_or_null();  // −ppl_change, for readers who want the paper's sign
  const JsonValue ci = in.get("ppl_change_ci95");
  const std::vector<double> bounds = ci.numbers_or_null();
  if (bounds.size() != 2) ci.bad("must have two entries (low, high)");
  a.ppl_change_ci_low = bounds[0];
  a.ppl_change_ci_high = bounds[1];
  a.power = read_object<PowerSummary>(in.get("power"));
  if (const auto f = in.find("floor")) a.floor = read_object<FloorTest>(*f);
}

json to_json(const FloorTest& f) {
  return {{"state", f.state},
          {"twins", f.twins},
          {"pair_sd", number_or_null(f.pair_sd)},
          {"dof", number_or_null(f.dof)},
          {"mean_sd", number_or_null(f.mean_sd)},
          {"margin", number_or_null(f.margin)},
          {"interval", f.interval},
          {"interval_low", number_or_null(f.interval_low)},
          {"interval_high", number_or_null(f.interval_high)},
          {"mean_beyond", f.mean_beyond},
          {"spread_ratio", number_or_null(f.spread_ratio)},
          {"spread_p", number_or_null(f.spread_p)},
          {"spread_beyond", f.spread_beyond}};
}

void from_json(JsonObject& in, FloorTest& f) {
  const JsonValue state = in.get("state");
  f.state = state.string();
  if (f.state != "inside" && f.state != "beyond" && f.state != "undetermined")
    state.bad(concat("is '", f.state, "'; expected inside, beyond or undetermined"));
  for (const JsonValue& v : in.get("twins").array()) f.twins.push_back(v.string());
  f.pair_sd = in.get("pair_sd").number_or_null();
  f.dof = in.get("dof").number_or_null();
  f.mean_sd = in.get("mean_sd").number_or_null();
  f.margin = in.get("margin").number_or_null();
  f.interval = in.get("interval").string();
  f.interval_low = in.get("interval_low").number_or_null();
  f.interval_high = in.get("interval_high").number_or_null();
  f.mean_beyond = in.get("mean_beyond").boolean();
  f.spread_ratio = in.get("spread_ratio").number_or_null();
  f.spread_p = in.get("spread_p").number_or_null();
  f.spread_beyond = in.get("spread_beyond").boolean();
}

json to_json(const RunFailure& f) {
  return {{"arm", f.arm},
          {"seed", f.seed},
          {"failed", f.failed},
          {"reason", f.reason},
          {"clipped_fraction", number_or_null(f.clipped_fraction)},
          {"stall_excess", number_or_null(f.stall_excess)},
          {"stall_step", f.stall_step}};
}

void from_json(JsonObject& in, RunFailure& f) {
  f.arm = in.get("arm").string();
  f.seed = in.get("seed").integer();
  f.failed = in.get("failed").boolean();
  f.reason = in.get("reason").string();
  f.clipped_fraction = in.get("clipped_fraction").number_or_null();
  f.stall_excess = in.get("stall_excess").number_or_null();
  f.stall_step = in.get("stall_step").integer();
}

json to_json(const ArmFailures& f) {
  return {{"arm", f.arm}, {"runs", f.runs}, {"failed", f.failed}, {"fisher_p", number_or_null(f.fisher_p)}};
}

void from_json(JsonObject& in, ArmFailures& f) {
  f.arm = in.get("arm").string();
  f.runs = static_cast<int>(in.get("runs").integer());
  f.failed = static_cast<int>(in.get("failed").integer());
  if (f.failed < 0 || f.failed > f.runs) in.get("failed").bad("must be from 0 to 'runs'");
  f.fisher_p = in.get("fisher_p").number_or_null();
}

const ArmComparison* Comparison::find(const std::string& arm) const {
  for (const auto& a : arms)
    if (a.arm == arm) return &a;
  return nullptr;
}

json to_json(const NoiseFloor& f) {
  return {{"twin", f.twin}, {"n", f.n}, {"mean", number_or_null(f.mean)}, {"sd", number_or_null(f.sd)}};
}

void from_json(JsonObject& in, NoiseFloor& f) {
  f.twin = in.get("twin").string();
  const JsonValue n = in.get("n");
  f.n = static_cast<int>(n.integer());
  if (f.n < 0) n.bad("must be at least 0");
  f.mean = in.get("mean").number_or_null();
  const JsonValue sd = in.get("sd");
  f.sd = sd.number_or_null();
  if (f.sd < 0) sd.bad("must be at least 0");
}

json to_json(const RunInstability& r) {
  return {{"arm", r.arm}, {"seed", r.seed}, {"instability", to_json(r.instability)}};
}

void from_json(JsonObject& in, RunInstability& r) {
  r.arm = in.get("arm").string();
  r.seed = in.get("seed").integer();
  r.instability = read_object<Instability>(in.get("instability"));
}

json to_json(const TwinDrift& d) {
  return {{"seed", d.seed},
          {"part_step", d.part_step ? json(*d.part_step) : json(nullptr)},
          {"steps", d.steps},
          {"max_abs_delta_loss", d.max_abs_delta},
          {"final_abs_delta_loss", d.final_abs_delta}};
}

void from_json(JsonObject& in, TwinDrift& d) {
  d.seed = in.get("seed").integer();
  const JsonValue part = in.get("part_step");
  if (!part.is_null()) {
    d.part_step = part.integer();
    if (*d.part_step < 1) part.bad("must be a step (>= 1) or null");
  }
  d.steps = in.get("steps").integer();
  d.max_abs_delta = in.get("max_abs_delta_loss").number();
  d.final_abs_delta = in.get("final_abs_delta_loss").number();
}

json to_json(const Comparison& c) {
  json j = {{"split", c.split}, {"tokens", c.tokens}, {"arms", array_json(c.arms)}};
  if (c.noise_floor) j["noise_floor"] = to_json(*c.noise_floor);
  if (!c.arm_floors.empty()) j["arm_floors"] = array_json(c.arm_floors);
  return j;
}

void from_json(JsonObject& in, Comparison& c) {
  c.split = in.get("split").string();
  c.tokens = in.get("tokens").integer();
  c.arms = read_array<ArmComparison>(in.get("arms"));
  if (const auto f = in.find("noise_floor")) c.noise_floor = read_object<NoiseFloor>(*f);
  if (const auto f = in.find("arm_floors")) c.arm_floors = read_array<NoiseFloor>(*f);
}

json to_json(const ArmSystems& a) {
  return {{"arm", a.arm},
          {"runs", a.runs},
          {"params", a.params},
          {"params_overhead", number_or_null(a.params_overhead)},
          {"tokens_per_sec", number_or_null(a.tokens_per_sec)},
          {"tokens_per_sec_ratio", number_or_null(a.tokens_per_sec_ratio)},
          {"step_time_ms", number_or_null(a.step_time_ms)},
          {"step_time_ratio", number_or_null(a.step_time_ratio)},
          {"peak_rss_bytes", number_or_null(a.peak_rss_bytes)},
          {"peak_rss_ratio", number_or_null(a.peak_rss_ratio)}};
}

void from_json(JsonObject& in, ArmSystems& a) {
  a.arm = in.get("arm").string();
  a.runs = static_cast<int>(in.get("runs").integer());
  a.params = in.get("params").integer();
  a.params_overhead = in.get("params_overhead").number_or_null();
  a.tokens_per_sec = in.get("tokens_per_sec").number_or_null();
  a.tokens_per_sec_ratio = in.get("tokens_per_sec_ratio").number_or_null();
  a.step_time_ms = in.get("step_time_ms").number_or_null();
  a.step_time_ratio = in.get("step_time_ratio").number_or_null();
  a.peak_rss_bytes = in.get("peak_rss_bytes").number_or_null();
  a.peak_rss_ratio = in.get("peak_rss_ratio").number_or_null();
}

json to_json(const RunKey& k) { return {{"arm", k.arm}, {"seed", k.seed}}; }

void from_json(JsonObject& in, RunKey& k) {
  k.arm = in.get("arm").string();
  k.seed = in.get("seed").integer();
}

namespace {

void put_arms_results(json& j, const ArmsResults& r) {
  j["finished_runs"] = array_json(r.finished_runs);
  j["missing_runs"] = array_json(r.missing_runs);
  j["validation"] = array_json(r.validation);
  j["test"] = to_json(r.test);
  j["routing"] = array_json(r.routing);
  if (!r.connections.empty()) j["connections"] = array_json(r.connections);  // absent in older summaries
  if (!r.amax_gain.empty()) j["amax_gain"] = array_json(r.amax_gain);        // likewise
  j["systems"] = array_json(r.systems);
  if (!r.twin_drift.empty()) j["twin_drift"] = array_json(r.twin_drift);  // with a twin only
  if (!r.instability.empty()) j["instability"] = array_json(r.instability);  // runs with curves
  if (!r.not_needed_runs.empty()) j["not_needed_runs"] = array_json(r.not_needed_runs);
  if (!r.failures.empty()) {  // with a failure rule only
    j["failures"] = array_json(r.failures);
    j["failure_counts"] = array_json(r.failure_counts);
  }
  if (r.without_failures) j["without_failures"] = to_json(*r.without_failures);
  if (!r.provenance.empty()) j["provenance"] = array_json(r.provenance);     // runs that record it
}

void read_arms_results(JsonObject& in, ArmsResults& r) {
  r.finished_runs = read_array<RunKey>(in.get("finished_runs"));
  r.missing_runs = read_array<RunKey>(in.get("missing_runs"));
  r.validation = read_array<Comparison>(in.get("validation"));
  r.test = read_object<Comparison>(in.get("test"));
  r.routing = read_array<ArmRouting>(in.get("routing"));
  // Optional: summaries written before attnres recorded connections have none.
  if (const auto connections = in.find("connections")) r.connections = read_array<ArmConnections>(*connections);
  if (const auto gain = in.find("amax_gain")) r.amax_gain = read_array<ArmGain>(*gain);
  r.systems = read_array<ArmSystems>(in.get("systems"));
  if (const auto drift = in.find("twin_drift")) r.twin_drift = read_array<TwinDrift>(*drift);
  if (const auto inst = in.find("instability")) r.instability = read_array<RunInstability>(*inst);
  if (const auto n = in.find("not_needed_runs")) r.not_needed_runs = read_array<RunKey>(*n);
  if (const auto f = in.find("failures")) {
    r.failures = read_array<RunFailure>(*f);
    r.failure_counts = read_array<ArmFailures>(in.get("failure_counts"));
  }
  if (const auto w = in.find("without_failures")) r.without_failures = read_object<Comparison>(*w);
  if (const auto p = in.find("provenance")) r.provenance = read_array<ProvenanceCount>(*p);
}

}  // namespace

json to_json(const GroupSummary& g) {
  json j = {{"name", g.name},         {"kind", g.kind},     {"baseline", g.baseline},
            {"baseline_from_main", g.baseline_from_main}, {"tokens", g.tokens}, {"settings", g.settings}};
  put_arms_results(j, g);
  return j;
}

void from_json(JsonObject& in, GroupSummary& g) {
  g.name = in.get("name").string();
  g.kind = in.get("kind").string();
  g.baseline = in.get("baseline").string();
  g.baseline_from_main = in.get("baseline_from_main").boolean();
  g.tokens = in.get("tokens").integer();
  for (const JsonValue& v : in.get("settings").array()) g.settings.push_back(v.string());
  read_arms_results(in, g);
}

json to_json(const SequentialLook& l) {
  return {{"n", l.n},
          {"mean", number_or_null(l.mean)},
          {"sd", number_or_null(l.sd)},
          {"rci_low", number_or_null(l.ci_low)},
          {"rci_high", number_or_null(l.ci_high)},
          {"t", number_or_null(l.t)},
          {"t_boundary", number_or_null(l.t_boundary)},
          {"nominal_p", number_or_null(l.nominal_p)},
          {"p_adjusted", number_or_null(l.p_adjusted)},
          {"crossed", l.crossed}};
}

void from_json(JsonObject& in, SequentialLook& l) {
  const JsonValue n = in.get("n");
  l.n = static_cast<int>(n.integer());
  if (l.n < 2) n.bad("must be at least 2");
  l.mean = in.get("mean").number_or_null();
  l.sd = in.get("sd").number_or_null();
  l.ci_low = in.get("rci_low").number_or_null();
  l.ci_high = in.get("rci_high").number_or_null();
  l.t = in.get("t").number_or_null();
  l.t_boundary = in.get("t_boundary").number_or_null();
  l.nominal_p = in.get("nominal_p").number_or_null();
  const JsonValue p = in.get("p_adjusted");
  l.p_adjusted = p.number_or_null();
  if (l.p_adjusted < 0 || l.p_adjusted > 1) p.bad("must lie in [0, 1]");
  l.crossed = in.get("crossed").boolean();
}

json to_json(const SequentialSummary& s) {
  return {{"design", to_json(s.design)},
          {"nominal_alpha", number_or_null(s.nominal_alpha)},
          {"type_one_error", number_or_null(s.type_one_error)},
          {"outcome", s.outcome},
          {"look", s.look},
          {"next_seeds", s.next_seeds},
          {"looks", array_json(s.looks)},
          {"power", number_or_null(s.power)}};
}

void from_json(JsonObject& in, SequentialSummary& s) {
  s.design = read_object<SequentialSpec>(in.get("design"));
  s.nominal_alpha = in.get("nominal_alpha").number_or_null();
  s.type_one_error = in.get("type_one_error").number_or_null();
  const JsonValue outcome = in.get("outcome");
  s.outcome = outcome.string();
  if (s.outcome != "continuing" && s.outcome != "resolved" && s.outcome != "futile" && s.outcome != "not resolved")
    outcome.bad(concat("is '", s.outcome, "'; expected continuing, resolved, futile or not resolved"));
  const JsonValue look = in.get("look");
  s.look = static_cast<int>(look.integer());
  s.next_seeds = static_cast<int>(in.get("next_seeds").integer());
  s.looks = read_array<SequentialLook>(in.get("looks"));
  if (s.look < -1 || s.look >= static_cast<int>(s.looks.size())) look.bad("must index 'looks' (or be -1)");
  s.power = in.get("power").number_or_null();
}

json to_json(const Summary& s) {
  json j = {{"version", 2},
            {"experiment", to_json(s.experiment)},
            {"power", {{"alpha", number_or_null(s.power_alpha)}, {"power", number_or_null(s.power_target)},
                       {"test", "paired two-sided t"},
                       {"paper_effect", number_or_null(s.paper_effect)},
                       {"user_effect", number_or_null(s.user_effect)}}}};
  put_arms_results(j, s);
  j["groups"] = array_json(s.groups);
  if (s.sequential) j["sequential"] = to_json(*s.sequential);
  return j;
}

void from_json(JsonObject& in, Summary& s) {
  const JsonValue version = in.get("version");
  if (version.integer() != 2) version.bad(concat("is ", version.integer(), "; this build reads version 2"));
  s.experiment = read_object<Protocol>(in.get("experiment"));
  JsonObject power = in.get("power").object();
  s.power_alpha = power.get("alpha").number();
  s.power_target = power.get("power").number();
  power.get("test").string();
  s.paper_effect = power.get("paper_effect").number_or_null();
  s.user_effect = power.get("user_effect").number_or_null();
  power.finish();
  read_arms_results(in, s);
  s.groups = read_array<GroupSummary>(in.get("groups"));
  if (const auto seq = in.find("sequential")) s.sequential = read_object<SequentialSummary>(*seq);
}

std::string summary_path(const std::string& dir) { return (std::filesystem::path(dir) / "summary.json").string(); }

void write_summary(const std::string& path, const Summary& s) {
  write_text_atomically(path, to_json(s).dump(2) + "\n");
}

Summary read_summary(const std::string& path) { return read_json_file<Summary>(path); }

}  // namespace attnres::results
