#include "experiment/plan.hpp"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/dataset_identity.hpp"
#include "data/loader.hpp"
#include "model/family.hpp"
#include "results/run_result.hpp"
#include "train/evaluate.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace attnres::experiment {
namespace {

namespace fs = std::filesystem;

}  // namespace

// Validates arm names and repeats, and that a twin copies an arm of the same list.
void check_arms(const ModelConfig& model, const std::vector<std::string>& arms, const std::string& what) {
  require(!arms.empty(), what, " must name at least one arm");
  require(!is_twin(arms.front()), what, ": the baseline '", arms.front(),
          "' cannot be a twin; a twin (suffix ~) is measured against the arm it copies, e.g. arms = [\"",
          twin_original(arms.front()), "\", \"", arms.front(), "\", ...]");
  for (std::size_t i = 0; i < arms.size(); ++i) {
    require(!is_twin(arms[i]) || std::find(arms.begin(), arms.end(), twin_original(arms[i])) != arms.end(), what,
            ": '", arms[i], "' is a twin (suffix ~) of '", twin_original(arms[i]),
            "', which is not among the arms: a twin is measured against the arm it copies (its noise floor)");
    try {
      apply_arm(model, arms[i]);  // validates the name
    } catch (const Error& e) {
      fail(what, ": ", e.what());  // where the arm was given (a protocol's file:line)
    }
    for (std::size_t k = 0; k < i; ++k) require(arms[i] != arms[k], what, ": arm '", arms[i], "' is listed twice");
  }
}

