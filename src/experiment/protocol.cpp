#include "experiment/protocol.hpp"

#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "data/corpus.hpp"
#include "data/prepare.hpp"
#include "data/tokenizer.hpp"
#include "data/tokenizer_train.hpp"
#include "experiment/plan.hpp"
#include "experiment/protocol_toml.hpp"
#include "model/arms.hpp"
#include "results/experiment_spec.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres::experiment {
namespace {

namespace fs = std::filesystem;

std::uint64_t seed_value(const Section& s, const toml::node& node) {
  auto v = node.value<std::int64_t>();
  if (!v || *v < 0) s.bad(node, "seeds", "must list non-negative integers");
  return static_cast<std::uint64_t>(*v);
}

GroupOptions read_group(const std::string& path, const toml::table& table, const char* kind,
                        const ExperimentOptions& main) {
  Section s(path, table, kind);
  GroupOptions g;
  g.kind = kind;
  g.name = s.string("name", kind == std::string("controls") ? "controls" : "");
  require(!g.name.empty(), where(path, table), ": every [[probe]] needs a 'name'");
  require(results::valid_name(g.name) && g.name != "main", where(path, table), ": '", g.name,
          "' is not a valid group name (it becomes a directory name)");
  const std::string baseline = s.string("baseline", main.arms.front());
  g.arms.push_back(baseline);
  for (const auto& arm : s.strings("arms"))
    if (arm != baseline) g.arms.push_back(arm);
  require(g.arms.size() >= 2, where(path, table), ": [", kind, "] '", g.name,
          "' needs 'arms' besides its baseline '", baseline, "'");
  check_arms(main.base.model, g.arms, concat(where(path, *table.get("arms")), ": [", kind, "] '", g.name, "' arms"));
  g.settings = s.strings("set");
  const toml::node* tokens = s.find("tokens");
  const toml::node* budget = s.find("budget");
  require(tokens == nullptr || budget == nullptr, where(path, table), ": [", kind, "] '", g.name,
          "' gives both 'tokens' and 'budget'; give one");
  if (tokens != nullptr) {
    g.tokens = s.integer("tokens", 0);
    if (g.tokens <= 0) s.bad(*tokens, "tokens", "must be positive");
  } else if (budget != nullptr) {
    const double f = s.number("budget", 1.0);
    if (!(f > 0 && f <= 1)) s.bad(*budget, "budget", "must be a fraction of train.tokens in (0, 1]");
    g.budget = f;
    g.tokens = static_cast<std::int64_t>(std::llround(f * double(main.base.tokens)));
  }
  if (const toml::node* n = s.find("seeds")) {  // the first N of the experiment's seeds
    g.seed_count = static_cast<int>(s.integer("seeds", 0));
    if (g.seed_count < 2) s.bad(*n, "seeds", "must be at least 2: the group runs on the experiment's first N seeds");
  }
  s.finish();
  return g;
}

// [experiment.sequential]: the looks, the error spending and the effect of interest. The arms and
// the effect are known by now (read before this table).
results::SequentialSpec read_sequential(const std::string& path, const toml::table& table, const ProtocolFile& p) {
  Section s(path, table, "experiment.sequential");
  results::SequentialSpec q;
  const toml::node& looks = s.get("looks");
  const toml::array* list = looks.as_array();
  if (list == nullptr || list->empty())
    s.bad(looks, "looks", "must be a non-empty array of increasing seed counts, e.g. [5, 8, 12, 16]");
  for (const auto& n : *list) {
    const auto v = n.value<std::int64_t>();
    if (!v || *v < 2) s.bad(n, "looks", "must list seed counts of at least 2 (a paired t-test needs two seeds)");
    if (!q.looks.empty() && *v <= q.looks.back())
      s.bad(n, "looks", concat("must increase: ", *v, " follows ", q.looks.back()));
    q.looks.push_back(static_cast<int>(*v));
  }
  q.max_seeds = q.looks.back();
  if (const toml::node* m = s.find("max_seeds")) {
    q.max_seeds = static_cast<int>(s.integer("max_seeds", 0));
    if (q.max_seeds < 2) s.bad(*m, "max_seeds", "must be at least 2");
    if (q.looks.back() > q.max_seeds)
      s.bad(looks, "looks", concat("go up to ", q.looks.back(), " seeds, beyond max_seeds = ", q.max_seeds));
    if (q.looks.back() < q.max_seeds) q.looks.push_back(q.max_seeds);  // the last look is at max_seeds
  }
  if (const toml::node* a = s.find("alpha")) {
    q.alpha = s.number("alpha", q.alpha);
    if (!(q.alpha > 0 && q.alpha < 0.5)) s.bad(*a, "alpha", "must be in (0, 0.5)");
  }
  if (const toml::node* sp = s.find("spending")) {
    q.spending = s.string("spending");
    if (q.spending != "obrien-fleming" && q.spending != "pocock")
      s.bad(*sp, "spending", concat("is '", q.spending, "'; expected \"obrien-fleming\" or \"pocock\" (Lan-DeMets)"));
  }
  if (const toml::node* e = s.find("effect")) {
    q.effect = s.number("effect", 0);
    if (!(std::isfinite(q.effect) && q.effect > 0))
      s.bad(*e, "effect", "must be a positive number of nats: the size of the effect of interest (futility stops when "
                          "the interval excludes it)");
  } else {
    require(p.effect > 0, where(path, table), ": [experiment.sequential] needs 'effect' (nats, > 0), or an [experiment] "
            "'effect': the effect of interest, for the futility stop and the planning");
    q.effect = p.effect;
  }
  const std::vector<std::string>& arms = p.options.arms;
  if (const toml::node* pr = s.find("primary")) {
    q.primary = s.string("primary");
    if (q.primary == arms.front() || std::find(arms.begin(), arms.end(), q.primary) == arms.end())
      s.bad(*pr, "primary", concat("is '", q.primary, "', which is not a compared arm of [experiment] arms"));
    if (is_twin(q.primary)) s.bad(*pr, "primary", "names a twin: the primary comparison is an arm's");
  } else {
    const auto it = std::find_if(arms.begin() + 1, arms.end(), [](const std::string& a) { return !is_twin(a); });
    require(it != arms.end(), where(path, table), ": [experiment.sequential] needs a compared arm besides the baseline");
    q.primary = *it;
  }
  s.finish();
  return q;
}

// [pilot]: the grid, the compute and the rule (PilotSpec). The effect falls back to [experiment]'s.
PilotSpec read_pilot(const std::string& path, const toml::table& table, const ProtocolFile& p) {
  Section s(path, table, "pilot");
  PilotSpec q;
  const toml::node& seeds = s.get("seeds");
  const toml::array* seed_list = seeds.as_array();
  if (seed_list == nullptr) s.bad(seeds, "seeds", "must be an array of at least 3 integers (not study seeds)");
  for (const auto& n : *seed_list) q.seeds.push_back(seed_value(s, n));
  if (q.seeds.size() < 3)
    s.bad(seeds, "seeds", concat("lists ", q.seeds.size(), " seeds; a pilot needs at least 3 (an sd of two has one degree of "
                                 "freedom, and came out 7 times too small in attnres' first pilot)"));
  const toml::node& lr = s.get("lr");
  const toml::array* lrs = lr.as_array();
  if (lrs == nullptr || lrs->empty()) s.bad(lr, "lr", "must be a non-empty array of learning rates");
  for (const auto& n : *lrs) {
    const auto v = n.value<double>();
    if (!v || !(*v > 0 && *v < 1)) s.bad(n, "lr", "must list learning rates in (0, 1)");
    q.lrs.push_back(*v);
  }
  if (const toml::node* shapes = s.find("shapes")) {
    const toml::array* list = shapes->as_array();
    if (list == nullptr) s.bad(*shapes, "shapes", "must be an array of arrays of settings, e.g. [[\"model.d_model=96\"]]");
    for (const auto& shape : *list) {
      const toml::array* settings = shape.as_array();
      if (settings == nullptr) s.bad(shape, "shapes", "must list arrays of settings (\"model.key=value\" strings)");
      std::vector<std::string> out;
      for (const auto& setting : *settings) {
        const auto v = setting.value<std::string>();
        if (!v) s.bad(setting, "shapes", "must list settings as strings, e.g. \"model.n_layers=8\"");
        TrainConfig probe = p.options.base;
        apply_setting(probe, *v, where(path, setting));  // a bad key or value is named here
        out.push_back(*v);
      }
      q.shapes.push_back(std::move(out));
    }
  }
  const auto positive = [&](const char* key) {
    const toml::node& n = s.get(key);
    const double v = s.number(key, 0);
    if (!(std::isfinite(v) && v > 0)) s.bad(n, key, "must be a positive number");
    return v;
  };
  q.run_core_seconds = positive("run_core_seconds");
  q.budget_core_hours = positive("budget_core_hours");
  q.pilot_core_hours = positive("pilot_core_hours");
  if (const toml::node* e = s.find("effect")) {
    q.effect = s.number("effect", 0);
    if (!(std::isfinite(q.effect) && q.effect > 0)) s.bad(*e, "effect", "must be a positive number of nats");
  } else {
    require(p.effect > 0, where(path, table), ": [pilot] needs 'effect' (nats, > 0), or an [experiment] 'effect': the "
            "effect of interest, which the rule compares the noise floor with and the seeds are sized for");
    q.effect = p.effect;
  }
  if (const toml::node* f = s.find("floor_fraction")) {
    q.floor_fraction = s.number("floor_fraction", q.floor_fraction);
    if (!(q.floor_fraction > 0 && q.floor_fraction <= 1)) s.bad(*f, "floor_fraction", "must be in (0, 1]");
  }
  if (const toml::node* n = s.find("tokens")) {
    q.tokens = s.integer("tokens", 0);
    if (q.tokens <= 0) s.bad(*n, "tokens", "must be a positive number of tokens per run");
    if (!q.shapes.empty()) s.bad(*n, "tokens", "fixes the budget of the file's model: give it without 'shapes'");
  }
  if (const toml::node* n = s.find("nll_tolerance")) {
    q.nll_tolerance = s.number("nll_tolerance", q.nll_tolerance);
    if (!(q.nll_tolerance >= 0 && std::isfinite(q.nll_tolerance))) s.bad(*n, "nll_tolerance", "must be >= 0 nats");
  }
  if (const toml::node* n = s.find("failure_rate")) {
    q.failure_rate = s.number("failure_rate", q.failure_rate);
    if (!(q.failure_rate >= 0 && q.failure_rate < 0.5)) s.bad(*n, "failure_rate", "must be in [0, 0.5)");
  }
  if (const toml::node* n = s.find("failure_nats")) {
    q.failure_nats = s.number("failure_nats", q.failure_nats);
    if (!(q.failure_nats > 0 && std::isfinite(q.failure_nats))) s.bad(*n, "failure_nats", "must be a positive number of nats");
  }
  if (const toml::node* c = s.find("sd_confidence")) {
    q.sd_confidence = s.number("sd_confidence", q.sd_confidence);
    if (!(q.sd_confidence >= 0.5 && q.sd_confidence < 1)) s.bad(*c, "sd_confidence", "must be in [0.5, 1)");
  }
  if (const toml::node* sp = s.find("spending")) {
    q.spending = s.string("spending");
    if (q.spending != "obrien-fleming" && q.spending != "pocock")
      s.bad(*sp, "spending", concat("is '", q.spending, "'; expected \"obrien-fleming\" or \"pocock\""));
  }
  if (const toml::node* m = s.find("max_seeds")) {
    q.max_seeds = static_cast<int>(s.integer("max_seeds", q.max_seeds));
    if (q.max_seeds < 3 || q.max_seeds > 1000) s.bad(*m, "max_seeds", "must be from 3 to 1000");
  }
  if (const toml::node* b = s.find("probes_at_equal_compute")) {
    const auto v = b->value<bool>();
    if (!v) s.bad(*b, "probes_at_equal_compute", "must be true or false");
    q.probes_at_equal_compute = *v;
  }
  if (const toml::node* t = s.find("throughput_steps")) {
    q.throughput_steps = static_cast<int>(s.integer("throughput_steps", q.throughput_steps));
    if (q.throughput_steps < 5) s.bad(*t, "throughput_steps", "must be at least 5");
  }
  q.out = s.string("out");
  require(!q.out.empty(), where(path, table), ": [pilot] needs 'out': the protocol file the plan writes");
  const std::vector<std::string>& arms = p.options.arms;
  require(std::find(arms.begin(), arms.end(), twin_of(arms.front())) != arms.end(), where(path, table),
          ": the study needs the baseline's twin '", twin_of(arms.front()),
          "' among [experiment] arms: its noise floor is what the pilot measures and the study reports");
  require(p.options.arms.size() >= 3, where(path, table), ": the study's arms must be the baseline, its twin and at "
          "least one compared arm (the first non-twin after the baseline is the primary comparison)");
  s.finish();
  return q;
}

}  // namespace

