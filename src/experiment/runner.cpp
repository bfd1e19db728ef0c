#include "experiment/runner.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string_view>
#include <nlohmann/json.hpp>

#include "data/loader.hpp"
#include "experiment/routing.hpp"
#include "results/experiment_spec.hpp"
#include "results/run_result.hpp"
#include "results/train_result.hpp"
#include "train/checkpoint.hpp"
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
  static const std::vector<std::string> names = {"prenorm",   "full",       "block",     "rd",
                                                 "rd-tied",   "rd-average", "rd-frozen", "denseformer",
                                                 "denseformer-4x5", "hc", "hc-static", "mhc", "mudd",
                                                 "mudd-static", "mudd-r"};
  return names;
}

ModelConfig apply_arm(ModelConfig m, const std::string& arm) {
  // "+vres" on any arm adds ResFormer's value residual (with the config's vres_* settings).
  constexpr std::string_view kVres = "+vres";
  std::string base = arm;
  if (base.size() > kVres.size() && base.ends_with(kVres)) {
    base.resize(base.size() - kVres.size());
    m.value_residual = true;
  }
  if (base == "prenorm") m.residual = ResidualMode::prenorm;
  else if (base == "full") m.residual = ResidualMode::full;
  else if (base == "block") m.residual = ResidualMode::block;
  else if (base == "rd") m.residual = ResidualMode::rd, m.value_route = ValueRoute::decoupled;
  else if (base == "rd-tied") m.residual = ResidualMode::rd, m.value_route = ValueRoute::tied;
  else if (base == "rd-average") m.residual = ResidualMode::rd, m.value_route = ValueRoute::average;
  else if (base == "rd-frozen") m.residual = ResidualMode::rd, m.value_route = ValueRoute::frozen;
  else if (base == "denseformer") m.residual = ResidualMode::denseformer, m.dwa_dilation = 1, m.dwa_period = 1;
  else if (base == "denseformer-4x5") m.residual = ResidualMode::denseformer, m.dwa_dilation = 4, m.dwa_period = 5;
  else if (base == "hc") m.residual = ResidualMode::hc, m.hc_dynamic = true;  // hc_n etc. from the config
  else if (base == "hc-static") m.residual = ResidualMode::hc, m.hc_dynamic = false;
  else if (base == "mhc") m.residual = ResidualMode::mhc;
  else if (base == "mudd") m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = true;
  else if (base == "mudd-static") m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::qkvr, m.mudd_dynamic = false;
  else if (base == "mudd-r") m.residual = ResidualMode::mudd, m.mudd_ways = MuddWays::r, m.mudd_dynamic = true;
  else {
    std::vector<std::string> names = arm_names();
    for (const auto& n : arm_names()) names.push_back(n + std::string(kVres));
    fail("unknown arm '", arm, "' (expected ", arm_names_text(), ")", did_you_mean(arm, names));
  }
  return m;
}

std::string arm_names_text() {
  std::string list;
  for (const auto& n : arm_names()) list += (list.empty() ? "" : ", ") + n;
  return list + "; each optionally with the suffix +vres (value_residual)";
}

namespace {

// Trains one run in a child process, so its speed and peak memory are its own.
// Returns the child's exit status (0: finished; 128 + N: stopped by signal N, resumable).
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
  json_differences(a, b, "", out);
  return out;
}

// Validates arm names and repeats.
void check_arms(const ModelConfig& model, const std::vector<std::string>& arms, const std::string& what) {
  require(!arms.empty(), what, " must name at least one arm");
  for (std::size_t i = 0; i < arms.size(); ++i) {
    apply_arm(model, arms[i]);  // validates the name
    for (std::size_t k = 0; k < i; ++k) require(arms[i] != arms[k], what, ": arm '", arms[i], "' is listed twice");
  }
}

std::vector<std::int64_t> milestone_tokens(const TrainConfig& c) {
  std::vector<std::int64_t> out;
  for (auto s : c.milestone_steps()) out.push_back(s * c.tokens_per_step());
  return out;
}

// A group's configuration: the main one with the group's settings and budget.
TrainConfig group_config(const TrainConfig& base, const GroupOptions& g) {
  TrainConfig c = base;
  for (const auto& setting : g.settings) apply_setting(c, setting, concat("group '", g.name, "': ", setting));
  if (g.tokens > 0) c.tokens = g.tokens;
  c.validate();
  return c;
}

// What identifies a prepared dataset whatever its path: the tokenizer's content hash and the
// token count of every split.
nlohmann::json dataset_identity(const std::string& dir) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* split : {"train", "val", "test"}) {
    const data::TokenDataset d = data::TokenDataset::open(dir, split, {false, nullptr});
    if (j.empty()) j["tokenizer_hash"] = d.tokenizer_hash();
    j[std::string(split) + "_tokens"] = d.num_tokens();
  }
  return j;
}

}  // namespace