namespace {

// On a GPU every arm's model must be one the CUDA backend trains: one it lacks (a mode, an option;
// its family's record says, model/family.hpp) is refused here, naming the arm, before any run starts
// rather than when its turn comes.
void check_device(const std::string& device, const ModelConfig& model, const std::vector<std::string>& arms,
                  const std::string& what) {
  if (device == "cpu") return;
  for (const std::string& arm : arms) {
    const std::string lacking = cuda_refusal(apply_arm(model, arm));
    require(lacking.empty(), what, ": arm '", arm, "' cannot train on --device ", device, ": ", lacking,
            " has no CUDA implementation; use --device cpu");
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

}  // namespace

TrainConfig run_config(const TrainConfig& base, const GroupOptions* group, const std::string& arm, std::uint64_t seed,
                       double twin_perturbation) {
  TrainConfig config = group != nullptr ? group_config(base, *group) : base;
  config.model = apply_arm(config.model, arm);
  config.seed = seed;       // identical shared initial weights across arms
  config.data_seed = seed;  // identical data order across arms
  config.init_perturbation = is_twin(arm) ? twin_perturbation : 0.0;
  if (is_bf16_arm(arm)) config.precision = kernels::MatmulPrecision::bf16;
  return config;
}

const std::vector<std::string>& per_run_keys() {
  // (model.value_residual is not among them: "+vres" turns it on, but no arm turns it off.)
  static const std::vector<std::string> keys = {"model.residual",   "model.value_route", "model.dwa_dilation",
                                                "model.dwa_period", "train.seed",        "train.data_seed",
                                                "train.init_perturbation"};
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

double evaluation_overhead(const TrainConfig& c) {
  const double evaluated = double(c.eval_tokens) * double(c.milestone_steps().size() + 1);
  return evaluated / (3.0 * double(c.total_steps() * c.tokens_per_step()));
}

ExperimentPlan make_plan(const ExperimentOptions& o, bool data_prepared) {
  require(!o.arms.empty(), "--arms must name at least one arm");
  require(!o.seeds.empty(), "--seeds must name at least one seed");
  check_arms(o.base.model, o.arms, "the main arms");
  check_device(o.device, o.base.model, o.arms, "the main arms");
  for (std::size_t i = 0; i < o.seeds.size(); ++i)
    for (std::size_t k = 0; k < i; ++k) require(o.seeds[i] != o.seeds[k], "seed ", o.seeds[i], " is listed twice");
  ExperimentPlan plan;
  if (data_prepared) {
    plan.base = resolve_vocab(o.base, o.data_dir);
  } else {
    require(o.base.model.vocab_size > 0, "the data '", o.data_dir, "' is not prepared and no vocabulary size is "
            "known (model.vocab_size, or [experiment.prepare] vocab_size)");
    plan.base = o.base;
  }
  const TrainConfig& base = plan.base;
  base.validate();

  // experiment.json fixes the protocol; a resumed experiment must ask for the same one.
  results::ExperimentSpec& spec = plan.spec;
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
    if (data_prepared) spec.dataset = data::dataset_identity(o.data_dir);
  }

  std::vector<TrainConfig> group_configs;
  for (const GroupOptions& g : o.groups) {
    require(o.name.size() > 0, "groups need a protocol file (experiment --protocol)");
    require(results::valid_name(g.name) && g.name != "main" &&
                std::find(o.arms.begin(), o.arms.end(), g.name) == o.arms.end(),
            "group name '", g.name, "' is not valid or is the name of a main arm");
    check_arms(o.base.model, g.arms, "group '" + g.name + "'");
    const TrainConfig gc = group_config(base, g);
    check_device(o.device, gc.model, g.arms, "group '" + g.name + "'");
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
    require(g.seed_count == 0 || g.seed_count >= 2, "group '", g.name, "': seeds = ", g.seed_count,
            " (the first seeds it runs on) must be at least 2");
    gs.seed_count = g.seed_count;
    // A group whose baseline is a main arm trained the same way up to the group's budget reads
    // that arm's main runs instead of training them again.
    gs.baseline_from_main = std::find(o.arms.begin(), o.arms.end(), gs.baseline) != o.arms.end() &&
                            same_run_prefix(base, gc);
    if (gs.baseline_from_main) {
      // Compared where the main baseline was evaluated too (at least the group's last step).
      std::erase_if(gs.milestones, [&](std::int64_t m) {
        return std::find(spec.milestones.begin(), spec.milestones.end(), m) == spec.milestones.end();
      });
    }
    spec.groups.push_back(std::move(gs));
    group_configs.push_back(gc);
  }
  const auto has_twin = [](const std::vector<std::string>& arms) { return std::any_of(arms.begin(), arms.end(), is_twin); };
  bool twins = has_twin(o.arms);
  for (const GroupOptions& g : o.groups) twins = twins || has_twin(g.arms);
  if (twins) spec.twin_perturbation = o.twin_perturbation;
  require(o.twin_seeds == 0 || o.twin_seeds >= 2, "[experiment.noise] seeds = ", o.twin_seeds, " must be at least 2");
  spec.twin_seeds = has_twin(o.arms) ? o.twin_seeds : 0;
  spec.floor_margin = o.floor_margin;
  if (o.failure) {
    require(!o.name.empty(), "a failure rule needs a protocol file (experiment --protocol)");
    spec.failure = o.failure;
  }
  if (o.sequential) {
    require(!o.name.empty(), "sequential seeds need a protocol file (experiment --protocol)");
    require(static_cast<int>(o.seeds.size()) >= o.sequential->max_seeds, "sequential seeds: max_seeds is ",
            o.sequential->max_seeds, " but only ", o.seeds.size(), " seeds are listed");
    spec.sequential = o.sequential;
  }
  // Every split a run reads (train; val for milestones and routing; test after it) holds a window:
  // checked now, not after the first run has trained.
  int longest_seq = base.seq_len;
  for (const TrainConfig& gc : group_configs) longest_seq = std::max(longest_seq, gc.seq_len);
  if (data_prepared)
    for (const char* split : {"train", "val", "test"})
      eval_windows(data::TokenDataset::open(o.data_dir, split, {false, nullptr}), longest_seq, 0);

  // Every run of the experiment in a fixed order (seed, then the main arms, then each group's),
  // so a stopped study has whole seeds, and workers share the list by index.
  for (std::size_t i = 0; i < o.seeds.size(); ++i) {
    const std::uint64_t seed = o.seeds[i];
    const int index = static_cast<int>(i);
    const auto runs_seed = [&](const std::string& group, const std::string& arm) {
      const std::vector<std::int64_t> seeds = spec.seeds_of(group, arm);
      return std::find(seeds.begin(), seeds.end(), static_cast<std::int64_t>(seed)) != seeds.end();
    };
    for (const std::string& arm : o.arms)
      if (runs_seed("", arm))
        plan.runs.push_back({"", arm, seed, index, run_config(base, nullptr, arm, seed, o.twin_perturbation),
                           results::run_result_path(o.out_dir, arm, static_cast<std::int64_t>(seed)),
                           concat(arm, " seed ", seed)});
    for (std::size_t g = 0; g < o.groups.size(); ++g)
      for (const std::string& arm : o.groups[g].arms) {
        if (spec.groups[g].baseline_from_main && arm == spec.groups[g].baseline) continue;
        if (!runs_seed(o.groups[g].name, arm)) continue;
        plan.runs.push_back({o.groups[g].name, arm, seed, index,
                             run_config(group_configs[g], nullptr, arm, seed, o.twin_perturbation),
                             results::run_result_path(o.out_dir, o.groups[g].name, arm, static_cast<std::int64_t>(seed)),
                             concat(o.groups[g].name, "/", arm, " seed ", seed)});
      }
  }
  return plan;
}

}  // namespace attnres::experiment
