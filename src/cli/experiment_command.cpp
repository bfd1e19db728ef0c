// `attnres experiment`: the paired multi-seed comparison, then its summary.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "cli/commands.hpp"
#include "experiment/plan.hpp"
#include "experiment/protocol.hpp"
#include "experiment/runner.hpp"
#include "analysis/summary.hpp"
#include "analysis/tables.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace attnres::cli {

namespace {

struct ExperimentArgs {
  std::string preset, config, data, out, arms = "block,rd", seeds = "1,2,3", worker;
  std::vector<std::string> settings;
  TrainKeyFlags key_flags;
  std::string device = "cpu";
  std::string protocol;
  double effect = 0;  // 0: none (or the protocol's)
  bool dry_run = false;
};

}  // namespace

void register_experiment_command(CLI::App& app) {
  auto a = std::make_shared<ExperimentArgs>();
  auto* cmd = app.add_subcommand(
      "experiment",
      "Train every arm with every seed (same seed: same initial shared weights and data order),\n"
      "evaluate at the milestones, compute paired statistics against the first arm, routing\n"
      "diagnostics and systems numbers. Resumable: rerun the same command; finished runs are skipped.");
  auto* protocol = cmd->add_option("--protocol", a->protocol,
                                   "a protocol file fixing data, model, training, seeds, main arms, controls and "
                                   "probes (studies/*.toml; docs/experiments.md); replaces the options below");
  add_config_options(cmd, a->preset, a->config, a->settings);
  auto* arms = cmd->add_option("--arms", a->arms, "comma-separated: " + arm_names_text() +
                                                  "; the first is the baseline (default block,rd)");
  auto* seeds = cmd->add_option("--seeds", a->seeds, "comma-separated seeds (default 1,2,3)");
  add_train_key_flags(cmd, a->key_flags);
  auto* tokens = a->key_flags.tokens_option;
  auto* data = cmd->add_option("--data", a->data, "prepared data directory (required without --protocol)");
  for (auto* opt : {arms, seeds, tokens, data}) opt->excludes(protocol);
  for (const char* name : {"--preset", "--config", "--set"}) cmd->get_option(name)->excludes(protocol);
  cmd->add_option("--out", a->out, "experiment directory (with --protocol, default runs/<its name>)");
  cmd->add_option("--effect", a->effect,
                  "also give the seeds needed to detect this |ΔNLL| (nats) with 80% power in the summary")
      ->check(CLI::Range(1e-6, 10.0));
  add_device_option(cmd, a->device);
  cmd->add_option("--worker", a->worker, "K/N: this process runs every N-th run starting at K (0-based)");
  cmd->add_flag("--dry-run", a->dry_run,
                "list the runs (label, tokens, done or to train) and their count, check the design and the data, "
                "and stop: nothing is trained or written");
  cmd->footer("Over MPI: 'mpirun -np K attnres experiment ...' runs every K-th run on each rank (no --worker);\n"
              "rank 0 prints the summary once all runs are done. See docs/distributed.md.");
  cmd->callback([a] { run_as_job([&](dist::Communicator& comm) {
    experiment::ExperimentOptions o;
    analysis::SummaryOptions summary_options;
    double planned_tokens_per_core_second = 0;
    if (!a->protocol.empty()) {
      const experiment::ProtocolFile p = experiment::read_protocol(a->protocol);
      o = p.options;
      planned_tokens_per_core_second = p.planned_tokens_per_core_second;
      // A dry run of data not prepared yet is costed with the vocabulary the protocol prepares.
      if (p.prepare && o.base.model.vocab_size == 0) o.base.model.vocab_size = p.prepare->vocab_size;
      summary_options.effect = p.effect;
      if (a->out.empty()) a->out = "runs/" + o.name;
      if (comm.is_root() && !a->dry_run) experiment::prepare_protocol_data(p, true);
      comm.barrier();
    } else {
      require(!a->data.empty(), "--data is required (or give --protocol FILE)");
      require(!a->out.empty(), "--out is required");
      // Every run sets these itself (its arm and seed): given by --set or in the --config file, they
      // would be silently overridden.
      const auto per_run = [](const std::string& key) {
        const auto& keys = experiment::per_run_keys();
        return std::find(keys.begin(), keys.end(), key) != keys.end();
      };
      for (const std::string& setting : a->settings) {
        std::string key = setting.substr(0, setting.find('='));
        std::erase_if(key, [](char c) { return c == ' ' || c == '\t'; });
        require(!per_run(key), "--set ", setting, ": every run of an experiment sets ", key,
                " itself from its arm and seed; choose them with --arms and --seeds");
      }
      if (!a->config.empty())
        for (const KeyLocation& k : toml_file_keys(a->config))
          require(!per_run(k.key), k.where, ": ", k.key, " is set by every run of an experiment itself from its arm and "
                  "seed, so the value in '", a->config, "' would be ignored; remove it and choose with --arms and --seeds");
      o.base = load_train_config(a->preset, a->config, with_train_key_flags(a->settings, a->key_flags));
      o.preset = a->preset.empty() ? a->config : a->preset;
      o.arms = split_list(a->arms, "--arms");
      for (const auto& s : split_list(a->seeds, "--seeds")) {
        // Digits only: std::stoull would take "-1" as 2^64 - 1.
        const bool digits = !s.empty() && s.size() <= 18 &&
                            std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
        require(digits, "--seeds: '", s, "' is not a non-negative integer (below 10^18)");
        o.seeds.push_back(std::stoull(s));
      }
      o.data_dir = a->data;
    }
    // Paired statistics need a baseline and something to compare with it.
    require(o.arms.size() >= 2, a->protocol.empty() ? "--arms '" + a->arms + "'" : a->protocol + ": [experiment] arms",
            o.arms.empty() ? std::string(" names no arm") : concat(" names one arm, '", o.arms.front(), "'"),
            ": an experiment compares arms with its baseline (the first), so it needs the baseline and at least one "
            "other arm, e.g. --arms block,rd; to train one model, use 'attnres train'");
    if (a->effect != 0) summary_options.effect = a->effect;
    o.comm = &comm;
    o.device = a->device;
    parse_worker(a->worker, o.worker, o.workers);
    o.out_dir = a->out;
    if (a->dry_run) {
      if (!comm.is_root()) return;
      std::printf("%s", experiment::dry_run(o, planned_tokens_per_core_second).c_str());
      return;
    }
    o.stop = install_stop_handlers();
    const bool complete = experiment::run_experiment(o);
    if (!comm.is_root()) return;
    if (!complete) {
      std::printf("experiment '%s' is not complete yet (stopped, or other workers still running); rerun to continue\n",
                  a->out.c_str());
      if (stop_signal() != 0) throw Interrupted{stop_signal()};
      return;
    }
    const analysis::ExperimentSummary summary = analysis::summarize(a->out, summary_options);
    std::printf("%s\n", analysis::format_summary_table(summary).c_str());
    std::printf("summary: %s/summary.json\nreport:  attnres report --experiment %s\n", a->out.c_str(),
                shell_quote(a->out).c_str());
  }); });
}

}  // namespace attnres::cli
