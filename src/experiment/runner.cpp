#include "experiment/runner.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <nlohmann/json.hpp>

#include "data/dataset_identity.hpp"
#include "data/loader.hpp"
#include "experiment/directory.hpp"
#include "experiment/plan.hpp"
#include "experiment/diagnostics.hpp"
#include "analysis/summary.hpp"
#include "results/experiment_spec.hpp"
#include "results/run_result.hpp"
#include "results/train_result.hpp"
#include "train/checkpoint.hpp"
#include "train/evaluate.hpp"
#include "train/inference.hpp"
#include "train/trainer.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/text.hpp"
#include "util/process.hpp"
#include "util/status_line.hpp"
#include "util/threads.hpp"
#include "analysis/format.hpp"

namespace attnres::experiment {
using namespace analysis;  // the statistics, summaries and number formats of the analysis module

namespace fs = std::filesystem;

namespace {

// Trains one run in a child process, so its speed and peak memory are its own.
// Returns the child's exit status (0: finished; 128 + N: stopped by signal N, resumable).
int train_in_child(const std::string& config_path, const std::string& data, const std::string& out, bool resume,
                   const std::string& label, const std::atomic<bool>* stop, int threads, const std::string& device) {
  ChildProcess child;
  child.argv = {kSelfExecutable, "train", "--config", config_path, "--data", data, "--out", out,
                "--label", label, "--device", device};
  if (resume) child.argv.push_back("--resume");
  // The child is a process of its own, not a rank of this MPI job; under MPI it gets its rank's
  // share of the machine's cores.
  child.set_env = {{"ATTNRES_NO_MPI", "1"}};
  if (threads > 0) child.set_env.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
  child.name = "a training process for '" + out + "'";
  child.stop = stop;
  return run_child(child).status;
}

// The keys where two experiment.json documents differ, each with both values: "arms =
// [...] (experiment.json) vs [...] (requested)", a configuration by its keys (train.lr = ...).
void json_differences(const nlohmann::json& a, const nlohmann::json& b, const std::string& key,
                      std::vector<ConfigDifference>& out) {
  if (a == b) return;
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, v] : a.items())
      json_differences(v, b.contains(k) ? b.at(k) : nlohmann::json(), key.empty() ? k : key + "." + k, out);
    for (const auto& [k, v] : b.items())
      if (!a.contains(k)) json_differences(nlohmann::json(), v, key.empty() ? k : key + "." + k, out);
    return;
  }
  const auto shown = [](const nlohmann::json& j) { return j.is_null() ? std::string("(absent)") : j.dump(); };
  out.push_back({key, shown(a), shown(b)});
}

