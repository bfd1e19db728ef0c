// train(): a run from start (or resume) to its result, on top of the run's files
// (train/checkpoint.hpp), the step (train/train_step.hpp), the log (train/train_log.hpp), the
// result file's schema (results/train_result.hpp), the instability rule (results/instability.hpp)
// and the provenance (results/provenance.hpp).
#include "train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "data/dataset_identity.hpp"
#include "data/loader.hpp"
#include "results/instability.hpp"
#include "results/provenance.hpp"
#include "results/train_result.hpp"
#include "train/backend.hpp"
#include "train/checkpoint.hpp"
#include "train/evaluate.hpp"
#include "train/train_log.hpp"
#include "train/train_step.hpp"
#include "util/atomic_file.hpp"
#include "util/dir_lock.hpp"
#include "util/error.hpp"
#include "util/memory.hpp"
#include "util/threads.hpp"

namespace attnres {

TrainConfig resolve_vocab(TrainConfig config, const std::string& data_dir) {
  const data::TokenDataset train = data::TokenDataset::open(data_dir, "train", {false, nullptr});
  if (config.model.vocab_size == 0) config.model.vocab_size = train.vocab_size();
  require(config.model.vocab_size >= train.vocab_size(), "model.vocab_size (", config.model.vocab_size,
          ") is smaller than the vocabulary of the data in '", data_dir, "' (", train.vocab_size(), ")");
  return config;
}

namespace {

// The validation milestones still ahead of a run (TrainConfig::milestone_steps).
class Milestones {
 public:
  Milestones(std::vector<std::int64_t> steps, std::int64_t done) : steps_(std::move(steps)) {
    while (next_ < steps_.size() && steps_[next_] <= done) ++next_;
  }
  // True once per milestone, when `step` steps are done.
  bool reached(std::int64_t step) {
    if (next_ >= steps_.size() || step != steps_[next_]) return false;
    ++next_;
    return true;
  }

