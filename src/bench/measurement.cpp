#include "bench/measurement.hpp"

#include <algorithm>

#include "model/arms.hpp"
#include "analysis/stats.hpp"

namespace attnres::bench {

using nlohmann::json;

double median(const std::vector<double>& v) { return v.empty() ? 0 : analysis::median_interval(v).median; }

ModelConfig arm_config(const TrainConfig& base, const std::string& arm, int seq) {
  ModelConfig m = apply_arm(base.model, arm);
  m.max_seq_len = std::max(m.max_seq_len, seq);
  m.validate();
  return m;
}

double Cell::cores_used() const {
  std::vector<double> r;
  for (std::size_t i = 0; i < step_ms.size() && i < cpu_ms.size(); ++i) r.push_back(cpu_ms[i] / step_ms[i]);
  return median(r);
}

void Cell::absorb(const json& r) {
  auto append = [](std::vector<double>& to, const json& j, const char* key) {
    if (j.contains(key))
      for (double x : j.at(key).get<std::vector<double>>()) to.push_back(x);
  };
  append(step_ms, r, "step_ms");
  append(cpu_ms, r, "cpu_ms");
  append(fb_ms, r, "forward_backward_ms");
  append(opt_ms, r, "clip_adamw_ms");
  peak_rss = std::max(peak_rss, r.at("peak_rss_bytes").get<std::int64_t>());
  start_rss = r.value("start_rss_bytes", std::int64_t(0));
  params = r.value("params", std::int64_t(0));
  loss_first = r.value("loss_first", 0.0);
  core = r.value("openblas_core", std::string("unknown"));
  precision = r.at("precision").get<std::string>();
  threads = r.value("threads", 0);
}

const Cell* Measurement::find(const std::string& impl, const std::string& arm, int seq) const {
  for (const auto& c : cells)
    if (c.impl == impl && c.arm == arm && c.seq == seq) return &c;
  return nullptr;
}

Cell& Measurement::get(const std::string& impl, const std::string& arm, int seq, int batch) {
  for (auto& c : cells)
    if (c.impl == impl && c.arm == arm && c.seq == seq) return c;
  Cell& c = cells.emplace_back();
  c.impl = impl;
  c.arm = arm;
  c.seq = seq;
  c.batch = batch;
  return c;
}

json paired_across_processes(const json& paired) {
  json out = json::array();
  for (const json& p : paired) {
    const auto same = [&](const json& x) { return x["a"] == p["a"] && x["b"] == p["b"] && x["seq"] == p["seq"]; };
    if (std::any_of(out.begin(), out.end(), same)) continue;
    std::vector<double> ratios;
    for (const json& q : paired)
      if (same(q)) ratios.push_back(q["step_time_ratio"].get<double>());
    if (ratios.size() < 2) continue;
    out.push_back({{"a", p["a"]},
                   {"b", p["b"]},
                   {"seq", p["seq"]},
                   {"processes", ratios.size()},
                   {"step_time_ratio", median(ratios)},
                   {"ratio_min", *std::min_element(ratios.begin(), ratios.end())},
                   {"ratio_max", *std::max_element(ratios.begin(), ratios.end())},
                   {"ratios", ratios}});
  }
  return out;
}

json paired_summary(const json& r, const std::string& a, const std::string& b, int seq, int batch) {
  const auto ratios = r.at("ratio_b_over_a").get<std::vector<double>>();
  const analysis::MedianInterval ratio = analysis::median_interval(ratios);
  return {{"seq", seq},
          {"batch", batch},
          {"a", a},
          {"b", b},
          {"step_time_ratio", ratio.median},
          {"ratio_ci95_low", ratio.low},
          {"ratio_ci95_high", ratio.high},
          {"ratio_min", *std::min_element(ratios.begin(), ratios.end())},
          {"ratio_max", *std::max_element(ratios.begin(), ratios.end())},
          {"a_ms_median", median(r.at("step_ms_a").get<std::vector<double>>())},
          {"b_ms_median", median(r.at("step_ms_b").get<std::vector<double>>())},
          {"ratios", ratios}};
}

}  // namespace attnres::bench
