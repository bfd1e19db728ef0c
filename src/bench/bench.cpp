#include "bench/bench.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/gemm_rates.hpp"
#include "util/machine.hpp"
#include "bench/measurement.hpp"
#include "bench/results.hpp"
#include "model/arms.hpp"
#include "train/backend.hpp"
#include "util/error.hpp"
#include "util/paths.hpp"
#include "util/process.hpp"
#include "util/threads.hpp"

namespace attnres::bench {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kTorchScript = "bench/torch_model.py";
constexpr int kBf16ReferenceReps = 3;  // timed calls per shape of the bf16 reference, each side

// What the run measures, validated before any work.
struct Plan {
  TrainConfig base;  // --vocab and --precision applied
  std::vector<int> seqs;
  std::int64_t tokens_per_step = 0;
  int threads = 0;
  std::string torch_precision;  // fp32 | bf16: --torch-precision, auto resolved to attnres' precision

  int batch_for(const Options& o, int seq) const {
    return o.batch > 0 ? o.batch : static_cast<int>(std::max<std::int64_t>(1, tokens_per_step / seq));
  }
};

Plan make_plan(const Options& o) {
  Plan p;
  p.base = o.base;
  if (p.base.model.vocab_size == 0) p.base.model.vocab_size = o.vocab;
  if (!o.precision.empty()) p.base.precision = kernels::parse_matmul_precision(o.precision);
  require(o.steps >= 1, "--steps must be at least 1");
  require(o.warmup >= 0, "--warmup must be non-negative");
  require(o.rounds >= 1, "--rounds must be at least 1");
  require(o.threads >= 0, "--threads must be non-negative (0: all cores)");
  require(o.bf16_reference_cube >= 1, "--bf16-reference-cube must be positive");
  require(o.torch == "auto" || o.torch == "on" || o.torch == "off", "--torch must be auto, on or off");
  require(o.torch_precision == "auto" || o.torch_precision == "fp32" || o.torch_precision == "bf16",
          "--torch-precision must be auto, fp32 or bf16 (got '", o.torch_precision, "')");
  p.torch_precision = o.torch_precision == "auto" ? kernels::to_string(p.base.precision) : o.torch_precision;
  require(!o.arms.empty() || o.gemm_only, "--arms must name at least one arm");
  for (const auto& arm : o.arms) apply_arm(p.base.model, arm);  // validates the names
  p.seqs = o.seqs;
  if (p.seqs.empty()) p.seqs.push_back(p.base.seq_len);
  p.tokens_per_step = o.tokens_per_step > 0 ? o.tokens_per_step : p.base.tokens_per_step();
  for (int seq : p.seqs)
    for (const auto& arm : o.arms) arm_config(p.base, arm, seq);  // validate before any work
  if (!o.gemm_only) check_train_device(o.device);
  return p;
}

// The last line of a worker's stdout that parses as a JSON object.
json parse_worker_output(const ChildResult& c, const std::string& what) {
  require(c.status == 0, "bench: the ", what, " worker failed (exit status ", c.status, "; its stderr is above)");
  std::stringstream in(c.output);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty() && line.front() == '{') last = line;
  require(!last.empty(), "bench: the ", what, " worker printed no result");
  try {
    return json::parse(last);
  } catch (const json::exception& e) {
    fail("bench: the ", what, " worker printed malformed JSON: ", e.what());
  }
}

// Runs a worker (argv[0]: this executable or the Python interpreter) and reads its result.
json run_worker_process(std::vector<std::string> argv, const std::string& what) {
  ChildProcess child;
  child.argv = std::move(argv);
  child.capture_stdout = true;
  return parse_worker_output(run_child(child), what);
}

// bench/torch_model.py: --torch-script, else beside the source tree the binary was built in
// (the build directory is inside the tree or beside it), else under the working directory.
std::string find_torch_script(const std::string& given) {
  if (!given.empty()) {
    require_path_kind(given, PathKind::kFile, "--torch-script");
    return given;
  }
  std::error_code ec;
  fs::path dir = fs::read_symlink(kSelfExecutable, ec).parent_path();
  for (int up = 0; !ec && up < 6 && !dir.empty(); ++up, dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / kTorchScript)) return (dir / kTorchScript).string();
    if (dir == dir.parent_path()) break;
  }
  if (fs::is_regular_file(kTorchScript)) return fs::absolute(kTorchScript).string();
  return "";
}

struct TorchSide {
  bool on = false;
  std::string script;
  json info;
  std::string why_off;  // when not on
};