ProtocolFile read_protocol(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(read_text_file(path), path);
  } catch (const toml::parse_error& e) {
    fail(path, ":", e.source().begin.line, ": ", e.description());
  }
  ProtocolFile p;
  p.path = path;
  ExperimentOptions& o = p.options;

  const toml::table* ex = root.get_as<toml::table>("experiment");
  require(ex != nullptr, path, ": a protocol file needs an [experiment] table (see docs/experiments.md)");
  Section e(path, *ex, "experiment");
  o.name = e.string("name");
  require(!o.name.empty(), where(path, *ex), ": [experiment] needs a 'name'");
  o.description = e.string("description");
  o.data_dir = e.string("data");
  require(!o.data_dir.empty(), where(path, *ex), ": [experiment] needs 'data' (a prepared data directory)");
  const std::string preset_name = e.string("preset", "tiny");
  o.preset = preset_name;
  o.base = preset(preset_name);
  const toml::node* seeds = e.find("seeds");
  if (seeds != nullptr) {
    const toml::array* seed_list = seeds->as_array();
    if (seed_list == nullptr || seed_list->empty()) e.bad(*seeds, "seeds", "must be a non-empty array of integers");
    for (const auto& s : *seed_list) o.seeds.push_back(seed_value(e, s));
  }
  o.arms = e.strings("arms");
  require(!o.arms.empty(), where(path, *ex), ": [experiment] needs 'arms' (the first is the baseline)");
  check_arms(o.base.model, o.arms, concat(where(path, *ex->get("arms")), ": [experiment] arms"));
  if (const toml::node* t = e.find("planned_tokens_per_core_second")) {
    p.planned_tokens_per_core_second = e.number("planned_tokens_per_core_second", 0);
    if (!(p.planned_tokens_per_core_second > 0 && std::isfinite(p.planned_tokens_per_core_second)))
      e.bad(*t, "planned_tokens_per_core_second", "must be a positive number (what `attnres plan` measured)");
  }
  if (const toml::node* effect = e.find("effect")) {
    p.effect = e.number("effect", 0);
    if (!(std::isfinite(p.effect) && p.effect > 0))
      e.bad(*effect, "effect", "must be a positive number of nats (the size of the effect of interest)");
  }
  if (const toml::table* noise = ex->get_as<toml::table>("noise")) {
    Section ns(path, *noise, "experiment.noise");
    if (const toml::node* n = ns.find("perturbation")) {
      o.twin_perturbation = ns.number("perturbation", 0);
      if (!(o.twin_perturbation > 0 && o.twin_perturbation <= 0.01))
        ns.bad(*n, "perturbation", "must be in (0, 0.01]: the relative size of the twins' initial-weight perturbation");
    }
    if (const toml::node* n = ns.find("seeds")) {
      o.twin_seeds = static_cast<int>(ns.integer("seeds", 0));
      if (o.twin_seeds < 2) ns.bad(*n, "seeds", "must be at least 2: the twins run on the experiment's first N seeds");
    }
    if (const toml::node* n = ns.find("margin")) {
      o.floor_margin = ns.number("margin", 0);
      if (!(std::isfinite(o.floor_margin) && o.floor_margin > 0))
        ns.bad(*n, "margin", "must be a positive number of nats: the noise-floor test's equivalence margin");
    }
    ns.finish();
  }
  if (const toml::table* failure = ex->get_as<toml::table>("failure")) {
    Section fs_(path, *failure, "experiment.failure");
    results::FailureRule f;
    if (const toml::node* n = fs_.find("clipped_fraction")) {
      f.clipped_fraction = fs_.number("clipped_fraction", f.clipped_fraction);
      if (!(f.clipped_fraction > 0 && f.clipped_fraction <= 1))
        fs_.bad(*n, "clipped_fraction", "must be in (0, 1]: the share of clipped steps above which a run failed");
    }
    if (const toml::node* n = fs_.find("stall_nats")) {
      f.stall_nats = fs_.number("stall_nats", f.stall_nats);
      if (!(std::isfinite(f.stall_nats) && f.stall_nats > 0)) fs_.bad(*n, "stall_nats", "must be a positive number of nats");
    }
    if (const toml::node* n = fs_.find("stall_steps")) {
      f.stall_steps = static_cast<int>(fs_.integer("stall_steps", f.stall_steps));
      if (f.stall_steps < 1) fs_.bad(*n, "stall_steps", "must be at least 1");
    }
    fs_.finish();
    o.failure = f;
  }
  if (const toml::table* seq = ex->get_as<toml::table>("sequential")) o.sequential = read_sequential(path, *seq, p);
  if (const toml::table* prep = ex->get_as<toml::table>("prepare")) {
    Section ps(path, *prep, "experiment.prepare");
    PrepareSpec spec;
    spec.inputs = ps.strings("input");
    require(!spec.inputs.empty(), where(path, *prep), ": [experiment.prepare] needs 'input' (files or directories)");
    spec.vocab_size = static_cast<int>(ps.integer("vocab_size", spec.vocab_size));
    spec.val_fraction = ps.number("val_fraction", spec.val_fraction);
    spec.test_fraction = ps.number("test_fraction", spec.test_fraction);
    ps.finish();
    p.prepare = spec;
  }
  e.finish({"prepare", "noise", "sequential", "failure"});
  if (o.sequential && o.seeds.empty())  // no seeds listed: 1 .. max_seeds
    for (int s = 1; s <= o.sequential->max_seeds; ++s) o.seeds.push_back(static_cast<std::uint64_t>(s));
  if (const toml::table* pilot = root.get_as<toml::table>("pilot")) {
    p.pilot = read_pilot(path, *pilot, p);
    if (o.seeds.empty()) o.seeds = p.pilot->seeds;  // the study's come from the plan
  }
  require(!o.seeds.empty(), where(path, *ex), ": [experiment] needs 'seeds' (or an [experiment.sequential] table, "
          "whose max_seeds then gives seeds 1 .. max_seeds)");
  if (o.sequential)
    require(static_cast<int>(o.seeds.size()) >= o.sequential->max_seeds, where(path, *ex), ": [experiment] 'seeds' lists ",
            o.seeds.size(), " seeds but [experiment.sequential] max_seeds is ", o.sequential->max_seeds,
            "; list at least that many (they are run in order) or leave 'seeds' out");

  for (const char* section : {"model", "train"})
    if (const toml::node* n = root.get(section)) {
      const toml::table* t = n->as_table();
      require(t != nullptr, where(path, *n), ": '", section, "' must be a table");
      apply_config_table(o.base, path, *t, section);
    }
  o.base.validate();

  for (const toml::table* t : tables_of(path, root, "controls")) o.groups.push_back(read_group(path, *t, "controls", o));
  for (const toml::table* t : tables_of(path, root, "probe")) o.groups.push_back(read_group(path, *t, "probe", o));
  for (std::size_t i = 0; i < o.groups.size(); ++i)
    for (std::size_t k = 0; k < i; ++k)
      require(o.groups[i].name != o.groups[k].name, path, ": two groups are named '", o.groups[i].name, "'");
  const std::vector<std::string> tables = {"experiment", "model", "train", "controls", "probe", "pilot"};
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    require(std::find(tables.begin(), tables.end(), k) != tables.end(), where(path, node), ": unknown table '", k,
            "'", did_you_mean(k, tables), " (expected [experiment], [model], [train], [controls], [[probe]], [pilot])");
  }
  return p;
}

