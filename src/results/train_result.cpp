#include "results/train_result.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "util/atomic_file.hpp"

namespace attnres::results {

using nlohmann::json;

json to_json(const Milestone& m) {
  json j = {{"tokens", m.tokens}, {"val_nll", m.val_nll}};
  if (m.step) j["step"] = *m.step;
  return j;
}

void from_json(JsonObject& in, Milestone& m) {
  if (const auto step = in.find("step")) m.step = step->integer();
  m.tokens = in.get("tokens").integer();
  m.val_nll = in.get("val_nll").number();
}

json to_json(const LossPoint& p) {
  json j = {{"tokens", p.tokens}, {"train_loss", p.train_loss}};
  if (std::isfinite(p.grad_norm)) j["grad_norm"] = p.grad_norm;
  return j;
}

void from_json(JsonObject& in, LossPoint& p) {
  p.tokens = in.get("tokens").integer();
  p.train_loss = in.get("train_loss").number();
  if (const auto norm = in.find("grad_norm"); norm && !norm->is_null()) p.grad_norm = norm->non_negative();
}

json to_json(const TrainResult& r) {
  json milestones = json::array(), curve = json::array();
  for (const auto& m : r.milestones) milestones.push_back(to_json(m));
  for (const auto& p : r.curve) curve.push_back(to_json(p));
  json j = {{"params", r.params},
            {"steps", r.steps},
            {"milestones", std::move(milestones)},
            {"curve", std::move(curve)},
            {"tokens_per_sec", r.tokens_per_sec},
            {"step_time_ms", r.step_time_ms},
            {"peak_rss_bytes", r.peak_rss_bytes},
            {"processes", r.processes},
            {"reduce_fraction", r.reduce_fraction},
            {"micro_batches", r.micro_batches}};
  if (r.cpu_seconds_per_step > 0) j["cpu_seconds_per_step"] = r.cpu_seconds_per_step;  // none: not recorded
  if (r.instability) j["instability"] = to_json(*r.instability);
  if (r.provenance) j["provenance"] = to_json(*r.provenance);
  put_schema_version(j, r.version);
  return j;
}

void from_json(JsonObject& in, TrainResult& r) {
  r.version = read_schema_version(in, kTrainResultVersion);
  r.params = in.get("params").integer();
  r.steps = in.get("steps").integer();
  for (const JsonValue& m : in.get("milestones").array()) r.milestones.push_back(read_object<Milestone>(m));
  for (const JsonValue& p : in.get("curve").array()) r.curve.push_back(read_object<LossPoint>(p));
  r.tokens_per_sec = in.get("tokens_per_sec").non_negative();
  r.step_time_ms = in.get("step_time_ms").non_negative();
  // Optional: written since the CPU time was recorded.
  if (const auto c = in.find("cpu_seconds_per_step"); c && !c->is_null()) r.cpu_seconds_per_step = c->non_negative();
  r.peak_rss_bytes = in.get("peak_rss_bytes").integer();
  r.processes = static_cast<int>(in.get("processes").integer());
  r.reduce_fraction = in.get("reduce_fraction").non_negative();
  r.micro_batches = static_cast<int>(in.get("micro_batches").integer());
  // Optional: written since the instability was recorded.
  if (const auto s = in.find("instability"); s && !s->is_null()) r.instability = read_object<Instability>(*s);
  // Optional: written since the provenance was recorded.
  if (const auto p = in.find("provenance"); p && !p->is_null()) r.provenance = read_object<Provenance>(*p);
}

double tokens_per_core_second(double tokens_per_sec, double step_time_ms, double cpu_seconds_per_step, int threads,
                              int processes) {
  if (cpu_seconds_per_step > 0 && step_time_ms > 0)
    return tokens_per_sec * (step_time_ms / 1000.0) / (cpu_seconds_per_step * double(std::max(processes, 1)));
  return tokens_per_sec / double(std::max(threads, 1) * std::max(processes, 1));
}

std::string train_result_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "train_result.json").string();
}

void write_train_result(const std::string& path, const TrainResult& r) {
  write_text_atomically(path, to_json(r).dump(1));
}

TrainResult read_train_result(const std::string& path) { return read_json_file<TrainResult>(path); }

}  // namespace attnres::results