// The PyTorch side: probed once; --torch auto skips it (saying why) when it cannot run.
TorchSide probe_torch(const Options& o) {
  TorchSide t;
  if (o.torch == "off" || o.gemm_only) {
    t.why_off = o.gemm_only ? "--gemm-only" : "--torch off";
    return t;
  }
  std::string why;
  if (o.device != "cpu") why = "bench/torch_model.py runs on the CPU only (--device " + o.device + ")";
  else if ((t.script = find_torch_script(o.torch_script)).empty())
    why = "bench/torch_model.py not found (give --torch-script)";
  else if (!fs::exists(o.python)) why = o.python + " not found";
  else {
    try {
      t.info = run_worker_process({o.python, t.script, "--probe"}, "torch probe");
      t.on = true;
    } catch (const Error& e) {
      why = e.what();
    }
  }
  require(t.on || o.torch == "auto", "--torch on: ", why);
  if (!t.on) std::fprintf(stderr, "bench: skipping the PyTorch comparison: %s\n", why.c_str());
  t.why_off = why;
  return t;
}

// Whether the PyTorch side implements a model's residual mode (its probe lists them; a probe
// without the list: every mode).
bool torch_implements(const TorchSide& t, const ModelConfig& model) {
  const auto it = t.info.find("residuals");
  if (it == t.info.end()) return true;
  for (const auto& r : *it)
    if (r.is_string() && r.get<std::string>() == to_string(model.residual)) return true;
  return false;
}

// The flags every worker of one (seq, batch) gets.
std::vector<std::string> common_args(const Options& o, const Plan& p, int seq, int batch) {
  return {"--batch",   std::to_string(batch),     "--seq",    std::to_string(seq),
          "--steps",   std::to_string(o.steps),   "--warmup", std::to_string(o.warmup),
          "--threads", std::to_string(p.threads), "--seed",   std::to_string(o.seed)};
}

// The matmul precision an arm runs in: bf16 for an "<arm>@bf16" (model/arms.hpp), else the base's.
kernels::MatmulPrecision arm_precision(const Plan& p, const std::string& arm) {
  return is_bf16_arm(arm) ? kernels::MatmulPrecision::bf16 : p.base.precision;
}

// torch's precision for an arm: --torch-precision, or with `auto` the arm's own (like with like).
std::string torch_precision_of(const Options& o, const Plan& p, const std::string& arm) {
  return o.torch_precision == "auto" ? kernels::to_string(arm_precision(p, arm)) : p.torch_precision;
}

// This executable as an attnres worker (bench/worker.hpp) of one arm, or of a pair (the second
// stepped alternately with the first).
std::vector<std::string> attnres_worker_args(const Options& o, const Plan& p, const ModelConfig& model,
                                             const std::string& arm, const ModelConfig* paired = nullptr,
                                             const std::string& paired_arm = "") {
  std::vector<std::string> argv = {kSelfExecutable, "bench", "--worker", "--model-json", json(model).dump()};
  if (paired != nullptr)
    argv.insert(argv.end(), {"--paired-json", json(*paired).dump(), "--paired-precision",
                             kernels::to_string(arm_precision(p, paired_arm))});
  argv.insert(argv.end(), {"--precision", kernels::to_string(arm_precision(p, arm))});
  if (o.device != "cpu") argv.insert(argv.end(), {"--device", o.device});
  return argv;
}

// Every arm (and torch's) in its own process, --rounds times; odd rounds run the arms in reverse
// order, so a slow drift in the machine's load favours no arm (A B, B A, ...).
void time_arms(const Options& o, const Plan& p, const TorchSide& torch, Measurement& m) {
  for (int round = 0; round < o.rounds; ++round)
    for (int seq : p.seqs)
      for (std::size_t i = 0; i < o.arms.size(); ++i) {
        const std::string& arm = round % 2 == 0 ? o.arms[i] : o.arms[o.arms.size() - 1 - i];
        const int batch = p.batch_for(o, seq);
        const ModelConfig model = arm_config(p.base, arm, seq);
        std::vector<std::string> impls = {"attnres"};
        if (torch.on && torch_implements(torch, model)) impls.push_back("torch");
        else if (torch.on && round == 0 && seq == p.seqs.front())
          std::fprintf(stderr, "bench: the PyTorch package has no residual mode '%s': arm %s runs in attnres only\n",
                       to_string(model.residual).c_str(), arm.c_str());
        for (const auto& impl : impls) {
          std::vector<std::string> argv = impl == "attnres"
                                              ? attnres_worker_args(o, p, model, arm)
                                              : std::vector<std::string>{o.python, torch.script, "--model-json",
                                                                         json(model).dump(), "--precision",
                                                                         torch_precision_of(o, p, arm)};
          const std::vector<std::string> common = common_args(o, p, seq, batch);
          argv.insert(argv.end(), common.begin(), common.end());
          std::fprintf(stderr, "bench: round %d/%d  %-7s %-10s T=%-5d B=%-3d ... ", round + 1, o.rounds,
                       impl.c_str(), arm.c_str(), seq, batch);
          std::fflush(stderr);
          const json r = run_worker_process(argv, impl + " " + arm);
          m.get(impl, arm, seq, batch).absorb(r);
          const double ms = median(r.at("step_ms").get<std::vector<double>>());
          std::fprintf(stderr, "%.0f ms/step, %.0f tokens/s, peak %.0f MB\n", ms, double(batch) * seq / (ms / 1e3),
                       double(r.at("peak_rss_bytes").get<std::int64_t>()) / 1e6);
        }
      }
}