// experiment.json against the one this command would write: the differences (none: the same
// experiment), except that the configurations in it (model, train.config_toml) are compared as
// parsed configurations, so an experiment created before a config key existed (the key absent:
// its default) still matches, and a differing one is named by its keys.
std::vector<ConfigDifference> experiment_differences(const results::ExperimentSpec& existing,
                                                     const results::ExperimentSpec& spec, const std::string& path) {
  nlohmann::json a = results::to_json(existing), b = results::to_json(spec);
  // Replaces two configurations by their parsed differences ("train.lr" rather than the TOML text).
  const auto compare_configs = [&](nlohmann::json& at, nlohmann::json& want, const std::string& prefix,
                                   std::vector<ConfigDifference>& out) {
    const auto add = [&](ConfigDifference d) {  // a model key differs in both configurations: said once
      d.key = prefix + d.key;
      for (const ConfigDifference& seen : out)
        if (seen.key == d.key) return;
      out.push_back(std::move(d));
    };
    const char* toml = "config_toml";
    nlohmann::json& train = at["train"];
    const nlohmann::json& want_train = want["train"];
    if (train.contains(toml) && train[toml].is_string() && want_train.contains(toml) && want_train[toml].is_string()) {
      for (ConfigDifference d : config_differences(train_config_keys(), parse_toml_config(train[toml].get<std::string>(), path),
                              parse_toml_config(want_train.at(toml).get<std::string>(), path)))
        add(std::move(d));
      train[toml] = want_train.at(toml);
    }
    for (ConfigDifference d : config_differences(model_config_keys(), model_config_from_json(at["model"], path),
                                                 model_config_from_json(want["model"], path)))
      add(std::move(d));
    at["model"] = want["model"];
  };
  std::vector<ConfigDifference> out;
  try {
    compare_configs(a, b, "", out);
    if (a.contains("groups") && b.contains("groups") && a["groups"].is_array() && b["groups"].is_array())
      for (std::size_t g = 0; g < a["groups"].size() && g < b["groups"].size(); ++g)
        compare_configs(a["groups"][g], b["groups"][g], concat("groups[", g, "].").c_str(), out);
  } catch (const Error& e) {
    out.push_back({"configuration", concat("unreadable by this version (", e.what(), ")"), "readable"});
    return out;
  }
  // The dataset by the keys its record has (an older attnres recorded fewer). Where it is recorded
  // (a protocol's experiment.json), the data is compared by that identity alone: its path is a
  // label, so a study copied to another machine resumes there on a copy of its data at another
  // path (docs/experiments.md, "Resuming anywhere").
  if (a.contains("dataset") && b.contains("dataset")) {
    for (ConfigDifference d : data::dataset_identity_differences(a["dataset"], b["dataset"]))
      out.push_back({"dataset." + d.key, std::move(d.a), std::move(d.b)});
    a["dataset"] = b["dataset"];
    if (b.contains("data")) a["data"] = b["data"];
    else a.erase("data");
  }
  json_differences(a, b, "", out);
  return out;
}


// The experiment asked for, against the one experiment.json holds: more seeds (the recorded ones
// first, in the same order) and more arms (the recorded ones among them, the same baseline), in the
// main list or a group, with everything else the same. Returns what is added, "" when `requested`
// is not such a growth of `existing`.
std::string growth(const results::ExperimentSpec& existing, const results::ExperimentSpec& requested,
                   const std::string& path) {
  const auto contains_all = [](const std::vector<std::string>& big, const std::vector<std::string>& small) {
    return std::all_of(small.begin(), small.end(),
                       [&](const std::string& x) { return std::find(big.begin(), big.end(), x) != big.end(); });
  };
  if (requested.baseline != existing.baseline || !contains_all(requested.arms, existing.arms)) return "";
  if (requested.seeds.size() < existing.seeds.size() ||
      !std::equal(existing.seeds.begin(), existing.seeds.end(), requested.seeds.begin()))
    return "";
  if (requested.groups.size() != existing.groups.size()) return "";
  results::ExperimentSpec same = requested;
  same.arms = existing.arms;
  same.seeds = existing.seeds;
  std::vector<std::string> added;
  for (const auto& arm : requested.arms)
    if (std::find(existing.arms.begin(), existing.arms.end(), arm) == existing.arms.end()) added.push_back("arm " + arm);
  for (std::size_t g = 0; g < existing.groups.size(); ++g) {
    const results::GroupSpec &a = existing.groups[g], &b = requested.groups[g];
    if (a.name != b.name || a.baseline != b.baseline || !contains_all(b.arms, a.arms)) return "";
    same.groups[g].arms = a.arms;
    for (const auto& arm : b.arms)
      if (std::find(a.arms.begin(), a.arms.end(), arm) == a.arms.end()) added.push_back(concat(a.name, "/", arm));
  }
  if (existing.twin_perturbation == 0) same.twin_perturbation = 0;  // a twin arm added
  if (!experiment_differences(existing, same, path).empty()) return "";
  std::string seeds;
  for (std::size_t i = existing.seeds.size(); i < requested.seeds.size(); ++i)
    seeds += (seeds.empty() ? "" : ", ") + std::to_string(requested.seeds[i]);
  if (!seeds.empty()) added.push_back("seeds " + seeds);
  std::string out;
  for (const auto& a : added) out += (out.empty() ? "" : "; ") + a;
  return out;
}

// What experiment.json in the directory says of the experiment asked for: none yet, the same one, a
// growth of it (`added` names what is added), or a part of it (left as it is). A different experiment
// is an Error naming the differences, for the real command and --dry-run alike.
struct RecordedState {
  bool recorded = false;
  std::string added;  // a growth: what it adds
};