 private:
  std::vector<std::int64_t> steps_;
  std::size_t next_ = 0;
};

// Training speed over the steps run in this process (not evaluations and checkpoints).
struct Speed {
  std::int64_t steps = 0;
  double seconds = 0;
  double reduce_seconds = 0;  // of which in the gradient reduction across ranks
  double cpu_seconds = 0;     // this process's CPU time over them
  void add(const StepOutcome& s) {
    ++steps;
    seconds += s.seconds;
    cpu_seconds += s.cpu_seconds;
    reduce_seconds += s.reduce_seconds;
  }
};

void run_start_messages(TrainLog& log, const TrainConfig& config, const Geometry& geo, const TrainBackend& backend,
                        const dist::Communicator& comm) {
  log.message(concat("model ", config.model.residual_label(), ", ", backend.layout().total(), " parameters; ",
                     config.total_steps(), " steps of ", config.tokens_per_step(), " tokens"));
  log.message(concat(comm.world(), comm.world() == 1 ? " process" : " processes", ", ", geo.micro_batches,
                     geo.micro_batches == 1 ? " micro-batch" : " micro-batches", " of ", geo.micro_batch,
                     " sequences per step; ", backend.describe(), comm.distributed() ? " per process" : ""));
}

// finished: the run reached its last step (otherwise it stopped early and is resumable).
TrainResult make_result(bool finished, const TrainState& state, const Speed& speed, const ParamLayout& layout,
                        const RunFiles& files, const TrainConfig& config, const Geometry& geo,
                        const dist::Communicator& comm) {
  TrainResult r;
  r.finished = finished;
  r.params = layout.total();
  r.steps = state.step;
  r.weights_path = files.weights;
  if (!r.finished) return r;
  for (const auto& m : state.milestones) r.milestones.push_back({m.step, m.tokens, m.val_nll});
  r.curve = state.curve;
  r.instability = results::compute_instability(r.curve, config.grad_clip);
  const double elapsed = speed.seconds;
  r.tokens_per_sec = speed.steps > 0 ? double(speed.steps * config.tokens_per_step()) / elapsed : 0;
  r.step_time_ms = speed.steps > 0 ? 1000.0 * elapsed / double(speed.steps) : 0;
  r.cpu_seconds_per_step = speed.steps > 0 ? speed.cpu_seconds / double(speed.steps) : 0;
  r.peak_rss_bytes = peak_rss_bytes();
  r.reduce_fraction = elapsed > 0 ? speed.reduce_seconds / elapsed : 0;
  r.processes = comm.world();
  r.micro_batches = geo.micro_batches;
  return r;
}

// The closing message of a run the rule calls unstable.
std::string unstable_message(const results::Instability& s) {
  return concat("unstable run: ", s.sustained_spike_events,
                s.sustained_spike_events == 1 ? " sustained loss spike" : " sustained loss spikes",
                ", the largest at step ", s.largest_spike_step.value_or(0), ", ", s.largest_spike_nats,
                " nats above the median of the ", s.spike_window, " steps before it (", results::kUnstableRule, ")");
}

// `--resume` of a run that has its train_result.json: nothing to train, nothing written.
TrainResult finished_run(const RunFiles& files, const TrainConfig& config, dist::Communicator& comm) {
  TrainResult r;
  r.finished = true;
  r.weights_path = files.weights;
  if (!comm.is_root()) return r;
  const TrainConfig recorded = parse_toml_config(read_text_file(files.config), files.config);
  const std::vector<ConfigDifference> differences = config_differences(train_config_keys(), recorded, config);
  require(differences.empty(), "'", files.dir, "' holds a finished run with a different configuration: ",
          describe_differences(differences, "run", "requested"));
  static_cast<results::TrainResult&>(r) = results::read_train_result(files.result);
  std::fprintf(stderr, "'%s' is already finished (%lld steps); nothing to do: its files are unchanged\n",
               files.dir.c_str(), static_cast<long long>(r.steps));
  return r;
}

}  // namespace

TrainResult train(const TrainConfig& requested, const TrainRunOptions& opt) {
  dist::Communicator single;
  dist::Communicator& comm = opt.comm != nullptr ? *opt.comm : single;
  // --resume with nothing to resume is a mistake (a mistyped or empty --out), not a new run. A
  // missing directory is said before anything else is read; one without a checkpoint once this
  // process holds it (another process training there is what to say then).
  if (comm.is_root() && opt.resume)
    require(std::filesystem::exists(opt.out_dir), "--resume: '", opt.out_dir,
            "' does not exist, so there is no run to resume; check --out, or leave out --resume to start a new run");
  const TrainConfig config = resolve_vocab(requested, opt.data_dir);
  config.validate();
  set_num_threads(config.threads > 0 ? config.threads : dist::default_threads(comm));
  const Geometry geo = make_geometry(config, comm);
  const RunFiles files(opt.out_dir);
  const std::string config_toml = to_toml(config);
  // Rank 0 alone writes the run directory, and holds it (created if need be) until the run returns;
  // one it created and left empty (a failure before the first file) is removed again.
  std::optional<OutputDirectory> out;
  if (comm.is_root()) out.emplace(files.dir, run_directory_kind());
  // A finished run is not trained again: its result stays as it was.
  if (comm.any(comm.is_root() && opt.resume && std::filesystem::exists(files.result)))
    return finished_run(files, config, comm);
  if (comm.is_root() && opt.resume)
    require(!files.checkpoints().empty(), "--resume: '", files.dir,
            "' holds no checkpoint (checkpoint-STEP.safetensors) to resume from; check --out, or leave out --resume to "
            "start the run again");
  TrainLog log(files.metrics, comm.is_root(), opt.progress, opt.label);

  const data::TokenDataset train_data = data::TokenDataset::open(opt.data_dir, "train");
  const data::TokenDataset val_data = data::TokenDataset::open(opt.data_dir, "val");
  require(train_data.tokenizer_hash() == val_data.tokenizer_hash(), "'", opt.data_dir,
          "': train and val splits disagree on the tokenizer");
  // Its content hash goes into the weights, so eval and sample find it by content later.
  const std::unique_ptr<data::Tokenizer> tokenizer = data::open_dataset_tokenizer(train_data);
  // Before step 1: every split this run reads holds a window (evaluations come mid-run).
  eval_windows(train_data, config.seq_len, 0);
  const std::int64_t val_windows = eval_windows(val_data, config.seq_len, config.eval_tokens);

  const std::unique_ptr<TrainBackend> backend =
      make_train_backend(opt.device, config, geo.micro_batch, geo.local_micro, comm);
  data::BatchLoader loader(train_data, config.batch_size, config.seq_len, config.data_seed, comm.rank(), comm.world());
  const std::int64_t total_steps = config.total_steps();
  // Recorded in every checkpoint: --resume on other data is refused.
  const RunDataset dataset{opt.data_dir, comm.is_root() ? data::dataset_identity(opt.data_dir) : nlohmann::json()};
  RunStart start = start_or_resume(files, config, config_toml, *tokenizer, dataset, opt.resume, *backend, comm);
  TrainState& state = start.state;
  if (start.resumed) {
    loader.seek(state.loader);
    log.message(concat("resuming '", files.dir, "' at step ", state.step, "/", total_steps, " from '",
                       start.checkpoint, "'"));
    const auto unknown = std::count_if(state.curve.begin(), state.curve.end(),
                                       [](const results::LossPoint& p) { return std::isnan(p.grad_norm); });
    if (unknown > 0)
      log.message(concat("note: ", unknown, " of the checkpoint's ", state.curve.size(),
                         " steps have no gradient norm (it was written before they were recorded): the run's "
                         "clipped fraction and largest gradient norm cover its other steps"));
  }
  run_start_messages(log, config, geo, *backend, comm);
  if (config.tokens != total_steps * config.tokens_per_step())
    log.message(concat("note: train.tokens ", config.tokens, " is rounded down to whole steps: ", total_steps,
                       " x ", config.tokens_per_step(), " = ", total_steps * config.tokens_per_step(), " tokens"));
  if (val_windows * config.seq_len != config.eval_tokens)
    log.message(concat("note: train.eval_tokens ", config.eval_tokens, ": each evaluation scores ", val_windows,
                       " windows of ", config.seq_len, " = ", val_windows * config.seq_len, " tokens",
                       val_windows < config.eval_tokens / config.seq_len ? " (all the val split holds)" : ""));

  TrainStep step(config, geo, *backend, loader, comm, files.dir, files.checkpoint_pattern());
  Milestones milestones(config.milestone_steps(), state.step);
  Speed speed;
  auto checkpoint = [&] {
    state.loader = loader.position();
    if (!comm.is_root()) return;
    state.metrics_bytes = static_cast<std::int64_t>(std::filesystem::file_size(files.metrics));
    save_checkpoint(files, config, backend->layout(), backend->host_state(), state, config_toml, dataset, *tokenizer);
  };

  while (state.step < total_steps) {
    // Every rank must stop at the same step, so a signal seen by one rank stops all.
    const bool stop =
        (opt.stop != nullptr && opt.stop->load()) || (opt.stop_at_step > 0 && state.step >= opt.stop_at_step);
    if (comm.any(stop)) {
      checkpoint();
      log.message(concat("stopped at step ", state.step, "; checkpoint saved; continue with --resume"));
      return make_result(false, state, speed, backend->layout(), files, config, geo, comm);
    }
    const StepOutcome s = step.run(state.step);
    ++state.step;
    const std::int64_t tokens = state.step * config.tokens_per_step();
    state.curve.push_back({tokens, s.loss, s.grad_norm});
    speed.add(s);
    const double tps = double(speed.steps * config.tokens_per_step()) / std::max(speed.seconds, 1e-9);
    log.step(state.step, total_steps, config.tokens_per_step(), s.loss, s.lr, s.grad_norm, tps);

    if (milestones.reached(state.step)) {
      const EvalResult ev =
          evaluate_split(*backend, val_data, geo.micro_batch, config.seq_len, config.eval_tokens, &comm);
      state.milestones.push_back({state.step, tokens, ev.nll});
      log.evaluation(state.step, tokens, ev);
    }
    if (state.step % config.checkpoint_every == 0 || state.step == total_steps) {
      state.finished = state.step == total_steps;
      checkpoint();
    }
  }
  TrainResult result = make_result(true, state, speed, backend->layout(), files, config, geo, comm);
  // This process, which finished the run (a resumed run's earlier steps may have run elsewhere).
  result.provenance = results::process_provenance(opt.device, config.precision == kernels::MatmulPrecision::bf16);
  if (result.instability->unstable) log.message(unstable_message(*result.instability));
  if (comm.is_root()) results::write_train_result(files.result, result);
  return result;
}

}  // namespace attnres
