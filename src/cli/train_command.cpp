// `attnres train`: a training run from a configuration and a prepared data directory.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "train/train_config.hpp"
#include "train/trainer.hpp"
#include "util/error.hpp"

namespace attnres::cli {

namespace {

struct TrainArgs {
  std::string preset, config, data, out;
  std::vector<std::string> settings;
  std::string label;
  TrainKeyFlags key_flags;
  bool resume = false;
  std::int64_t stop_at_step = 0;
  std::string device = "cpu";
};

}  // namespace

void register_train_command(CLI::App& app) {
  auto targs = std::make_shared<TrainArgs>();
  auto* train_cmd = app.add_subcommand(
      "train", "Train a model on a prepared data directory (see 'attnres prepare').\n"
               "Writes OUT/config.toml, metrics.jsonl, model.safetensors and checkpoint-STEP.safetensors "
               "(the newest train.keep_checkpoints of them).");
  add_config_options(train_cmd, targs->preset, targs->config, targs->settings);
  train_cmd->add_option("--data", targs->data, "prepared data directory")->required();
  train_cmd->add_option("--out", targs->out, "run directory")->required();
  train_cmd->add_flag("--resume", targs->resume, "continue the run in --out exactly where its checkpoint left it");
  train_cmd->add_option("--label", targs->label, "prefix for progress lines (used by 'attnres experiment')");
  add_device_option(train_cmd, targs->device);
  add_train_key_flags(train_cmd, targs->key_flags);
  train_cmd->add_option("--stop-at-step", targs->stop_at_step,
                        "save a checkpoint and exit after this step (e.g. to fit a job's time slot); "
                        "continue with --resume")
      ->check(at_least(1));
  train_cmd->footer(
      "Data parallel: 'mpirun -np K attnres train ...' (or srun) splits every batch over K processes;\n"
      "rank 0 writes the run directory. See docs/distributed.md.");
  train_cmd->callback([targs] { run_as_job([&](dist::Communicator& comm) {
    const TrainConfig config =
        load_train_config(targs->preset, targs->config, with_train_key_flags(targs->settings, targs->key_flags));
    TrainRunOptions options;
    options.data_dir = targs->data;
    options.out_dir = targs->out;
    options.resume = targs->resume;
    options.label = targs->label;
    options.stop = install_stop_handlers();
    options.stop_at_step = targs->stop_at_step;
    options.device = targs->device;
    options.comm = &comm;
    const TrainResult r = train(config, options);
    if (!r.finished && stop_signal() != 0) throw Interrupted{stop_signal()};
    if (!r.finished || !comm.is_root()) return;
    std::printf("finished %lld steps, %.0f tokens/s, peak memory %.1f MB%s\n", static_cast<long long>(r.steps),
                r.tokens_per_sec, double(r.peak_rss_bytes) / 1e6,
                comm.distributed() ? concat(" per rank, ", std::lround(100 * r.reduce_fraction),
                                            "% of step time in the gradient reduction").c_str()
                                   : "");
    for (const auto& m : r.milestones)
      std::printf("  val NLL %.4f at %lld tokens\n", m.val_nll, static_cast<long long>(m.tokens));
    std::printf("weights: %s\n", r.weights_path.c_str());
  }); });
}

}  // namespace attnres::cli