RecordedState recorded_state(const ExperimentOptions& o, const ExperimentPlan& plan) {
  const std::string spec_path = results::experiment_spec_path(o.out_dir);
  RecordedState state;
  if (!fs::exists(spec_path)) return state;
  state.recorded = true;
  const results::ExperimentSpec existing = results::read_experiment_spec(spec_path);
  const std::vector<ConfigDifference> differences = experiment_differences(existing, plan.spec, spec_path);
  // A request for part of a recorded experiment (fewer seeds or arms, e.g. a rerun of the command
  // that started an experiment which has grown since) runs its part and leaves experiment.json.
  if (!differences.empty() && growth(plan.spec, existing, spec_path).empty()) {
    state.added = growth(existing, plan.spec, spec_path);
    require(!state.added.empty(), "'", o.out_dir, "' holds a different experiment: ", spec_path, " differs in ",
            describe_differences(differences, "experiment.json", "requested"),
            "; choose another --out (an experiment may only grow: more seeds after the recorded ones, more arms, "
            "everything else the same)");
  }
  return state;
}

// Writes experiment.json, or checks the one there (recorded_state) and rewrites it for a growth.
// Rank 0 writes; the others check theirs against it.
void settle_spec(const ExperimentOptions& o, const ExperimentPlan& plan, dist::Communicator& comm, StatusLine& status) {
  const std::string spec_path = results::experiment_spec_path(o.out_dir);
  if (!comm.is_root()) comm.barrier();
  const RecordedState state = recorded_state(o, plan);
  if (!state.added.empty()) {
    std::size_t reused = 0;
    for (const PlannedRun& r : plan.runs) reused += fs::exists(r.result_path) ? 1 : 0;
    status.message(concat("experiment '", o.out_dir, "' grows: ", state.added, "; ", reused,
                          " recorded runs are reused unchanged"));
    if (comm.is_root()) results::write_experiment_spec(spec_path, plan.spec);
  } else if (!state.recorded) {
    require(comm.is_root(), "'", spec_path, "' was not written by rank 0; is '", o.out_dir,
            "' on a file system every rank shares?");
    results::write_experiment_spec(spec_path, plan.spec);
  }
  if (comm.is_root()) comm.barrier();
}

// Evaluates a trained run's final weights (test NLL, routing and connection diagnostics) and
// writes its result.json, whose existence marks the run finished.
void record_run(const ExperimentOptions& o, const PlannedRun& run, const fs::path& run_dir, const dist::Communicator& comm,
                StatusLine& status) {
  const results::TrainResult tr = results::read_train_result(results::train_result_path(run_dir.string()));
  const TrainConfig& config = run.config;
  // With the run's thread count (results depend on it at float rounding level), on the CPU in
  // fp32 whatever the training device and precision (docs/cuda.md).
  set_num_threads(config.threads > 0 ? config.threads : dist::default_threads(comm));
  const std::unique_ptr<InferenceBackend> model =
      make_inference_backend("cpu", config.model, config.batch_size, config.seq_len);
  const std::string weights_path = (run_dir / "model.safetensors").string();
  model->load_weights(weights_path);
  const data::TokenDataset test = data::TokenDataset::open(o.data_dir, "test", {false, nullptr});
  const data::TokenDataset val = data::TokenDataset::open(o.data_dir, "val", {false, nullptr});
  const EvalResult test_eval = evaluate_split(*model, test, config.batch_size, config.seq_len, config.eval_tokens);
  results::RunResult result;
  result.arm = run.arm;
  result.seed = static_cast<std::int64_t>(run.seed);
  result.params = tr.params;
  result.milestones = tr.milestones;
  result.test_nll = test_eval.nll;
  result.tokens_per_sec = tr.tokens_per_sec;
  result.step_time_ms = tr.step_time_ms;
  result.cpu_seconds_per_step = tr.cpu_seconds_per_step;
  result.peak_rss_bytes = tr.peak_rss_bytes;
  result.curve = tr.curve;
  result.instability = tr.instability;
  result.provenance = tr.provenance;
  // What the mode offers (model/arms.hpp): routing, connections, Amax gains, or nothing.
  DepthDiagnostics depth = diagnose(*model, val, config.batch_size, config.seq_len, o.diagnostic_tokens);
  result.routing = std::move(depth.routing);
  result.connections = std::move(depth.connections);
  result.amax_gain = depth.amax_gain;
  result.routing_max_weight = depth.routing_max_weight;
  results::write_run_result(run.result_path, result);
  status.message(concat(run.label, ": done, test NLL ", test_eval.nll,
                        tr.instability && tr.instability->unstable ? " (unstable: a sustained loss spike)" : ""));
}

