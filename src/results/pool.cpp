#include "results/pool.hpp"

#include <filesystem>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::results {

using nlohmann::json;

namespace {

json count_or_null(std::int64_t n) { return n > 0 ? json(n) : json(nullptr); }
std::int64_t count_from(const JsonValue& v) {
  if (v.is_null()) return 0;
  const std::int64_t n = v.integer();
  if (n < 1) v.bad("must be at least 1 or null");
  return n;
}
json string_or_null(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }
std::string string_from(const JsonValue& v) { return v.is_null() ? std::string() : v.string(); }

}  // namespace

json to_json(const PoolDesign& d) {
  json j = {{"dir", d.dir},
            {"design", d.design},
            {"kind", d.kind},
            {"width", count_or_null(d.width)},
            {"depth", count_or_null(d.depth)},
            {"lr", number_or_null(d.lr)},
            {"precision", string_or_null(d.precision)},
            {"tokens", d.tokens},
            {"cpus", d.cpus},
            {"n", d.n},
            {"mean", number_or_null(d.mean)},
            {"sd", number_or_null(d.sd)},
            {"se", number_or_null(d.se)},
            {"ci95_low", number_or_null(d.ci_low)},
            {"ci95_high", number_or_null(d.ci_high)},
            {"pooled", d.pooled}};
  if (d.pooled) j["weight"] = number_or_null(d.weight);
  else j["not_pooled"] = d.not_pooled;
  return j;
}

void from_json(JsonObject& in, PoolDesign& d) {
  d.dir = in.get("dir").string();
  d.design = in.get("design").string();
  d.kind = in.get("kind").string();
  if (d.kind != "main" && d.kind != "controls" && d.kind != "probe")
    in.get("kind").bad("must be \"main\", \"controls\" or \"probe\"");
  d.width = count_from(in.get("width"));
  d.depth = count_from(in.get("depth"));
  d.lr = in.get("lr").number_or_null();
  d.precision = string_from(in.get("precision"));
  d.tokens = in.get("tokens").integer();
  for (const JsonValue& c : in.get("cpus").array()) d.cpus.push_back(c.string());
  d.n = static_cast<int>(in.get("n").integer());
  d.mean = in.get("mean").number_or_null();
  d.sd = in.get("sd").number_or_null();
  d.se = in.get("se").number_or_null();
  d.ci_low = in.get("ci95_low").number_or_null();
  d.ci_high = in.get("ci95_high").number_or_null();
  d.pooled = in.get("pooled").boolean();
  if (d.pooled) d.weight = in.get("weight").number_or_null();
  else d.not_pooled = in.get("not_pooled").string();
}

json to_json(const PoolEstimate& e) {
  return {{"k", e.k},
          {"mean", number_or_null(e.mean)},
          {"se", number_or_null(e.se)},
          {"ci95_low", number_or_null(e.ci_low)},
          {"ci95_high", number_or_null(e.ci_high)},
          {"df", number_or_null(e.df)},
          {"t", number_or_null(e.t)},
          {"p_value", number_or_null(e.p_value)},
          {"hk_q", number_or_null(e.hk_q)},
          {"hk_ci95", {number_or_null(e.hk_ci_low), number_or_null(e.hk_ci_high)}},
          {"dl_normal_ci95", {number_or_null(e.dl_ci_low), number_or_null(e.dl_ci_high)}},
          {"tau2_dl", number_or_null(e.tau2_dl)},
          {"tau2_reml", number_or_null(e.tau2_reml)},
          {"q", number_or_null(e.q)},
          {"q_p_value", number_or_null(e.q_p)},
          {"i2", number_or_null(e.i2)},
          {"fixed_mean", number_or_null(e.fixed_mean)},
          {"fixed_se", number_or_null(e.fixed_se)}};
}

void from_json(JsonObject& in, PoolEstimate& e) {
  e.k = static_cast<int>(in.get("k").integer());
  if (e.k < 2) in.get("k").bad("must be at least 2 (one design is not a meta-analysis)");
  e.mean = in.get("mean").number_or_null();
  e.se = in.get("se").number_or_null();
  e.ci_low = in.get("ci95_low").number_or_null();
  e.ci_high = in.get("ci95_high").number_or_null();
  e.df = in.get("df").number_or_null();
  e.t = in.get("t").number_or_null();
  e.p_value = in.get("p_value").number_or_null();
  e.hk_q = in.get("hk_q").number_or_null();
  const auto pair = [&](const char* key, double& lo, double& hi) {
    const JsonValue v = in.get(key);
    const std::vector<double> b = v.numbers_or_null();
    if (b.size() != 2) v.bad("must have two entries (low, high)");
    lo = b[0];
    hi = b[1];
  };
  pair("hk_ci95", e.hk_ci_low, e.hk_ci_high);
  pair("dl_normal_ci95", e.dl_ci_low, e.dl_ci_high);
  e.tau2_dl = in.get("tau2_dl").number_or_null();
  e.tau2_reml = in.get("tau2_reml").number_or_null();
  e.q = in.get("q").number_or_null();
  e.q_p = in.get("q_p_value").number_or_null();
  e.i2 = in.get("i2").number_or_null();
  e.fixed_mean = in.get("fixed_mean").number_or_null();
  e.fixed_se = in.get("fixed_se").number_or_null();
}

json to_json(const Pool& p) {
  json designs = json::array();
  for (const PoolDesign& d : p.designs) designs.push_back(to_json(d));
  json j;
  j["version"] = p.version;
  j["arm"] = p.arm;
  j["baseline"] = p.baseline;
  j["metric"] = p.metric;
  j["method"] = p.method;
  j["effect"] = number_or_null(p.effect);
  j["designs"] = designs;
  j["pooled"] = p.pooled ? to_json(*p.pooled) : json(nullptr);
  j["futility"] = p.futility;
  j["summary"] = p.summary;
  return j;
}

void from_json(JsonObject& in, Pool& p) {
  const JsonValue version = in.get("version");
  p.version = static_cast<int>(version.integer());
  if (p.version != kPoolVersion) version.bad(concat("is ", p.version, "; this build reads version ", kPoolVersion));
  p.arm = in.get("arm").string();
  p.baseline = in.get("baseline").string();
  p.metric = in.get("metric").string();
  p.method = in.get("method").string();
  p.effect = in.get("effect").number_or_null();
  for (const JsonValue& d : in.get("designs").array()) p.designs.push_back(read_object<PoolDesign>(d));
  const JsonValue pooled = in.get("pooled");
  if (!pooled.is_null()) p.pooled = read_object<PoolEstimate>(pooled);
  p.futility = in.get("futility").string();
  p.summary = in.get("summary").string();
}

std::string pool_path(const std::string& dir) { return (std::filesystem::path(dir) / "pool.json").string(); }

void write_pool(const std::string& path, const Pool& p) { write_text_atomically(path, to_json(p).dump(2) + "\n"); }

Pool read_pool(const std::string& path) { return read_json_file<Pool>(path); }

}  // namespace attnres::results