// The first arm against each other arm, in one process, alternate steps; one process per pair
// and round. A process's own interval misses what differs between processes (the arena's place
// in memory, the cache sets its buffers fall into): on the study-size models the ratio moved by
// ±0.6% between processes with intervals of ±0.4% (docs/performance.md), so --rounds repeats it.
json time_pairs(const Options& o, const Plan& p) {
  json paired = json::array();
  for (int round = 0; round < o.rounds; ++round)
    for (int seq : p.seqs)
      for (std::size_t i = 1; i < o.arms.size(); ++i) {
        const int batch = p.batch_for(o, seq);
        std::fprintf(stderr,
                     "bench: paired  round %d/%d  attnres %s vs %s T=%-5d B=%-3d (one process, alternate steps) ... ",
                     round + 1, o.rounds, o.arms[i].c_str(), o.arms[0].c_str(), seq, batch);
        std::fflush(stderr);
        const ModelConfig a = arm_config(p.base, o.arms[0], seq), b = arm_config(p.base, o.arms[i], seq);
        std::vector<std::string> argv = attnres_worker_args(o, p, a, o.arms[0], &b, o.arms[i]);
        const std::vector<std::string> common = common_args(o, p, seq, batch);
        argv.insert(argv.end(), common.begin(), common.end());
        const json r = run_worker_process(argv, "paired " + o.arms[i] + " " + o.arms[0]);
        paired.push_back(paired_summary(r, o.arms[0], o.arms[i], seq, batch));
        json& s = paired.back();
        s["round"] = round + 1;
        std::fprintf(stderr, "step time ratio %.3f (95%% CI %.3f-%.3f)\n", s["step_time_ratio"].get<double>(),
                     s["ratio_ci95_low"].get<double>(), s["ratio_ci95_high"].get<double>());
      }
  return paired;
}

void print_start(const Plan& p, const std::string& load_start, const TorchSide& torch) {
  const std::string precision = kernels::to_string(p.base.precision);
  std::fprintf(stderr, "bench: %s, %d threads, OpenBLAS core %s (OPENBLAS_CORETYPE=%s), load average %s\n",
               cpu_model().c_str(), p.threads, openblas_core().c_str(),
               getenv_or("OPENBLAS_CORETYPE", "unset").c_str(), load_start.c_str());
  std::fprintf(stderr, "bench: matmul precision attnres %s%s", precision.c_str(),
               p.base.precision == kernels::MatmulPrecision::bf16 ? (" (" + bf16_backend() + ")").c_str()
                                                                  : (" (Linear GEMMs: " + fp32_gemm_backend() + ")").c_str());
  if (torch.on)
    std::fprintf(stderr, ", torch %s%s", p.torch_precision.c_str(),
                 p.torch_precision == precision ? "" : " (different precisions)");
  std::fprintf(stderr, "\n");
}

// The bf16 reference's candidates: attnres' bf16 GEMM and, when torch runs, torch's bf16 matmul
// (bench_worker --matmul-rate), each on bf16_reference_shapes().
std::vector<GemmRate> measure_bf16_candidates(const Options& o, const Plan& p, const TorchSide& torch,
                                              std::int64_t tokens) {
  if (o.device != "cpu") {  // the steps run on a GPU: its cuBLASLt bf16 GEMM is the reference
    std::vector<GemmRate> rates;
    for (const auto& [m, n, k] : bf16_reference_shapes(p.base.model, tokens, kGpuBf16ReferenceCube)) {
      rates.push_back({"attnres", "cuBLASLt bf16 (" + o.device + ")", m, n, k,
                       gpu_bf16_gemm_gflops(o.device, m, n, k, kBf16ReferenceReps)});
      std::fprintf(stderr, "bench:   %-7s %-40s %14s %7.1f GFLOP/s\n", rates.back().impl.c_str(),
                   rates.back().op.c_str(), rates.back().shape().c_str(), rates.back().gflops);
    }
    return rates;
  }
  const auto shapes = bf16_reference_shapes(p.base.model, tokens, o.bf16_reference_cube);
  std::vector<GemmRate> rates = measure_bf16_rates(shapes, kBf16ReferenceReps);
  if (torch.on) {
    std::string list;
    for (const auto& [m, n, k] : shapes) list += (list.empty() ? "" : ",") + shape_text(m, n, k);
    const json r = run_worker_process({o.python, torch.script, "--matmul-rate", "--shapes", list, "--dtype", "bf16",
                                       "--threads", std::to_string(p.threads), "--reps",
                                       std::to_string(kBf16ReferenceReps)},
                                      "torch --matmul-rate");
    for (const json& x : r.at("matmul"))
      rates.push_back({"torch", "torch.matmul bf16", x.at("m").get<std::int64_t>(), x.at("n").get<std::int64_t>(),
                       x.at("k").get<std::int64_t>(), x.at("gflops").get<double>()});
  }
  for (const GemmRate& g : rates)
    std::fprintf(stderr, "bench:   %-7s %-40s %14s %7.1f GFLOP/s\n", g.impl.c_str(), g.op.c_str(), g.shape().c_str(),
                 g.gflops);
  return rates;
}

}  // namespace