// "1h05m", "7m", "40s".
std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return concat(s / 3600, "h", s % 3600 / 60 < 10 ? "0" : "", s % 3600 / 60, "m");
  if (s >= 60) return concat(s / 60, "m");
  return concat(s, "s");
}

// Progress over the experiment: how many runs are finished, and this process's pace.
class Progress {
 public:
  explicit Progress(const std::vector<PlannedRun>& runs) : runs_(runs) {}
  // "run 7/40 (31 to go, ETA 1h05m at this process's 3m12s per run)"
  std::string starting(std::size_t mine_left) const {
    std::size_t done = 0;
    for (const PlannedRun& r : runs_) done += fs::exists(r.result_path) ? 1 : 0;
    std::string eta;
    if (trained_ > 0) {
      const double per_run = seconds_ / static_cast<double>(trained_);
      eta = concat(", ETA ", duration_text(per_run * static_cast<double>(mine_left)), " for this worker at ",
                   duration_text(per_run), " per run");
    }
    return concat("run ", done + 1, "/", runs_.size(), eta);
  }
  void trained(double seconds) {
    ++trained_;
    seconds_ += seconds;
  }

 private:
  const std::vector<PlannedRun>& runs_;
  std::size_t trained_ = 0;
  double seconds_ = 0;
};

