#include "results/provenance.hpp"

#include <algorithm>
#include <functional>
#include <set>
#include <utility>

#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_f32.hpp"
#include "results/run_result.hpp"
#include "util/build_info.hpp"
#include "util/error.hpp"
#include "util/machine.hpp"
#include "util/threads.hpp"

namespace attnres::results {

using nlohmann::json;

namespace {

json dirty_json(const std::optional<bool>& dirty) { return dirty ? json(*dirty) : json(nullptr); }

std::optional<bool> read_dirty(const JsonValue& v) {
  if (v.is_null()) return std::nullopt;
  return v.boolean();
}

// "unknown" or a commit hash's hex digits.
std::string read_commit(const JsonValue& v) {
  const std::string commit = v.string();
  const bool hex = !commit.empty() && std::all_of(commit.begin(), commit.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
  if (commit != "unknown" && !hex) v.bad(concat("is '", commit, "'; expected a commit hash (hex digits) or \"unknown\""));
  return commit;
}

// A backend's name as `parse` (kernels') reads it, not "automatic".
template <class Parse>
std::string read_backend(const JsonValue& v, Parse parse, const char* what) {
  const std::string name = v.string();
  bool known = false;
  try {
    known = name != "automatic" && (parse(name), true);
  } catch (const Error&) {
  }
  if (!known) v.bad(concat("is '", name, "', not a ", what));
  return name;
}

std::string non_empty(const JsonValue& v) {
  std::string s = v.string();
  if (s.empty()) v.bad("must not be empty");
  return s;
}

std::string binary_label(const std::string& commit, const std::optional<bool>& dirty) {
  return dirty.value_or(false) ? commit + "-dirty" : commit;
}

// "2 binaries: a (3 runs), b (1 run)" for the distinct values of `label` over `counts`; "" when
// there is only one.
std::string differing(const std::vector<ProvenanceCount>& counts, const char* plural,
                      const std::function<std::string(const ProvenanceCount&)>& label) {
  std::vector<std::pair<std::string, int>> seen;
  for (const ProvenanceCount& c : counts) {
    const std::string l = label(c);
    auto it = std::find_if(seen.begin(), seen.end(), [&](const auto& s) { return s.first == l; });
    if (it == seen.end()) seen.emplace_back(l, c.runs);
    else it->second += c.runs;
  }
  if (seen.size() < 2) return "";
  std::string out = concat(seen.size(), " ", plural, ": ");
  for (std::size_t i = 0; i < seen.size(); ++i)
    out += concat(i > 0 ? ", " : "", seen[i].first, " (", seen[i].second, seen[i].second == 1 ? " run)" : " runs)");
  return out;
}

}  // namespace

Provenance process_provenance(const std::string& device, bool bf16_matmuls) {
  Provenance p;
  const BuildInfo& build = build_info();
  p.attnres_version = build.version;
  p.commit = build.commit;
  p.dirty = build.dirty;
  p.device = device;
  p.gemm_backend = kernels::to_string(kernels::fp32_gemm_backend());
  if (bf16_matmuls && device == "cpu") p.bf16_backend = kernels::to_string(kernels::bf16_backend());
  p.blas_core = openblas_core();
  p.cpu_model = cpu_model();
  const std::vector<std::string> flags = cpu_flags();
  for (const std::string_view flag : kProvenanceCpuFlags)
    if (std::find(flags.begin(), flags.end(), flag) != flags.end()) p.cpu_flags.emplace_back(flag);
  p.threads = num_threads();
  return p;
}

json to_json(const Provenance& p) {
  json j = {{"attnres_version", p.attnres_version},
            {"commit", p.commit},
            {"dirty", dirty_json(p.dirty)},
            {"device", p.device},
            {"gemm_backend", p.gemm_backend}};
  if (p.bf16_backend) j["bf16_backend"] = *p.bf16_backend;
  j["blas_core"] = p.blas_core;
  j["cpu_model"] = p.cpu_model;
  j["cpu_flags"] = p.cpu_flags;
  j["threads"] = p.threads;
  return j;
}

void from_json(JsonObject& in, Provenance& p) {
  p.attnres_version = non_empty(in.get("attnres_version"));
  p.commit = read_commit(in.get("commit"));
  p.dirty = read_dirty(in.get("dirty"));
  p.device = non_empty(in.get("device"));
  p.gemm_backend = read_backend(in.get("gemm_backend"), kernels::parse_fp32_gemm, "fp32 GEMM backend");
  if (const auto bf16 = in.find("bf16_backend"))
    p.bf16_backend = read_backend(*bf16, kernels::parse_bf16_backend, "bf16 GEMM backend");
  p.blas_core = non_empty(in.get("blas_core"));
  p.cpu_model = non_empty(in.get("cpu_model"));
  std::set<std::string> seen;
  for (const JsonValue& v : in.get("cpu_flags").array()) {
    std::string flag = v.string();
    if (std::find(kProvenanceCpuFlags.begin(), kProvenanceCpuFlags.end(), flag) == kProvenanceCpuFlags.end()) {
      std::string known;
      for (const std::string_view f : kProvenanceCpuFlags) known += concat(known.empty() ? "" : ", ", f);
      v.bad(concat("is '", flag, "', not one of the flags attnres records (", known, ")"));
    }
    if (!seen.insert(flag).second) v.bad(concat("repeats '", flag, "'"));
    p.cpu_flags.push_back(std::move(flag));
  }
  const JsonValue threads = in.get("threads");
  const std::int64_t n = threads.integer();
  if (n < 1 || n > 1'000'000) threads.bad("must be an integer from 1 to 1000000");
  p.threads = static_cast<int>(n);
}

json to_json(const ProvenanceCount& c) {
  return {{"commit", c.commit},
          {"dirty", dirty_json(c.dirty)},
          {"cpu_model", c.cpu_model},
          {"gemm_backend", c.gemm_backend},
          {"blas_core", c.blas_core},
          {"runs", c.runs}};
}

void from_json(JsonObject& in, ProvenanceCount& c) {
  c.commit = read_commit(in.get("commit"));
  c.dirty = read_dirty(in.get("dirty"));
  c.cpu_model = non_empty(in.get("cpu_model"));
  c.gemm_backend = read_backend(in.get("gemm_backend"), kernels::parse_fp32_gemm, "fp32 GEMM backend");
  c.blas_core = non_empty(in.get("blas_core"));
  const JsonValue runs = in.get("runs");
  const std::int64_t n = runs.integer();
  if (n < 1 || n > 1'000'000'000) runs.bad("must be an integer from 1 to 1000000000");
  c.runs = static_cast<int>(n);
}

std::vector<ProvenanceCount> provenance_counts(std::span<const RunResult> runs) {
  std::vector<ProvenanceCount> out;
  for (const RunResult& r : runs) {
    if (!r.provenance) continue;
    const Provenance& p = *r.provenance;
    auto it = std::find_if(out.begin(), out.end(), [&](const ProvenanceCount& c) {
      return c.commit == p.commit && c.dirty == p.dirty && c.cpu_model == p.cpu_model &&
             c.gemm_backend == p.gemm_backend && c.blas_core == p.blas_core;
    });
    if (it == out.end()) out.push_back({p.commit, p.dirty, p.cpu_model, p.gemm_backend, p.blas_core, 1});
    else ++it->runs;
  }
  return out;
}

std::optional<std::string> provenance_note(std::span<const RunResult> runs) {
  const std::vector<ProvenanceCount> counts = provenance_counts(runs);
  if (counts.empty()) return std::nullopt;
  std::vector<std::string> parts;
  for (std::string part :
       {differing(counts, "binaries", [](const ProvenanceCount& c) { return binary_label(c.commit, c.dirty); }),
        differing(counts, "CPUs", [](const ProvenanceCount& c) { return c.cpu_model; }),
        differing(counts, "GEMM setups",
                  [](const ProvenanceCount& c) { return concat(c.gemm_backend, " on OpenBLAS ", c.blas_core); })})
    if (!part.empty()) parts.push_back(std::move(part));
  std::string note;
  for (std::size_t i = 0; i < parts.size(); ++i) note += concat(i == 0 ? "the runs came from " : "; ", parts[i]);
  const auto unrecorded = std::count_if(runs.begin(), runs.end(), [](const RunResult& r) { return !r.provenance; });
  if (unrecorded > 0)
    note += concat(note.empty() ? "" : "; ", unrecorded, " of the ", runs.size(),
                   unrecorded == 1 ? " runs records" : " runs record", " no provenance (written by an earlier attnres)");
  if (note.empty()) return std::nullopt;
  return note;
}

}  // namespace attnres::results
