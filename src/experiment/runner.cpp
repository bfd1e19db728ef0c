#include "experiment/runner.hpp"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/loader.hpp"
#include "experiment/routing.hpp"
#include "results/experiment_spec.hpp"
#include "results/run_result.hpp"
#include "results/train_result.hpp"
#include "train/evaluate.hpp"
#include "train/inference.hpp"
#include "train/trainer.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/process.hpp"
#include "util/status_line.hpp"
#include "util/threads.hpp"

namespace attnres::experiment {

namespace fs = std::filesystem;

const std::vector<std::string>& arm_names() {
  static const std::vector<std::string> names = {"prenorm", "full", "block", "rd", "rd-tied", "rd-average", "rd-frozen"};
  return names;
}

ModelConfig apply_arm(ModelConfig m, const std::string& arm) {
  if (arm == "prenorm") m.residual = ResidualMode::prenorm;
  else if (arm == "full") m.residual = ResidualMode::full;
  else if (arm == "block") m.residual = ResidualMode::block;
  else if (arm.rfind("rd", 0) == 0) {
    m.residual = ResidualMode::rd;
    if (arm == "rd") m.value_route = ValueRoute::decoupled;
    else if (arm == "rd-tied") m.value_route = ValueRoute::tied;
    else if (arm == "rd-average") m.value_route = ValueRoute::average;
    else if (arm == "rd-frozen") m.value_route = ValueRoute::frozen;
    else fail("unknown arm '", arm, "' (expected prenorm, full, block, rd, rd-tied, rd-average, rd-frozen)");
  } else {
    fail("unknown arm '", arm, "' (expected prenorm, full, block, rd, rd-tied, rd-average, rd-frozen)");
  }
  return m;
}

namespace {

// Trains one run in a child process, so its speed and peak memory are its own.
// Returns the child's exit status (0: finished or stopped cleanly).
int train_in_child(const std::string& config_path, const std::string& data, const std::string& out, bool resume,
                   const std::string& label, int threads, const std::string& device) {
  ChildProcess child;
  child.argv = {kSelfExecutable, "train", "--config", config_path, "--data", data, "--out", out,
                "--label", label, "--device", device};
  if (resume) child.argv.push_back("--resume");
  // The child is a process of its own, not a rank of this MPI job; under MPI it gets its rank's
  // share of the machine's cores.
  child.set_env = {{"ATTNRES_NO_MPI", "1"}};
  if (threads > 0) child.set_env.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
  child.name = "a training process for '" + out + "'";
  return run_child(child).status;
}

// experiment.json against the one this command would write: equal, except that the
// configurations in it (model, train.config_toml) are compared as parsed configurations, so an
// experiment created before a config key existed (the key absent: its default) still matches.
bool same_experiment(results::ExperimentSpec existing, const results::ExperimentSpec& spec,
                     const std::string& path) {
  try {
    const char* toml = "config_toml";
    if (existing.train.contains(toml) && existing.train[toml].is_string() &&
        config_differences(train_config_keys(), parse_toml_config(existing.train[toml].get<std::string>(), path),
                           parse_toml_config(spec.train.at(toml).get<std::string>(), path))
            .empty())
      existing.train[toml] = spec.train.at(toml);
    if (config_differences(model_config_keys(), model_config_from_json(existing.model, path),
                           model_config_from_json(spec.model, path))
            .empty())
      existing.model = spec.model;
  } catch (const Error&) {
    return false;  // not a configuration this version reads: a different experiment
  }
  return existing == spec;
}

}  // namespace

bool run_experiment(const ExperimentOptions& options) {
  ExperimentOptions o = options;
  dist::Communicator single;
  dist::Communicator& comm = o.comm != nullptr ? *o.comm : single;
  int child_threads = 0;
  if (comm.distributed()) {
    require(o.workers == 1, "--worker cannot be combined with an MPI launch: each rank is one worker");
    o.worker = comm.rank();
    o.workers = comm.world();
    child_threads = dist::default_threads(comm);
  }
  // A child is not an MPI rank: it is told its rank's GPU.
  const std::string device =
      o.device == "cuda" && comm.distributed() ? "cuda:" + std::to_string(comm.local_rank()) : o.device;
  require(!o.arms.empty(), "--arms must name at least one arm");
  require(!o.seeds.empty(), "--seeds must name at least one seed");
  require(o.workers >= 1 && o.worker >= 0 && o.worker < o.workers, "--worker K/N needs 0 <= K < N");
  for (std::size_t i = 0; i < o.arms.size(); ++i) {
    apply_arm(o.base.model, o.arms[i]);  // validates the name
    for (std::size_t k = 0; k < i; ++k) require(o.arms[i] != o.arms[k], "arm '", o.arms[i], "' is listed twice");
  }
  const TrainConfig base = resolve_vocab(o.base, o.data_dir);
  base.validate();
  fs::create_directories(o.out_dir);
  StatusLine status(o.progress);

  // experiment.json fixes the protocol; a resumed experiment must ask for the same one.
  results::ExperimentSpec spec;
  spec.arms = o.arms;
  spec.baseline = o.arms.front();
  for (std::uint64_t seed : o.seeds) spec.seeds.push_back(static_cast<std::int64_t>(seed));
  spec.tokens = base.total_steps() * base.tokens_per_step();
  for (auto s : base.milestone_steps()) spec.milestones.push_back(s * base.tokens_per_step());
  spec.preset = o.preset;
  spec.data = fs::absolute(o.data_dir).string();
  spec.model = nlohmann::json(apply_arm(base.model, o.arms.front()));
  spec.train = {{"config_toml", to_toml(base)}};
  const std::string spec_path = results::experiment_spec_path(o.out_dir);
  // Rank 0 writes the spec first; the others then check theirs against it.
  if (!comm.is_root()) comm.barrier();
  if (fs::exists(spec_path)) {
    require(same_experiment(results::read_experiment_spec(spec_path), spec, spec_path), "'", o.out_dir,
            "' holds a different experiment (", spec_path,
            " differs in arms, seeds, budget, data or config); choose another --out");
  } else {
    require(comm.is_root(), "'", spec_path, "' was not written by rank 0; is '", o.out_dir,
            "' on a file system every rank shares?");
    results::write_experiment_spec(spec_path, spec);
  }
  if (comm.is_root()) comm.barrier();

  // This worker's share; returns early when stopped by a signal (resumable).
  const auto run_share = [&] {
  int index = -1;
  for (std::uint64_t seed : o.seeds) {
    for (const std::string& arm : o.arms) {
      ++index;
      if (index % o.workers != o.worker) continue;
      const std::string result_path = results::run_result_path(o.out_dir, arm, static_cast<std::int64_t>(seed));
      if (fs::exists(result_path)) continue;
      if (o.stop != nullptr && o.stop->load()) return;
      const fs::path run_dir = fs::path(result_path).parent_path();
      fs::create_directories(run_dir);
      TrainConfig config = base;
      config.model = apply_arm(base.model, arm);
      config.seed = seed;  // identical shared initial weights across arms
      config.data_seed = seed;  // identical data order across arms
      const std::string config_path = (run_dir / "run.toml").string();
      write_text_atomically(config_path, to_toml(config));
      const std::string label = arm + " seed " + std::to_string(seed);
      const bool resume = fs::exists(run_dir / "checkpoint.safetensors");
      const int rc = train_in_child(config_path, o.data_dir, run_dir.string(), resume, label, child_threads, device);
      require(rc == 0, "training ", label, " failed (exit status ", rc, "); its log is above, its files in '",
              run_dir.string(), "'; rerun the same command to resume");
      const std::string train_result = results::train_result_path(run_dir.string());
      if (!fs::exists(train_result)) return;  // stopped by a signal; resumable
      const results::TrainResult tr = results::read_train_result(train_result);

      // Test NLL and routing diagnostics of the final weights, with the run's thread count
      // (results depend on it at float rounding level).
      set_num_threads(config.threads > 0 ? config.threads : dist::default_threads(comm));
      // On the CPU in fp32, whatever the training device and precision (docs/cuda.md).
      const std::unique_ptr<InferenceBackend> model =
          make_inference_backend("cpu", config.model, config.batch_size, config.seq_len);
      model->load_weights((run_dir / "model.safetensors").string());
      const data::TokenDataset test = data::TokenDataset::open(o.data_dir, "test", {false, nullptr});
      const data::TokenDataset val = data::TokenDataset::open(o.data_dir, "val", {false, nullptr});
      const EvalResult test_eval = evaluate_split(*model, test, config.batch_size, config.seq_len, config.eval_tokens);
      results::RunResult result;
      result.arm = arm;
      result.seed = static_cast<std::int64_t>(seed);
      result.params = tr.params;
      result.milestones = tr.milestones;
      result.test_nll = test_eval.nll;
      result.tokens_per_sec = tr.tokens_per_sec;
      result.step_time_ms = tr.step_time_ms;
      result.peak_rss_bytes = tr.peak_rss_bytes;
      result.curve = tr.curve;
      if (config.model.uses_depth_reads())
        result.routing = routing_diagnostics(*model, val, config.batch_size, config.seq_len, o.diagnostic_tokens);
      results::write_run_result(result_path, result);
      status.message(concat(label, ": done, test NLL ", test_eval.nll));
    }
  }
  };
  run_share();
  comm.wait_for_all();  // every rank's share is done (or stopped)
  for (std::uint64_t seed : o.seeds)
    for (const std::string& arm : o.arms)
      if (!fs::exists(results::run_result_path(o.out_dir, arm, static_cast<std::int64_t>(seed)))) return false;
  return true;
}

}  // namespace attnres::experiment