void run(const Options& o) {
  Plan p = make_plan(o);
  set_num_threads(o.threads);
  p.threads = num_threads();
  Results r;
  r.name = o.name;
  r.base = p.base;
  r.device = o.device;
  r.arms = o.arms;
  r.seqs = p.seqs;
  r.steps = o.steps;
  r.warmup = o.warmup;
  r.rounds = o.rounds;
  r.threads = p.threads;
  r.load_start = load_average();
  const TorchSide torch = probe_torch(o);
  print_start(p, r.load_start, torch);
  r.torch_on = torch.on;
  r.torch_info = torch.info;
  r.torch_precision = p.torch_precision;
  r.torch_precision_flag = o.torch_precision;
  // MFU of a bf16 step is against a bf16 rate: measured when either side runs bf16 (an "@bf16" arm too).
  const bool bf16_arm = std::any_of(o.arms.begin(), o.arms.end(), [](const std::string& a) { return is_bf16_arm(a); });
  const bool bf16_steps = p.base.precision == kernels::MatmulPrecision::bf16 || bf16_arm ||
                          (torch.on && p.torch_precision == "bf16");

  std::fprintf(stderr, "bench: measuring the sgemm reference rate...\n");
  const std::int64_t gemm_tokens = std::int64_t(p.batch_for(o, p.seqs.front())) * p.seqs.front();
  r.gemm = measure_sgemm_reference(p.base.model, gemm_tokens);
  std::fprintf(stderr, "bench: sgemm 1024^3 %.1f GFLOP/s, %s %.1f GFLOP/s\n", r.gemm.square,
               r.gemm.model_shape.c_str(), r.gemm.model);
  std::vector<GemmRate> bf16_rates;
  if (bf16_steps) {
    std::fprintf(stderr, "bench: measuring the bf16 reference rate (best of %d calls per shape)...\n",
                 kBf16ReferenceReps);
    bf16_rates = measure_bf16_candidates(o, p, torch, gemm_tokens);
  }
  if (o.gemm_only) {
    std::fprintf(stderr, "bench: the model's Linear GEMMs, fp32 sgemm and bf16...\n");
    r.shapes = measure_linear_shapes(p.base.model, gemm_tokens, 3);
  }
  if (!o.gemm_only) time_arms(o, p, torch, r.measurement);
  if (!o.gemm_only && o.paired && o.arms.size() >= 2) r.paired = time_pairs(o, p);
  r.load_end = load_average();
  if (!r.measurement.cells.empty()) {  // measured again after the runs: the reference is the better of the two
    const GemmRates again = measure_sgemm_reference(p.base.model, gemm_tokens);
    std::fprintf(stderr, "bench: sgemm again: 1024^3 %.1f GFLOP/s, %s %.1f GFLOP/s\n", again.square,
                 again.model_shape.c_str(), again.model);
    r.gemm.square = std::max(r.gemm.square, again.square);
    r.gemm.model = std::max(r.gemm.model, again.model);
    if (bf16_steps) {
      std::fprintf(stderr, "bench: the bf16 reference again:\n");
      keep_better(bf16_rates, measure_bf16_candidates(o, p, torch, gemm_tokens));
    }
  }
  r.fp32_reference = fp32_rate_reference(r.gemm);
  if (bf16_steps)
    r.bf16_reference = best_rate_reference(
        "bf16", bf16_rates, torch.on ? "" : "torch not run (" + torch.why_off + "): attnres' bf16 GEMM only");

  const json out = results_json(r);
  if (!o.json_file.empty()) {
    std::ofstream f(o.json_file);
    f << out.dump(2) << "\n";
    require(f.good(), "--json-file: cannot write '", o.json_file, "'");
  }
  if (o.json_out) std::printf("%s\n", out.dump(2).c_str());
  else print_table(r, out);
}

}  // namespace attnres::bench