// This worker's runs among those of the first `seeds` seeds: trains and records each that has no
// result yet. False when stopped by a signal (resumable).
bool run_share(const ExperimentOptions& o, const ExperimentPlan& plan, int seeds, int child_threads,
               const std::string& device, dist::Communicator& comm, Progress& progress, StatusLine& status) {
  const auto mine = [&](std::size_t index) {
    return static_cast<int>(index % static_cast<std::size_t>(o.workers)) == o.worker &&
           plan.runs[index].seed_index < seeds && !fs::exists(plan.runs[index].result_path);
  };
  for (std::size_t index = 0; index < plan.runs.size(); ++index) {
    if (!mine(index)) continue;
    if (o.stop != nullptr && o.stop->load()) return false;
    const PlannedRun& run = plan.runs[index];
    std::size_t left = 0;
    for (std::size_t i = index; i < plan.runs.size(); ++i) left += mine(i) ? 1 : 0;
    status.message(concat(run.label, ": ", progress.starting(left)));
    const auto start = std::chrono::steady_clock::now();
    const fs::path run_dir = fs::path(run.result_path).parent_path();
    const int rc = train_child(run.config, o.data_dir, run_dir.string(), run.label, o.stop, child_threads, device);
    if (rc == 128 + SIGINT || rc == 128 + SIGTERM) return false;  // stopped by a signal; resumable
    require(rc == 0, "training ", run.label, " failed (exit status ", rc, "); its log is above, its files in '",
            run_dir.string(), "'; rerun the same command to resume");
    if (!fs::exists(results::train_result_path(run_dir.string()))) return false;  // stopped; resumable
    record_run(o, run, run_dir, comm, status);
    progress.trained(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return true;
}

// Waits until every run of the first `seeds` seeds has its result (the other workers' too). False
// when stopped by a signal first.
bool wait_for_look(const ExperimentOptions& o, const ExperimentPlan& plan, int seeds, StatusLine& status) {
  bool said = false;
  for (;;) {
    std::size_t missing = 0;
    for (const PlannedRun& r : plan.runs) missing += r.seed_index < seeds && !fs::exists(r.result_path) ? 1 : 0;
    if (missing == 0) return true;
    if (o.stop != nullptr && o.stop->load()) return false;
    if (!said) status.message(concat("waiting for ", counted(missing, "run"), " of the other workers before the look at ", seeds, " seeds"));
    said = true;
    std::this_thread::sleep_for(std::chrono::seconds(2));
  }
}

// The sequential rule after a look, said on the status line; true when it stops the experiment.
bool sequential_stop(const ExperimentOptions& o, int seeds, StatusLine& status) {
  const std::optional<results::SequentialSummary> seq = compute_summary(o.out_dir).sequential;
  if (!seq || seq->look < 0) return false;
  const results::SequentialLook& l = seq->looks[static_cast<std::size_t>(seq->look)];
  if (l.n > seeds) return false;  // resumed: the runs of this look are done, a later look's may not be
  status.message(concat("sequential seeds: look at ", l.n, " seeds: ", seq->design.primary, " ΔNLL ",
                        format_signed(l.mean, 4), ", repeated ", format_number(100 * (1 - seq->design.alpha), 0), "% CI [",
                        format_signed(l.ci_low, 4), ", ", format_signed(l.ci_high, 4), "]: ", seq->outcome,
                        seq->outcome == "continuing" ? concat(", next look at ", seq->next_seeds, " seeds") : ""));
  return sequential_decided_at(*seq, seeds);
}

}  // namespace

bool sequential_decided_at(const results::SequentialSummary& summary, int seeds) {
  if (summary.look < 0 || summary.outcome == "continuing") return false;
  return summary.looks.at(static_cast<std::size_t>(summary.look)).n <= seeds;
}

int train_child(const TrainConfig& config, const std::string& data_dir, const std::string& dir, const std::string& label,
                const std::atomic<bool>* stop, int threads, const std::string& device) {
  fs::create_directories(dir);
  const std::string config_path = (fs::path(dir) / "run.toml").string();
  write_text_atomically(config_path, to_toml(config));
  const bool resume = !list_checkpoints(dir).empty();
  return train_in_child(config_path, data_dir, dir, resume, label, stop, threads, device);
}

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
  require(o.workers >= 1 && o.worker >= 0 && o.worker < o.workers, "--worker K/N needs 0 <= K < N");
  const ExperimentPlan plan = make_plan(o);
  // Held until this worker's share is done (experiment/directory.hpp).
  const OutputDirectory out(o.out_dir, experiment_directory_kind(o.worker, o.workers));
  StatusLine status(o.progress);
  settle_spec(o, plan, comm, status);

  // Without sequential seeds there is one look, at every seed.
  const std::vector<int> looks = plan.spec.sequential ? plan.spec.sequential->looks
                                                      : std::vector<int>{static_cast<int>(o.seeds.size())};
  Progress progress(plan.runs);
  bool stopped_by_rule = false, interrupted = false;
  for (const int seeds : looks) {
    if (!run_share(o, plan, seeds, child_threads, device, comm, progress, status) ||
        (plan.spec.sequential && !wait_for_look(o, plan, seeds, status))) {
      interrupted = true;
      break;
    }
    if (plan.spec.sequential && sequential_stop(o, seeds, status)) {
      stopped_by_rule = true;
      break;
    }
  }
  comm.wait_for_all();  // every rank's share is done (or stopped)
  if (interrupted) return false;
  return stopped_by_rule ||
         std::all_of(plan.runs.begin(), plan.runs.end(), [](const PlannedRun& r) { return fs::exists(r.result_path); });
}

