// `attnres bench` compares like with like: torch runs in attnres' matmul precision unless
// --torch-precision says otherwise, the report names both precisions and flags a mismatch, and a
// bf16 step's MFU is against the best bf16 GEMM rate measured in the run (docs/performance.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/gemm_rates.hpp"
#include "common/cli_util.hpp"

namespace attnres {
namespace {

using nlohmann::json;
using testing::CliResult;
using testing::run_cli;

// One step of `tiny` per side, one thread, the bf16 reference on 256^3 instead of 2048^3: quick.
const std::string kTiny = "bench --preset tiny --vocab 512 --arms block --seq 16 --batch 1 --steps 1 --warmup 0 "
                          "--threads 1 --no-paired --bf16-reference-cube 256 --torch-script " ATTNRES_SOURCE_DIR
                          "/bench/torch_model.py";

bool torch_importable() {
  return testing::run_shell(std::string(ATTNRES_TEST_PYTHON) + " -c 'import torch'").exit_code == 0;
}

#define SKIP_WITHOUT_TORCH() \
  if (!torch_importable()) GTEST_SKIP() << ATTNRES_TEST_PYTHON " cannot import torch: no PyTorch side to compare"

struct BenchRun {
  CliResult cli;  // the table (stdout) and progress (stderr)
  json out;       // the --json-file object
};

BenchRun bench(const std::string& name, const std::string& flags, const std::string& base = kTiny) {
  testing::TempDir dir(name);
  BenchRun r;
  r.cli = run_cli(base + " " + flags + " --json-file " + dir.str("bench.json"));
  EXPECT_EQ(r.cli.exit_code, 0) << r.cli.output;
  if (r.cli.exit_code == 0) r.out = json::parse(testing::read_file(dir.path() / "bench.json"));
  return r;
}

const json& run_of(const json& out, const std::string& impl) {
  for (const json& run : out.at("runs"))
    if (run.at("impl") == impl) return run;
  throw std::runtime_error("no " + impl + " run in " + out.dump());
}

// What each side ran, as the JSON's precision object, every run and every attnres/torch ratio say.
void expect_precisions(const json& out, const std::string& attnres, const std::string& torch,
                       const std::string& flag) {
  const bool same = attnres == torch;
  EXPECT_EQ(out.at("precision").at("attnres"), attnres);
  EXPECT_EQ(out.at("precision").at("torch"), torch);
  EXPECT_EQ(out.at("precision").at("torch_flag"), flag);
  EXPECT_EQ(out.at("precision").at("same"), same);
  for (const json& run : out.at("runs")) EXPECT_EQ(run.at("precision"), run.at("impl") == "torch" ? torch : attnres);
  ASSERT_FALSE(out.at("attnres_vs_torch").empty());
  for (const json& v : out.at("attnres_vs_torch")) {
    EXPECT_EQ(v.at("attnres_precision"), attnres);
    EXPECT_EQ(v.at("torch_precision"), torch);
    EXPECT_EQ(v.at("same_precision"), same);
    if (!same) {
      EXPECT_EQ(v.at("meets_target"), false) << "the speed target is for like against like";
    }
  }
}

// Every run's MFU is its model GFLOP/s over the reference of its own precision.
void expect_mfu_against_own_reference(const json& out) {
  for (const json& run : out.at("runs")) {
    const std::string precision = run.at("precision");
    ASSERT_EQ(run.at("mfu_reference"), precision);
    const double reference = out.at("mfu_reference").at(precision).at("gflops");
    EXPECT_NEAR(run.at("mfu").get<double>(), run.at("model_gflops").get<double>() / reference, 1e-12) << run.dump();
  }
}

// The chosen bf16 rate is the largest candidate and names who ran it.
void expect_bf16_reference_is_the_best(const json& ref) {
  ASSERT_FALSE(ref.at("candidates").empty());
  double best = 0;
  for (const json& c : ref.at("candidates")) best = std::max(best, c.at("gflops").get<double>());
  EXPECT_EQ(ref.at("gflops").get<double>(), best) << ref.dump();
  EXPECT_EQ(ref.at("precision"), "bf16");
  bool named = false;
  for (const json& c : ref.at("candidates"))
    named |= c.at("impl") == ref.at("impl") && c.at("op") == ref.at("op") && c.at("shape") == ref.at("shape") &&
             c.at("gflops") == ref.at("gflops");
  EXPECT_TRUE(named) << "the reference is not one of its candidates: " << ref.dump();
}

TEST(BenchPrecision, TheBestRateIsTheReference) {
  const std::vector<bench::GemmRate> rates = {{"attnres", "kernels::gemm_bf16", 2048, 2048, 2048, 80.0},
                                              {"attnres", "kernels::gemm_bf16", 16, 1024, 256, 95.5},
                                              {"torch", "torch.matmul bf16", 2048, 2048, 2048, 120.0},
                                              {"torch", "torch.matmul bf16", 16, 1024, 256, 60.0}};
  for (std::size_t best = 0; best < rates.size(); ++best) {
    std::vector<bench::GemmRate> candidates = rates;
    candidates[best].gflops = 500;
    const bench::RateReference ref = bench::best_rate_reference("bf16", candidates, "");
    EXPECT_EQ(ref.chosen, best);
    EXPECT_EQ(ref.rate().gflops, 500);
  }
  // A tie keeps the first; a later measurement raises a rate and never lowers it.
  std::vector<bench::GemmRate> tie = {rates[0], rates[2]};
  tie[1].gflops = tie[0].gflops;
  EXPECT_EQ(bench::best_rate_reference("bf16", tie, "").chosen, 0u);
  std::vector<bench::GemmRate> before = rates, again = rates;
  again[0].gflops = 10;   // slower after the runs: the first measurement stays
  again[3].gflops = 200;  // faster: taken
  again.push_back({"torch", "torch.matmul bf16", 8, 8, 8, 1.0});
  bench::keep_better(before, again);
  ASSERT_EQ(before.size(), 5u);
  EXPECT_EQ(before[0].gflops, 80.0);
  EXPECT_EQ(before[3].gflops, 200.0);
  EXPECT_EQ(bench::best_rate_reference("bf16", before, "").chosen, 3u);
}

TEST(BenchPrecision, TheBf16ReferenceShapesAre2048CubedAndTheTrunk) {
  ModelConfig c;
  c.d_model = 256;
  c.mlp_hidden = 1280;
  const auto shapes = bench::bf16_reference_shapes(c, 4096);
  ASSERT_EQ(shapes.size(), 2u);
  EXPECT_EQ(shapes[0], (std::array<std::int64_t, 3>{2048, 2048, 2048}));
  EXPECT_EQ(shapes[1], (std::array<std::int64_t, 3>{4096, 1280, 256}));
}

// An "@bf16" arm runs its steps in bf16 beside the fp32 arms of the same bench (it used to run in
// the base precision, its row labelled fp32: a silent wrong answer), and its MFU is against a bf16
// rate measured in the same run.
TEST(BenchPrecision, ABf16ArmRunsInBf16BesideFp32Arms) {
  const BenchRun r = bench("bench_bf16_arm", "",
                           "bench --preset tiny --vocab 512 --arms block,block@bf16 --seq 16 --batch 1 --steps 1 "
                           "--warmup 0 --threads 1 --bf16-reference-cube 256 --precision fp32 --torch off");
  ASSERT_EQ(r.cli.exit_code, 0);
  std::map<std::string, std::string> precision_of;
  for (const json& run : r.out.at("runs")) precision_of[run.at("arm").get<std::string>()] = run.at("precision");
  EXPECT_EQ(precision_of, (std::map<std::string, std::string>{{"block", "fp32"}, {"block@bf16", "bf16"}}));
  ASSERT_TRUE(r.out.at("mfu_reference").contains("bf16")) << r.out.at("mfu_reference").dump();
  expect_mfu_against_own_reference(r.out);
  EXPECT_NE(r.cli.output.find("block@bf16 / block"), std::string::npos) << r.cli.output;
}

TEST(BenchPrecision, AnUnknownTorchPrecisionIsAnError) {
  const CliResult r = run_cli(kTiny + " --torch-precision fp16");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--torch-precision must be auto, fp32 or bf16 (got 'fp16')"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("sgemm"), std::string::npos) << "measured before failing:\n" << r.output;
}

TEST(BenchPrecision, Fp32TorchFollowsAndTheReferenceIsSgemm) {
  SKIP_WITHOUT_TORCH();
  const BenchRun r = bench("bench_fp32", "--precision fp32 --torch on");
  ASSERT_EQ(r.cli.exit_code, 0);
  EXPECT_EQ(r.out["version"], 1);  // the schema's (bench::kBenchResultVersion)
  expect_precisions(r.out, "fp32", "fp32", "auto");
  EXPECT_FALSE(r.out["mfu_reference"].contains("bf16")) << "no step ran bf16";
  EXPECT_EQ(r.out["mfu_reference"]["fp32"]["op"], "cblas_sgemm");
  EXPECT_EQ(r.out["mfu_reference"]["fp32"]["shape"], "1024x1024x1024");
  EXPECT_EQ(r.out["mfu_reference"]["fp32"]["gflops"], r.out["gemm"]["sgemm_1024_gflops"]);
  expect_mfu_against_own_reference(r.out);
  EXPECT_NE(r.cli.output.find("attnres fp32 / torch fp32"), std::string::npos) << r.cli.output;
  EXPECT_EQ(r.cli.output.find("different precisions"), std::string::npos) << r.cli.output;
}

TEST(BenchPrecision, Bf16TorchFollowsWithAutocastAndABf16Reference) {
  SKIP_WITHOUT_TORCH();
  const BenchRun r = bench("bench_bf16", "--precision bf16 --torch on");
  ASSERT_EQ(r.cli.exit_code, 0);
  expect_precisions(r.out, "bf16", "bf16", "auto");
  const json& ref = r.out["mfu_reference"]["bf16"];
  expect_bf16_reference_is_the_best(ref);
  // Both sides on the cube (2048^3 outside tests) and the gate/up shape [B*T = 16 tokens, d] x [d, mlp_hidden].
  std::vector<std::string> measured;
  for (const json& c : ref["candidates"])
    measured.push_back(c["impl"].get<std::string>() + " " + c["shape"].get<std::string>());
  std::sort(measured.begin(), measured.end());
  const std::string trunk = "16x" + std::to_string(r.out["config"]["mlp_hidden"].get<int>()) + "x" +
                            std::to_string(r.out["config"]["d_model"].get<int>());
  const std::vector<std::string> expected = {"attnres " + trunk, "attnres 256x256x256", "torch " + trunk,
                                             "torch 256x256x256"};
  EXPECT_EQ(measured, expected) << ref.dump();
  EXPECT_FALSE(ref.contains("note")) << ref.dump();
  expect_mfu_against_own_reference(r.out);
  EXPECT_NE(r.cli.output.find("bf16 reference: "), std::string::npos) << r.cli.output;
  EXPECT_NE(r.cli.output.find("attnres bf16 / torch bf16"), std::string::npos) << r.cli.output;
  EXPECT_EQ(r.cli.output.find("different precisions"), std::string::npos) << r.cli.output;
}

TEST(BenchPrecision, TorchPrecisionOverridesAndTheMismatchIsFlagged) {
  SKIP_WITHOUT_TORCH();
  const BenchRun r = bench("bench_mismatch", "--precision bf16 --torch on --torch-precision fp32");
  ASSERT_EQ(r.cli.exit_code, 0);
  expect_precisions(r.out, "bf16", "fp32", "fp32");
  // Each side's MFU against its own precision's reference: attnres bf16, torch fp32 sgemm.
  expect_mfu_against_own_reference(r.out);
  EXPECT_EQ(run_of(r.out, "attnres")["mfu_reference"], "bf16");
  EXPECT_EQ(run_of(r.out, "torch")["mfu_reference"], "fp32");
  EXPECT_NE(r.cli.output.find("attnres bf16 / torch fp32 — different precisions"), std::string::npos) << r.cli.output;
}

TEST(BenchPrecision, WithoutTorchTheBf16ReferenceIsAttnresOwnAndSaysSo) {
  const BenchRun r = bench("bench_notorch", "--precision bf16 --torch off");
  ASSERT_EQ(r.cli.exit_code, 0);
  EXPECT_EQ(r.out["precision"]["torch"], nullptr);
  const json& ref = r.out["mfu_reference"]["bf16"];
  expect_bf16_reference_is_the_best(ref);
  ASSERT_EQ(ref["candidates"].size(), 2u);
  for (const json& c : ref["candidates"]) EXPECT_EQ(c["impl"], "attnres");
  EXPECT_EQ(ref["note"], "torch not run (--torch off): attnres' bf16 GEMM only");
  EXPECT_NE(r.cli.output.find("(torch not run (--torch off): attnres' bf16 GEMM only)"), std::string::npos)
      << r.cli.output;
  expect_mfu_against_own_reference(r.out);
}

// With two lengths the report gives each implementation's tokens/s at the longer over the shorter
// T, says when the tokens per step differ, and judges the target only on its own pair (4096 / 256).
TEST(BenchContextScaling, RatiosOfTheRunsTokensPerSecond) {
  // kTiny without its one --seq and --batch.
  const std::string base = "bench --preset tiny --vocab 512 --arms block --steps 1 --warmup 0 --threads 1 --no-paired "
                           "--bf16-reference-cube 256 --torch off";
  const BenchRun r = bench("bench_context", "--seq 16,32 --tokens-per-step 32", base);
  ASSERT_EQ(r.cli.exit_code, 0);
  EXPECT_EQ(r.out["targets"]["context_scaling_min"], 0.7);
  const json& scaling = r.out["context_scaling"];
  ASSERT_EQ(scaling.size(), 1u) << scaling.dump();
  const json& c = scaling[0];
  EXPECT_EQ(c["impl"], "attnres");
  EXPECT_EQ(c["arm"], "block");
  EXPECT_EQ(c["seq"], 32);
  EXPECT_EQ(c["base_seq"], 16);
  EXPECT_EQ(c["same_tokens_per_step"], true);
  EXPECT_EQ(c["meets_target"], nullptr) << "the target is for T = 4096 against T = 256";
  double tps16 = 0, tps32 = 0;
  for (const json& run : r.out["runs"]) (run["seq"] == 16 ? tps16 : tps32) = run["tokens_per_sec"].get<double>();
  EXPECT_NEAR(c["tokens_per_sec_ratio"].get<double>(), tps32 / tps16, 1e-12);
  EXPECT_NE(r.cli.output.find("context scaling"), std::string::npos) << r.cli.output;
  EXPECT_NE(r.cli.output.find("T=32    / T=16"), std::string::npos) << r.cli.output;

  // A fixed batch: different tokens per step, said in the JSON and the table.
  const BenchRun b = bench("bench_context_batch", "--seq 16,32 --batch 1", base);
  ASSERT_EQ(b.cli.exit_code, 0);
  ASSERT_EQ(b.out["context_scaling"].size(), 1u);
  EXPECT_EQ(b.out["context_scaling"][0]["same_tokens_per_step"], false);
  EXPECT_NE(b.cli.output.find("(different tokens per step)"), std::string::npos) << b.cli.output;
}

// With --rounds, each paired run is a process per round (a process's interval misses what differs
// between processes), and the spread over the processes is reported beside.
TEST(BenchPaired, EachRoundIsAProcessAndTheirSpreadIsReported) {
  const std::string base = "bench --preset tiny --vocab 512 --arms block,rd --seq 16 --batch 1 --steps 2 --warmup 0 "
                           "--threads 1 --torch off";
  const BenchRun r = bench("bench_paired_rounds", "--rounds 3", base);
  ASSERT_EQ(r.cli.exit_code, 0);
  const json& paired = r.out.at("paired");
  ASSERT_EQ(paired.size(), 3u) << paired.dump();
  std::vector<double> ratios;
  for (int round = 1; round <= 3; ++round) {
    const json& p = paired[static_cast<std::size_t>(round - 1)];
    EXPECT_EQ(p.at("round"), round);
    EXPECT_EQ(p.at("a"), "block");
    EXPECT_EQ(p.at("b"), "rd");
    EXPECT_EQ(p.at("ratios").size(), 2u);
    ratios.push_back(p.at("step_time_ratio").get<double>());
  }
  const json& across = r.out.at("paired_across_processes");
  ASSERT_EQ(across.size(), 1u) << across.dump();
  EXPECT_EQ(across[0].at("processes"), 3);
  EXPECT_EQ(across[0].at("ratios").get<std::vector<double>>(), ratios);
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(across[0].at("step_time_ratio").get<double>(), sorted[1]);
  EXPECT_EQ(across[0].at("ratio_min").get<double>(), sorted[0]);
  EXPECT_EQ(across[0].at("ratio_max").get<double>(), sorted[2]);
  EXPECT_NE(r.cli.output.find("round 3: step time"), std::string::npos) << r.cli.output;
  EXPECT_NE(r.cli.output.find("median of 3 processes"), std::string::npos) << r.cli.output;

  // One round: one process, no spread to report.
  const BenchRun one = bench("bench_paired_one_round", "", base);
  ASSERT_EQ(one.cli.exit_code, 0);
  EXPECT_EQ(one.out.at("paired").size(), 1u);
  EXPECT_TRUE(one.out.at("paired_across_processes").empty());
  EXPECT_EQ(one.cli.output.find("across processes"), std::string::npos) << one.cli.output;
}

}  // namespace
}  // namespace attnres
