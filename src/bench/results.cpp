#include "bench/results.hpp"

#include <algorithm>
#include <cstdio>

#include "analysis/format.hpp"
#include "bench/flops.hpp"
#include "model/arms.hpp"
#include "util/machine.hpp"
#include "util/error.hpp"

namespace attnres::bench {

namespace {

using nlohmann::json;

constexpr double kTargetSpeedup = 3.0;   // attnres tokens/s over torch's, block and rd on `small`
constexpr double kTargetRdBlock = 1.02;  // rd over block: step time and peak memory
// Context scaling: tokens/s at T = 4096 at least this fraction of that at T = 256, the same tokens
// per step.
constexpr double kTargetContextScaling = 0.7;
constexpr int kContextShort = 256, kContextLong = 4096;

json flops_json(const FlopCount& f) {
  return {{"dense", f.dense}, {"lm_head", f.lm_head}, {"attention", f.attention}, {"depth_reads", f.depth_reads},
          {"total", f.total()}};
}

// The reference a step of `precision` states its MFU against.
const RateReference& reference_for(const Results& r, const std::string& precision) {
  if (precision != "bf16") return r.fp32_reference;
  ATTNRES_CHECK(r.bf16_reference.has_value(), "a bf16 run without a bf16 reference rate");
  return *r.bf16_reference;
}

json rate_json(const GemmRate& g) {
  return {{"impl", g.impl}, {"op", g.op}, {"shape", g.shape()}, {"gflops", g.gflops}};
}

json reference_json(const RateReference& ref) {
  json j = rate_json(ref.rate());
  j["precision"] = ref.precision;
  j["candidates"] = json::array();
  for (const GemmRate& g : ref.candidates) j["candidates"].push_back(rate_json(g));
  if (!ref.note.empty()) j["note"] = ref.note;
  return j;
}

// "attnres bf16 / torch fp32 — different precisions", or "attnres bf16 / torch bf16".
std::string precision_pair(const std::string& ours, const std::string& theirs) {
  return "attnres " + ours + " / torch " + theirs + (ours == theirs ? "" : " — different precisions");
}

json run_json(const Results& r, const Cell& c) {
  const ModelConfig model = arm_config(r.base, c.arm, c.seq);
  const FlopCount f = training_flops_per_token(model, c.seq);
  const double tps = c.tokens_per_sec();
  const RateReference& ref = reference_for(r, c.precision);
  return {{"impl", c.impl},
          {"precision", c.precision},
          {"arm", c.arm},
          {"seq", c.seq},
          {"batch", c.batch},
          {"steps_timed", c.step_ms.size()},
          {"step_ms_median", c.median_ms()},
          {"step_ms_min", *std::min_element(c.step_ms.begin(), c.step_ms.end())},
          {"step_ms", c.step_ms},
          {"cpu_ms_median", median(c.cpu_ms)},
          {"cores_used", c.cores_used()},
          {"forward_backward_ms_median", c.fb_ms.empty() ? json(nullptr) : json(median(c.fb_ms))},
          {"clip_adamw_ms_median", c.opt_ms.empty() ? json(nullptr) : json(median(c.opt_ms))},
          {"tokens_per_sec", tps},
          {"peak_rss_bytes", c.peak_rss},
          {"start_rss_bytes", c.start_rss},
          {"params", c.params},
          {"loss_first", c.loss_first},
          {"openblas_core", c.core},
          {"flops_per_token", flops_json(f)},
          {"model_gflops", f.total() * tps / 1e9},
          {"mfu", f.total() * tps / 1e9 / ref.rate().gflops},
          {"mfu_reference", ref.precision},  // the key of the rate in "mfu_reference"
          {"mfu_vs_sgemm_1024", f.total() * tps / 1e9 / r.gemm.square},
          {"model", json(model)}};  // the arm's model config (scripts/torch_peer.py builds the same model)
}

// attnres against torch, arm by arm.
json vs_torch_json(const Results& r) {
  json out = json::array();
  for (int seq : r.seqs)
    for (const auto& arm : r.arms) {
      const Cell* ours = r.measurement.find("attnres", arm, seq);
      const Cell* theirs = r.measurement.find("torch", arm, seq);
      if (ours == nullptr || theirs == nullptr) continue;
      const double speedup = ours->tokens_per_sec() / theirs->tokens_per_sec();
      const bool same = ours->precision == theirs->precision;  // the target is for like against like
      out.push_back({{"arm", arm},
                     {"seq", seq},
                     {"attnres_precision", ours->precision},
                     {"torch_precision", theirs->precision},
                     {"same_precision", same},
                     {"speedup", speedup},
                     {"meets_target", same && speedup >= kTargetSpeedup},
                     {"peak_rss_ratio", double(ours->peak_rss) / double(theirs->peak_rss)}});
    }
  return out;
}

// rd against block, within each implementation.
json rd_block_json(const Results& r) {
  json out = json::array();
  for (int seq : r.seqs)
    for (const std::string impl : {"attnres", "torch"}) {
      const Cell* rd = r.measurement.find(impl, "rd", seq);
      const Cell* block = r.measurement.find(impl, "block", seq);
      if (rd == nullptr || block == nullptr) continue;
      const double step = rd->median_ms() / block->median_ms();
      const double memory = double(rd->peak_rss) / double(block->peak_rss);
      out.push_back({{"impl", impl},
                     {"seq", seq},
                     {"step_time_ratio", step},
                     {"cpu_time_ratio", median(rd->cpu_ms) / median(block->cpu_ms)},
                     {"peak_rss_ratio", memory},
                     {"peak_rss_delta_bytes", rd->peak_rss - block->peak_rss},
                     {"meets_target", step <= kTargetRdBlock && memory <= kTargetRdBlock}});
    }
  return out;
}

// Each implementation and arm at every longer T against its shortest T of the run: tokens/s ratio.
// The target applies to T = 4096 against T = 256 with the same tokens per step.
json context_scaling_json(const Results& r) {
  json out = json::array();
  if (r.seqs.size() < 2) return out;
  const int base_seq = *std::min_element(r.seqs.begin(), r.seqs.end());
  for (const std::string impl : {"attnres", "torch"})
    for (const auto& arm : r.arms) {
      const Cell* base = r.measurement.find(impl, arm, base_seq);
      if (base == nullptr) continue;
      for (int seq : r.seqs) {
        const Cell* c = r.measurement.find(impl, arm, seq);
        if (c == nullptr || seq == base_seq) continue;
        const double ratio = c->tokens_per_sec() / base->tokens_per_sec();
        const bool same_tokens = std::int64_t(c->batch) * c->seq == std::int64_t(base->batch) * base->seq;
        const bool target_pair = base_seq == kContextShort && seq == kContextLong && same_tokens;
        out.push_back({{"impl", impl},
                       {"arm", arm},
                       {"seq", seq},
                       {"base_seq", base_seq},
                       {"tokens_per_sec_ratio", ratio},
                       {"same_tokens_per_step", same_tokens},
                       {"meets_target", target_pair ? json(ratio >= kTargetContextScaling) : json(nullptr)}});
      }
    }
  return out;
}

void print_header(const Results& r, const json& out) {
  const ModelConfig& mc = r.base.model;
  std::printf("attnres bench: %s (d=%d, %d layers, %d heads, mlp %d, %d blocks, vocab %d, %s embeddings)\n",
              out["preset"].get<std::string>().c_str(), mc.d_model, mc.n_layers, mc.n_heads, mc.mlp_hidden,
              mc.n_blocks, mc.vocab_size, mc.tie_embeddings ? "tied" : "untied");
  std::printf("machine: %s, %d cores; %d threads; load average %s at start, %s at end\n", cpu_model().c_str(),
              online_cores(), r.threads, r.load_start.c_str(), r.load_end.c_str());
  if (r.device != "cpu") std::printf("device: %s (attnres)\n", r.device.c_str());
  std::printf("OpenBLAS core: %s (OPENBLAS_CORETYPE=%s)", openblas_core().c_str(),
              getenv_or("OPENBLAS_CORETYPE", "unset").c_str());
  if (r.torch_on)
    std::printf("; torch %s, its OpenBLAS core: %s", r.torch_info.value("torch_version", "?").c_str(),
                r.torch_info.value("openblas_core", "?").c_str());
  const std::string precision = kernels::to_string(r.base.precision);
  std::printf("\nmatmul precision: attnres %s%s", precision.c_str(),
              r.base.precision == kernels::MatmulPrecision::bf16 ? (" (" + bf16_backend() + ")").c_str()
                                                                 : (" (Linear GEMMs: " + fp32_gemm_backend() + ")").c_str());
  if (r.base.precision != kernels::MatmulPrecision::bf16 &&
      std::any_of(r.arms.begin(), r.arms.end(), [](const std::string& a) { return is_bf16_arm(a); }))
    std::printf("; its @bf16 arms bf16 (%s)", bf16_backend().c_str());
  if (r.torch_on)
    std::printf(", torch %s (%s; --torch-precision %s)%s", r.torch_precision.c_str(),
                r.torch_precision == "bf16" ? "torch.autocast(\"cpu\", dtype=torch.bfloat16)" : "no autocast",
                r.torch_precision_flag.c_str(), r.torch_precision == precision ? "" : " — different precisions");
  std::printf("\nOMP_WAIT_POLICY: attnres %s", getenv_or("OMP_WAIT_POLICY", "unset").c_str());
  if (r.torch_on) std::printf(", torch %s", r.torch_info.value("omp_wait_policy", "?").c_str());
  std::printf("\nsgemm reference: 1024^3 %.1f GFLOP/s, %s %.1f GFLOP/s (best of a few, before and after the runs)\n",
              r.gemm.square, r.gemm.model_shape.c_str(), r.gemm.model);
  if (r.bf16_reference) {
    const RateReference& ref = *r.bf16_reference;
    std::printf("bf16 reference: %.1f GFLOP/s, %s %s on %s, the best of (GFLOP/s, before and after the runs):\n",
                ref.rate().gflops, ref.rate().impl.c_str(), ref.rate().op.c_str(), ref.rate().shape().c_str());
    for (const GemmRate& g : ref.candidates)
      std::printf("  %-7s %-40s %14s %7.1f\n", g.impl.c_str(), g.op.c_str(), g.shape().c_str(), g.gflops);
    if (!ref.note.empty()) std::printf("  (%s)\n", ref.note.c_str());
  }
  std::printf("MFU reference: fp32 steps: sgemm 1024^3 (%.1f GFLOP/s)", r.fp32_reference.rate().gflops);
  if (r.bf16_reference)
    std::printf("; bf16 steps: %s %s on %s (%.1f GFLOP/s)", r.bf16_reference->rate().impl.c_str(),
                r.bf16_reference->rate().op.c_str(), r.bf16_reference->rate().shape().c_str(),
                r.bf16_reference->rate().gflops);
  std::printf("\n");
}

void print_shapes(const std::vector<ShapeRate>& shapes) {
  std::printf("\nLinear GEMMs of the model (m x n x k, best of 3; fp32: %s, bf16: %s):\n", fp32_gemm_backend().c_str(),
              bf16_backend().c_str());
  std::printf("%-12s %-8s %18s %6s %12s %12s %8s\n", "layer", "pass", "m x n x k", "op", "fp32 GFLOP/s",
              "bf16 GFLOP/s", "ratio");
  for (const ShapeRate& s : shapes) {
    const std::string dims = shape_text(s.m, s.n, s.k);
    std::printf("%-12s %-8s %18s %6s %12.1f %12.1f %7.2fx\n", s.layer.c_str(), s.pass.c_str(), dims.c_str(),
                s.ta ? "AT B" : s.tb ? "A BT" : "A B", s.fp32, s.bf16, s.bf16 / s.fp32);
  }
}

void print_runs(const Results& r, const json& runs) {
  std::printf("timing: median over %d steps x %d round(s) after %d warm-up steps, each run in its own process\n\n",
              r.steps, r.rounds, r.warmup);
  std::printf("%-8s %-5s %-10s %6s %4s %9s %9s %6s %10s %9s %8s %8s %7s\n", "impl", "prec", "arm", "seq", "B",
              "step ms", "min ms", "cores", "tokens/s", "peak MB", "start MB", "GFLOP/s", "MFU");
  for (const auto& run : runs)
    std::printf("%-8s %-5s %-10s %6d %4d %9.0f %9.0f %6.2f %10.0f %9.0f %8.0f %8.1f %6.1f%%\n",
                run["impl"].get<std::string>().c_str(), run["precision"].get<std::string>().c_str(),
                run["arm"].get<std::string>().c_str(), run["seq"].get<int>(),
                run["batch"].get<int>(), run["step_ms_median"].get<double>(), run["step_ms_min"].get<double>(),
                run["cores_used"].get<double>(), run["tokens_per_sec"].get<double>(),
                double(run["peak_rss_bytes"].get<std::int64_t>()) / 1e6,
                double(run["start_rss_bytes"].get<std::int64_t>()) / 1e6, run["model_gflops"].get<double>(),
                100 * run["mfu"].get<double>());
  std::printf("(prec: the run's matmul precision; step ms: median wall-clock time per step, min ms: the fastest\n"
              " step; cores: median CPU time / wall time per step, below the thread count when other processes\n"
              " took the cores; tokens/s, GFLOP/s and MFU use the median; peak MB: VmHWM of the worker; start MB:\n"
              " its resident memory before building the model; MFU: model FLOPs/s over the MFU reference of the\n"
              " run's precision, above)\n");
}

void print_ratios(const json& out) {
  if (!out["attnres_vs_torch"].empty()) {
    std::printf("\nattnres vs torch (tokens/s ratio; target >= 3x for block and rd, in the same precision):\n");
    for (const auto& r : out["attnres_vs_torch"])
      std::printf("  %-10s T=%-5d %5.2fx  %s   peak memory %.2fx of torch's\n", r["arm"].get<std::string>().c_str(),
                  r["seq"].get<int>(), r["speedup"].get<double>(),
                  precision_pair(r["attnres_precision"].get<std::string>(), r["torch_precision"].get<std::string>())
                      .c_str(),
                  r["peak_rss_ratio"].get<double>());
  }
  if (!out["rd_vs_block"].empty()) {
    std::printf("\nrd / block (targets: step time <= 1.02, peak memory <= 1.02):\n");
    for (const auto& r : out["rd_vs_block"])
      std::printf("  %-8s T=%-5d step time %.3f (cpu time %.3f), peak memory %.3f (%+.1f MB)\n",
                  r["impl"].get<std::string>().c_str(), r["seq"].get<int>(), r["step_time_ratio"].get<double>(),
                  r["cpu_time_ratio"].get<double>(), r["peak_rss_ratio"].get<double>(),
                  double(r["peak_rss_delta_bytes"].get<std::int64_t>()) / 1e6);
  }
  if (!out["context_scaling"].empty()) {
    std::printf("\ncontext scaling (tokens/s over that at the shortest T; target >= %.1f at T=%d against T=%d, the\n"
                "same tokens per step):\n",
                kTargetContextScaling, kContextLong, kContextShort);
    for (const auto& c : out["context_scaling"])
      std::printf("  %-8s %-10s T=%-5d / T=%-5d %.2f%s\n", c["impl"].get<std::string>().c_str(),
                  c["arm"].get<std::string>().c_str(), c["seq"].get<int>(), c["base_seq"].get<int>(),
                  c["tokens_per_sec_ratio"].get<double>(),
                  c["same_tokens_per_step"].get<bool>() ? "" : "  (different tokens per step)");
  }
  if (!out["paired"].empty()) {
    std::printf("\nattnres paired in one process, alternate steps (median of per-step ratios, its distribution-free\n"
                "95%% confidence interval, range; more --steps narrow the interval):\n");
    for (const auto& r : out["paired"])
      std::printf("  %s / %s T=%-5d %sstep time %.3f (95%% CI %.3f-%.3f; range %.3f-%.3f over %zu step pairs)\n",
                  r["b"].get<std::string>().c_str(), r["a"].get<std::string>().c_str(), r["seq"].get<int>(),
                  out["rounds"].get<int>() > 1 ? ("round " + std::to_string(r["round"].get<int>()) + ": ").c_str() : "",
                  r["step_time_ratio"].get<double>(), r["ratio_ci95_low"].get<double>(),
                  r["ratio_ci95_high"].get<double>(), r["ratio_min"].get<double>(), r["ratio_max"].get<double>(),
                  r["ratios"].size());
  }
  if (!out["paired_across_processes"].empty()) {
    std::printf("\nattnres paired, across processes (one per --rounds; each process's interval misses what differs\n"
                "between processes, so read this spread):\n");
    for (const auto& r : out["paired_across_processes"]) {
      std::string each;
      for (const auto& x : r["ratios"])
        each += (each.empty() ? "" : ", ") + analysis::format_printf("%.3f", x.get<double>());
      std::printf("  %s / %s T=%-5d step time %.3f, median of %zu processes (range %.3f-%.3f: %s)\n",
                  r["b"].get<std::string>().c_str(), r["a"].get<std::string>().c_str(), r["seq"].get<int>(),
                  r["step_time_ratio"].get<double>(), r["ratios"].size(), r["ratio_min"].get<double>(),
                  r["ratio_max"].get<double>(), each.c_str());
    }
  }
}

}  // namespace

json results_json(const Results& r) {
  json out;
  out["version"] = kBenchResultVersion;
  out["machine"] = {{"cpu", cpu_model()},
                    {"cores", online_cores()},
                    {"load_average_start", r.load_start},
                    {"load_average_end", r.load_end}};
  if (r.device != "cpu") out["device"] = r.device;
  out["threads"] = r.threads;
  out["openblas_core"] = openblas_core();
  out["openblas_coretype_env"] = getenv_or("OPENBLAS_CORETYPE", "");
  const std::string precision = kernels::to_string(r.base.precision);
  out["precision"] = {{"attnres", precision},
                      {"torch", r.torch_on ? json(r.torch_precision) : json(nullptr)},
                      {"torch_flag", r.torch_precision_flag},
                      {"same", r.torch_on ? json(r.torch_precision == precision) : json(nullptr)},
                      {"bf16_backend", bf16_backend()},
                      {"fp32_gemm_backend", fp32_gemm_backend()}};
  out["omp_wait_policy_env"] = getenv_or("OMP_WAIT_POLICY", "");
  out["torch"] = r.torch_on ? r.torch_info : json(nullptr);
  out["gemm"] = {
      {"sgemm_1024_gflops", r.gemm.square}, {"model_shape", r.gemm.model_shape}, {"model_shape_gflops", r.gemm.model}};
  out["mfu_reference"] = {{"fp32", reference_json(r.fp32_reference)}};
  if (r.bf16_reference) out["mfu_reference"]["bf16"] = reference_json(*r.bf16_reference);
  if (!r.shapes.empty()) {
    json js = json::array();
    for (const ShapeRate& s : r.shapes)
      js.push_back({{"layer", s.layer}, {"pass", s.pass}, {"m", s.m}, {"n", s.n}, {"k", s.k}, {"trans_a", s.ta},
                    {"trans_b", s.tb}, {"fp32_gflops", s.fp32}, {"bf16_gflops", s.bf16}});
    out["gemm"]["linear_shapes"] = js;
  }
  out["config"] = json(r.base.model);
  out["preset"] = r.name;
  out["steps"] = r.steps;
  out["warmup"] = r.warmup;
  out["rounds"] = r.rounds;
  json runs = json::array();
  for (const Cell& c : r.measurement.cells) runs.push_back(run_json(r, c));
  out["runs"] = runs;
  out["targets"] = {{"speedup_vs_torch_min", kTargetSpeedup},
                    {"rd_over_block_max", kTargetRdBlock},
                    {"context_scaling_min", kTargetContextScaling}};
  out["attnres_vs_torch"] = vs_torch_json(r);
  out["paired"] = r.paired;
  out["paired_across_processes"] = paired_across_processes(r.paired);
  out["rd_vs_block"] = rd_block_json(r);
  out["context_scaling"] = context_scaling_json(r);
  return out;
}

void print_table(const Results& r, const json& out) {
  print_header(r, out);
  if (!r.shapes.empty()) print_shapes(r.shapes);
  if (r.measurement.cells.empty()) return;
  print_runs(r, out["runs"]);
  print_ratios(out);
  const Cell& any = r.measurement.cells.front();
  const FlopCount f = training_flops_per_token(arm_config(r.base, any.arm, any.seq), any.seq);
  std::printf("\nmodel FLOPs per token (%s, T=%d): %.1f M = dense %.1f + LM head %.1f + attention %.1f + depth reads "
              "%.2f (docs/performance.md)\n",
              any.arm.c_str(), any.seq, f.total() / 1e6, f.dense / 1e6, f.lm_head / 1e6, f.attention / 1e6,
              f.depth_reads / 1e6);
}

}  // namespace attnres::bench