void prepare_protocol_data(const ProtocolFile& protocol, bool progress) {
  const std::string& dir = protocol.options.data_dir;
  if (fs::exists(fs::path(dir) / data::kManifestName) || !protocol.prepare) return;
  const PrepareSpec& spec = *protocol.prepare;
  for (const auto& input : spec.inputs)
    require(fs::exists(input), "'", dir, "' is not a prepared data directory, and the corpus ", protocol.path,
            " prepares it from ([experiment.prepare] input) does not exist: '", input,
            "' (paths are relative to the directory attnres runs in)");
  if (progress)
    std::fprintf(stderr, "experiment: preparing '%s' as %s says (sp tokenizer of %d pieces)\n", dir.c_str(),
                 protocol.path.c_str(), spec.vocab_size);
  data::SplitFractions fractions;
  fractions.val = spec.val_fraction;
  fractions.test = spec.test_fraction;
  fractions.validate();
  std::vector<data::InputFile> inputs = data::expand_inputs(spec.inputs);
  data::begin_output_dir(dir);
  const std::string model = (fs::path(dir) / "tokenizer.model").string();
  data::SpTrainOptions train;
  train.vocab_size = spec.vocab_size;
  train.fractions = fractions;
  train.progress = progress;
  data::train_sp_tokenizer(inputs, model, train);
  const std::unique_ptr<data::Tokenizer> tokenizer = data::make_tokenizer("sp:" + model);
  data::PrepareOptions options;
  options.inputs = std::move(inputs);
  options.out_dir = dir;
  options.fractions = fractions;
  options.progress = progress;
  data::prepare_dataset(options, *tokenizer);
}

}  // namespace attnres::experiment