TrainConfig run_config(const TrainConfig& base, const GroupOptions* group, const std::string& arm, std::uint64_t seed) {
  TrainConfig config = group != nullptr ? group_config(base, *group) : base;
  config.model = apply_arm(config.model, arm);
  config.seed = seed;       // identical shared initial weights across arms
  config.data_seed = seed;  // identical data order across arms
  return config;
}

const std::vector<std::string>& per_run_keys() {
  // (model.value_residual is not among them: "+vres" turns it on, but no arm turns it off.)
  static const std::vector<std::string> keys = {"model.residual", "model.value_route", "model.dwa_dilation",
                                                "model.dwa_period", "train.seed",        "train.data_seed"};
  return keys;
}

bool same_run_prefix(const TrainConfig& main, const TrainConfig& group) {
  // Evaluations and checkpoints do not change a run, so milestones, checkpoint_every and
  // keep_checkpoints may differ.
  TrainConfig same = group;
  same.tokens = main.tokens;
  same.milestones = main.milestones;
  same.checkpoint_every = main.checkpoint_every;
  same.keep_checkpoints = main.keep_checkpoints;
  if (to_toml(same) != to_toml(main) || group.total_steps() > main.total_steps()) return false;
  const LrSchedule a = main.schedule(), b = group.schedule();
  for (std::int64_t step = 0; step < group.total_steps(); ++step)
    if (a.at(step) != b.at(step)) return false;
  const std::vector<std::int64_t> ms = main.milestone_steps();
  return std::find(ms.begin(), ms.end(), group.total_steps()) != ms.end();
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
  require(!o.arms.empty(), "--arms must name at least one arm");
  require(!o.seeds.empty(), "--seeds must name at least one seed");
  require(o.workers >= 1 && o.worker >= 0 && o.worker < o.workers, "--worker K/N needs 0 <= K < N");
  check_arms(o.base.model, o.arms, "the main arms");
  for (std::size_t i = 0; i < o.seeds.size(); ++i)
    for (std::size_t k = 0; k < i; ++k) require(o.seeds[i] != o.seeds[k], "seed ", o.seeds[i], " is listed twice");
  const TrainConfig base = resolve_vocab(o.base, o.data_dir);
  base.validate();

  // experiment.json fixes the protocol; a resumed experiment must ask for the same one.
  results::ExperimentSpec spec;
  spec.arms = o.arms;
  spec.baseline = o.arms.front();
  for (std::uint64_t seed : o.seeds) spec.seeds.push_back(static_cast<std::int64_t>(seed));
  spec.tokens = base.total_steps() * base.tokens_per_step();
  spec.milestones = milestone_tokens(base);
  spec.preset = o.preset;
  spec.model = nlohmann::json(apply_arm(base.model, o.arms.front()));
  spec.train = {{"config_toml", to_toml(base)}};
  if (o.name.empty()) {
    spec.data = fs::absolute(o.data_dir).string();
  } else {
    // From a protocol file: nothing machine-specific, so the study resumes anywhere with the same data.
    spec.version = 2;
    spec.name = o.name;
    spec.description = o.description;
    spec.data = o.data_dir;
    spec.dataset = dataset_identity(o.data_dir);
  }

  // Every run of the experiment in a fixed order (seed, then the main arms, then each group's),
  // so a stopped study has whole seeds, and workers share the list by index.
  struct PlannedRun {
    const GroupOptions* group;
    std::string arm;
    std::uint64_t seed;
    TrainConfig config;
    std::string result_path, label;
  };
  std::vector<TrainConfig> group_configs;
  for (const GroupOptions& g : o.groups) {
    require(o.name.size() > 0, "groups need a protocol file (experiment --protocol)");
    require(results::valid_name(g.name) && g.name != "main" &&
                std::find(o.arms.begin(), o.arms.end(), g.name) == o.arms.end(),
            "group name '", g.name, "' is not valid or is the name of a main arm");
    check_arms(o.base.model, g.arms, "group '" + g.name + "'");
    const TrainConfig gc = group_config(base, g);
    results::GroupSpec gs;
    gs.name = g.name;
    gs.kind = g.kind;
    gs.arms = g.arms;
    gs.baseline = g.arms.front();
    gs.tokens = gc.total_steps() * gc.tokens_per_step();
    gs.milestones = milestone_tokens(gc);
    gs.settings = g.settings;
    gs.model = nlohmann::json(apply_arm(gc.model, gs.baseline));
    gs.train = {{"config_toml", to_toml(gc)}};
    gs.baseline_from_main = gs.baseline == spec.baseline && same_run_prefix(base, gc);
    if (gs.baseline_from_main) {
      // Compared where the main baseline was evaluated too (at least the group's last step).
      std::erase_if(gs.milestones, [&](std::int64_t m) {
        return std::find(spec.milestones.begin(), spec.milestones.end(), m) == spec.milestones.end();
      });
    }
    spec.groups.push_back(std::move(gs));
    group_configs.push_back(gc);
  }
  // Every split a run reads (train; val for milestones and routing; test after it) holds a window:
  // checked now, not after the first run has trained.
  int longest_seq = base.seq_len;
  for (const TrainConfig& gc : group_configs) longest_seq = std::max(longest_seq, gc.seq_len);
  for (const char* split : {"train", "val", "test"})
    eval_windows(data::TokenDataset::open(o.data_dir, split, {false, nullptr}), longest_seq, 0);

  std::vector<PlannedRun> plan;
  for (std::uint64_t seed : o.seeds) {
    for (const std::string& arm : o.arms)
      plan.push_back({nullptr, arm, seed, run_config(base, nullptr, arm, seed),
                      results::run_result_path(o.out_dir, arm, static_cast<std::int64_t>(seed)),
                      concat(arm, " seed ", seed)});
    for (std::size_t g = 0; g < o.groups.size(); ++g)
      for (const std::string& arm : o.groups[g].arms) {
        if (spec.groups[g].baseline_from_main && arm == spec.groups[g].baseline) continue;
        plan.push_back({&o.groups[g], arm, seed, run_config(group_configs[g], nullptr, arm, seed),
                        results::run_result_path(o.out_dir, o.groups[g].name, arm, static_cast<std::int64_t>(seed)),
                        concat(o.groups[g].name, "/", arm, " seed ", seed)});
      }
  }

  fs::create_directories(o.out_dir);
  StatusLine status(o.progress);
  const std::string spec_path = results::experiment_spec_path(o.out_dir);
  // Rank 0 writes the spec first; the others then check theirs against it.
  if (!comm.is_root()) comm.barrier();
  if (fs::exists(spec_path)) {
    const std::vector<ConfigDifference> differences =
        experiment_differences(results::read_experiment_spec(spec_path), spec, spec_path);
    require(differences.empty(), "'", o.out_dir, "' holds a different experiment: ", spec_path, " differs in ",
            describe_differences(differences, "experiment.json", "requested"), "; choose another --out");
  } else {
    require(comm.is_root(), "'", spec_path, "' was not written by rank 0; is '", o.out_dir,
            "' on a file system every rank shares?");
    results::write_experiment_spec(spec_path, spec);
  }
  if (comm.is_root()) comm.barrier();

  // This worker's share; returns early when stopped by a signal (resumable).
  const auto run_share = [&] {
    for (std::size_t index = 0; index < plan.size(); ++index) {
      if (static_cast<int>(index % static_cast<std::size_t>(o.workers)) != o.worker) continue;
      const PlannedRun& run = plan[index];
      if (fs::exists(run.result_path)) continue;
      if (o.stop != nullptr && o.stop->load()) return;
      const fs::path run_dir = fs::path(run.result_path).parent_path();
      fs::create_directories(run_dir);
      const TrainConfig& config = run.config;
      const std::string config_path = (run_dir / "run.toml").string();
      write_text_atomically(config_path, to_toml(config));
      const bool resume = !list_checkpoints(run_dir.string()).empty();
      const int rc = train_in_child(config_path, o.data_dir, run_dir.string(), resume, run.label, child_threads, device);
      if (rc == 128 + SIGINT || rc == 128 + SIGTERM) return;  // stopped by a signal; resumable
      require(rc == 0, "training ", run.label, " failed (exit status ", rc, "); its log is above, its files in '",
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
      const std::string weights_path = (run_dir / "model.safetensors").string();
      const SafetensorsFile weights = read_safetensors(weights_path);
      model->load_weights(weights, weights_path);
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
      result.peak_rss_bytes = tr.peak_rss_bytes;
      result.curve = tr.curve;
      result.instability = tr.instability;
      // (Empty for modes without depth routing; MUDD's is made of its Q, K and V mixing weights.)
      result.routing = routing_diagnostics(*model, val, config.batch_size, config.seq_len, o.diagnostic_tokens);
      result.connections = static_connections(config.model, weights, weights_path);
      if (config.model.residual == ResidualMode::mudd)
        result.connections = mudd_connections(*model, val, config.batch_size, config.seq_len, o.diagnostic_tokens);
      if (const auto streams =
              stream_diagnostics(*model, val, config.batch_size, config.seq_len, o.diagnostic_tokens)) {
        // Static HC's connections came exactly from its weights (they are every token's).
        if (config.model.residual != ResidualMode::hc || config.model.hc_dynamic)
          result.connections = {streams->connections};
        result.amax_gain = streams->gain;
      }
      results::write_run_result(run.result_path, result);
      status.message(concat(run.label, ": done, test NLL ", test_eval.nll));
    }
  };
  run_share();
  comm.wait_for_all();  // every rank's share is done (or stopped)
  return std::all_of(plan.begin(), plan.end(), [](const PlannedRun& r) { return fs::exists(r.result_path); });
}

}  // namespace attnres::experiment