std::string dry_run(const ExperimentOptions& o, double planned_tokens_per_core_second) {
  const bool prepared = fs::exists(fs::path(o.data_dir) / "manifest.json");
  const ExperimentPlan plan = make_plan(o, prepared);
  // The same checks of the recorded state as the real command: a different experiment is refused.
  const RecordedState state = prepared ? recorded_state(o, plan) : RecordedState{};
  // The sequential decision the recorded runs have reached, as the real command would take it.
  std::optional<results::SequentialSummary> seq;
  if (state.recorded && plan.spec.sequential) seq = compute_summary(o.out_dir).sequential;
  int train_below = static_cast<int>(o.seeds.size());  // seeds whose runs the next invocation trains
  std::string stop;
  if (plan.spec.sequential) {
    const std::vector<int>& looks = plan.spec.sequential->looks;
    train_below = looks.front();
    if (seq && seq->look >= 0) {
      const int n = seq->looks[static_cast<std::size_t>(seq->look)].n;
      if (seq->outcome == "continuing") {
        train_below = seq->next_seeds;
      } else {
        train_below = n;
        stop = concat("the study stopped ", seq->outcome, " at the look at ", n, " seeds");
      }
    }
  }
  // Throughput: measured by the finished runs here (tokens per core-second), else the plan's.
  std::vector<double> measured;
  for (const PlannedRun& r : plan.runs)
    if (fs::exists(r.result_path)) {
      const results::RunResult rr = results::read_run_result(r.result_path);
      if (rr.tokens_per_sec > 0)
        measured.push_back(results::tokens_per_core_second(rr.tokens_per_sec, rr.step_time_ms, rr.cpu_seconds_per_step,
                                                           r.config.threads > 0 ? r.config.threads : 1));
    }
  std::sort(measured.begin(), measured.end());
  const double tps = !measured.empty() ? measured[measured.size() / 2] : planned_tokens_per_core_second;
  const std::string tps_source =
      !measured.empty() ? concat("measured by ", measured.size(), " finished runs here (median)")
      : planned_tokens_per_core_second > 0 ? std::string("planned: the protocol's planned_tokens_per_core_second")
                                           : std::string();
  std::string out;
  std::size_t done = 0, to_train = 0, later = 0, not_needed = 0;
  std::int64_t tokens_left = 0;
  double core_seconds = 0;
  for (const PlannedRun& r : plan.runs) {
    const bool finished = fs::exists(r.result_path);
    const std::int64_t tokens = r.config.total_steps() * r.config.tokens_per_step();
    std::string what;
    if (finished) {
      what = "done";
      ++done;
    } else if (r.seed_index >= train_below) {
      what = stop.empty() ? "a later look (if the study continues)" : "not needed (" + stop + ")";
      (stop.empty() ? later : not_needed) += 1;
    } else {
      what = "to train";
      ++to_train;
      tokens_left += tokens;
      core_seconds += double(tokens) * (1 + evaluation_overhead(r.config)) / std::max(tps, 1e-9);
    }
    std::string label = r.label, count = std::to_string(tokens);
    label.resize(std::max<std::size_t>(label.size(), 40), ' ');
    count.insert(0, count.size() < 12 ? 12 - count.size() : 0, ' ');
    out += concat(label, " ", count, " tokens  ", what, "\n");
  }
  out += concat(plan.runs.size(), " runs in '", o.out_dir, "': ", done, " done, ", to_train, " to train (",
                format_count(tokens_left), " tokens)");
  if (later > 0) out += concat(", ", later, " in later looks if the study continues");
  if (not_needed > 0) out += concat(", ", not_needed, " not needed: ", stop);
  out += "\n";
  if (!prepared)
    out += concat("the data '", o.data_dir, "' is not prepared yet: the runs are costed from the protocol; the real "
                  "command prepares it first ([experiment.prepare])\n");
  else if (state.recorded && !state.added.empty())
    out += concat("the experiment grows: ", state.added, "\n");
  if (to_train > 0) {
    if (tps > 0)
      out += concat("cost: about ", format_number(core_seconds / 3600.0, 2), " core-hours (", tps_source, ": ",
                    format_count(std::llround(tps)), " tokens per core-second, evaluations included): about ",
                    duration_text(core_seconds / std::max(1, o.workers)), " with ", std::max(1, o.workers),
                    o.workers > 1 ? " workers" : " worker (--worker K/N runs N side by side)", "\n");
    else
      out += "cost: unknown until a run finishes here (or the protocol gives planned_tokens_per_core_second, as "
             "`attnres plan` writes it)\n";
  }
  return out;
}

}  // namespace attnres::experiment
