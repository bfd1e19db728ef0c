#include "train/trainer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/loader.hpp"
#include "dist/tree_sum.hpp"
#include "model/model.hpp"
#include "train/backend.hpp"
#include "model/safetensors.hpp"
#include "optim/adamw.hpp"
#include "train/evaluate.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/status_line.hpp"
#include "util/threads.hpp"

namespace attnres {

namespace fs = std::filesystem;

std::int64_t peak_rss_bytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

TrainConfig resolve_vocab(TrainConfig config, const std::string& data_dir) {
  const data::TokenDataset train = data::TokenDataset::open(data_dir, "train", {false, nullptr});
  if (config.model.vocab_size == 0) config.model.vocab_size = train.vocab_size();
  require(config.model.vocab_size >= train.vocab_size(), "model.vocab_size (", config.model.vocab_size,
          ") is smaller than the vocabulary of the data in '", data_dir, "' (", train.vocab_size(), ")");
  return config;
}

namespace {

std::string checkpoint_path(const std::string& out) { return (fs::path(out) / "checkpoint.safetensors").string(); }

std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long>(seconds);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  return buf;
}

// The training state that is not in the weights: everything resume needs.
struct State {
  std::int64_t step = 0;
  data::LoaderPosition loader;
  std::int64_t metrics_bytes = 0;  // metrics.jsonl is truncated to this on resume
  std::vector<MilestoneResult> milestones;
  std::vector<std::pair<std::int64_t, double>> curve;
  bool finished = false;
};

nlohmann::json state_to_json(const State& s, const std::string& config_toml) {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& x : s.milestones) m.push_back({{"step", x.step}, {"tokens", x.tokens}, {"val_nll", x.val_nll}});
  nlohmann::json c = nlohmann::json::array();
  for (const auto& [t, l] : s.curve) c.push_back({t, l});
  return {{"step", s.step},           {"loader", s.loader},  {"metrics_bytes", s.metrics_bytes},
          {"milestones", m},          {"curve", c},          {"finished", s.finished},
          {"config", config_toml}};
}

State state_from_json(const nlohmann::json& j, const std::string& path) {
  try {
    State s;
    s.step = j.at("step").get<std::int64_t>();
    s.loader = j.at("loader").get<data::LoaderPosition>();
    s.metrics_bytes = j.at("metrics_bytes").get<std::int64_t>();
    for (const auto& m : j.at("milestones"))
      s.milestones.push_back({m.at("step").get<std::int64_t>(), m.at("tokens").get<std::int64_t>(),
                              m.at("val_nll").get<double>()});
    for (const auto& c : j.at("curve")) s.curve.emplace_back(c.at(0).get<std::int64_t>(), c.at(1).get<double>());
    s.finished = j.at("finished").get<bool>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "': corrupt training state: ", e.what());
  }
}

void save_checkpoint(const std::string& out, const TrainConfig& config, const ParamLayout& layout,
                     const HostTrainState& host, const State& state, const std::string& config_toml,
                     const std::string& tokenizer_spec) {
  // One file holds everything resume needs, so it can never disagree with itself.
  const std::vector<TensorRef> tensors = {
      {"params", DType::F32, {layout.total()}, host.params.data()},
      {"adam.m", DType::F32, {layout.total()}, host.m.data()},
      {"adam.v", DType::F32, {layout.total()}, host.v.data()},
  };
  write_safetensors(checkpoint_path(out),
                    {{"state", state_to_json(state, config_toml).dump()},
                     {"config", nlohmann::json(config.model).dump()},
                     {"adam_steps", std::to_string(host.adam_steps)}},
                    tensors);
  save_weights<float>((fs::path(out) / "model.safetensors").string(), config.model, layout, host.params,
                      {{"step", std::to_string(state.step)}, {"tokenizer", tokenizer_spec}});
}

void append_line(const std::string& path, const std::string& line) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) fail("cannot append to '", path, "'");
  const std::string text = line + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::fclose(f);
  require(ok, "cannot write to '", path, "'");
}

}  // namespace

namespace {

// The data-parallel geometry of a run: how the global batch is cut over ranks and micro-batches.
struct Geometry {
  int micro_batches = 1;  // over all ranks
  int local_micro = 1;    // on this rank
  int micro_batch = 1;    // sequences per micro-batch
};

Geometry make_geometry(const TrainConfig& config, const dist::Communicator& comm) {
  Geometry g;
  g.micro_batches = config.micro_batches > 0 ? config.micro_batches : comm.world();
  require(g.micro_batches % comm.world() == 0, "train.micro_batches (", g.micro_batches,
          ") must be a multiple of the number of processes (", comm.world(), ")");
  require(config.batch_size % g.micro_batches == 0, "train.batch_size (", config.batch_size,
          ") must be a multiple of the number of micro-batches (", g.micro_batches,
          config.micro_batches > 0 ? ", train.micro_batches)" : ", one per process)");
  g.local_micro = g.micro_batches / comm.world();
  g.micro_batch = config.batch_size / g.micro_batches;
  return g;
}

}  // namespace

TrainResult train(const TrainConfig& requested, const TrainRunOptions& opt_in) {
  dist::Communicator single;
  dist::Communicator& comm = opt_in.comm != nullptr ? *opt_in.comm : single;
  const bool root = comm.is_root();
  const TrainConfig config = resolve_vocab(requested, opt_in.data_dir);
  config.validate();
  set_num_threads(config.threads > 0 ? config.threads : dist::default_threads(comm));
  const Geometry geo = make_geometry(config, comm);
  const std::string& out = opt_in.out_dir;
  const std::string config_toml = to_toml(config);
  const std::string ckpt = checkpoint_path(out);
  const std::string metrics = (fs::path(out) / "metrics.jsonl").string();
  StatusLine status(opt_in.progress && root);
  const std::string prefix = opt_in.label.empty() ? "" : opt_in.label + ": ";

  const data::TokenDataset train_data = data::TokenDataset::open(opt_in.data_dir, "train");
  const data::TokenDataset val_data = data::TokenDataset::open(opt_in.data_dir, "val");
  require(train_data.tokenizer_hash() == val_data.tokenizer_hash(), "'", opt_in.data_dir,
          "': train and val splits disagree on the tokenizer");

  const std::unique_ptr<TrainBackend> backend =
      make_train_backend(opt_in.device, config, geo.micro_batch, geo.local_micro, comm);
  const ParamLayout& layout = backend->layout();
  const auto n_params = static_cast<std::size_t>(layout.total());
  data::BatchLoader loader(train_data, config.batch_size, config.seq_len, config.data_seed, comm.rank(), comm.world());
  const LrSchedule schedule = config.schedule();
  const std::int64_t total_steps = config.total_steps();
  const std::vector<std::int64_t> milestone_steps = config.milestone_steps();

  // Rank 0 reads the checkpoint (if any) and hands weights, moments and state to the others, so
  // only rank 0 needs the run directory.
  State state;
  std::string state_text;
  std::vector<float> resume_params, resume_m, resume_v;  // the checkpoint's arrays, while resuming
  if (root) {
    const bool have_checkpoint = fs::exists(ckpt);
    require(!have_checkpoint || opt_in.resume, "'", out,
            "' already holds a training run; pass --resume to continue it, or choose another --out");
    fs::create_directories(out);
    if (have_checkpoint) {
      const SafetensorsFile f = read_safetensors(ckpt);
      require(f.metadata.count("state") == 1, "'", ckpt, "' has no training state");
      state_text = f.metadata.at("state");
      nlohmann::json sj;
      try {
        sj = nlohmann::json::parse(state_text);
      } catch (const nlohmann::json::exception& e) {
        fail("'", ckpt, "': corrupt training state: ", e.what());
      }
      // Compared as configurations, not text: a checkpoint written before a key existed lacks it,
      // and the key takes its default.
      const TrainConfig stored = parse_toml_config(sj.value("config", std::string()), ckpt + " (its configuration)");
      const std::vector<ConfigDifference> differences = config_differences(train_config_keys(), stored, config);
      require(differences.empty(), "'", ckpt, "' was written with a different configuration: ",
              describe_differences(differences, "checkpoint", "requested"),
              "; resume with the same preset/config/--set values (see ", (fs::path(out) / "config.toml").string(),
              ")");
      for (auto [name, dst] : {std::pair{"params", &resume_params}, std::pair{"adam.m", &resume_m},
                               std::pair{"adam.v", &resume_v}}) {
        const StoredTensor& t = f.at(name, ckpt);
        require(t.dtype == DType::F32 && t.numel() == layout.total(), "'", ckpt, "': tensor '", name,
                "' does not match this model");
        require_finite(t, name, ckpt);
        dst->resize(n_params);
        std::memcpy(dst->data(), t.bytes.data(), t.bytes.size());
      }
    } else {
      write_text_atomically((fs::path(out) / "config.toml").string(), config_toml);
      std::FILE* f = std::fopen(metrics.c_str(), "wb");
      require(f != nullptr, "cannot create '", metrics, "'");
      std::fclose(f);
    }
  }
  comm.broadcast(state_text);
  if (state_text.empty()) {
    backend->init_params(config.seed);  // the same on every rank: keyed by (seed, tensor name)
  } else {
    for (auto* a : {&resume_params, &resume_m, &resume_v}) {
      a->resize(n_params);
      comm.broadcast(*a);
    }
    state = state_from_json(nlohmann::json::parse(state_text), ckpt);
    backend->load_state(resume_params, resume_m, resume_v, state.step);
    for (auto* a : {&resume_params, &resume_m, &resume_v}) std::vector<float>().swap(*a);
    loader.seek(state.loader);
    if (root && fs::exists(metrics)) fs::resize_file(metrics, static_cast<std::uintmax_t>(state.metrics_bytes));
    status.message(concat(prefix, "resuming '", out, "' at step ", state.step, "/", total_steps));
  }

  TrainResult result;
  result.params = layout.total();
  result.weights_path = (fs::path(out) / "model.safetensors").string();
  status.message(concat(prefix, "model ", to_string(config.model.residual),
                        config.model.residual == ResidualMode::rd ? "/" + to_string(config.model.value_route) : "",
                        ", ", result.params, " parameters; ", total_steps, " steps of ", config.tokens_per_step(),
                        " tokens"));
  status.message(concat(prefix, comm.world(), comm.world() == 1 ? " process" : " processes", ", ",
                        geo.micro_batches, geo.micro_batches == 1 ? " micro-batch" : " micro-batches", " of ",
                        geo.micro_batch, " sequences per step; ", backend->describe(),
                        comm.distributed() ? " per process" : ""));

  // This rank's share of each global batch, its micro-batches' gradient and loss sums.
  const auto window = static_cast<std::size_t>(config.seq_len + 1);
  std::vector<std::int32_t> batch(static_cast<std::size_t>(geo.local_micro * geo.micro_batch) * window);
  dist::PairwiseSum<double> loss_sum(1, static_cast<std::size_t>(geo.local_micro));
  const BatchLoss eval_loss = [&backend](std::span<const std::int32_t> tokens, int b, int s) {
    return backend->loss(tokens, b, s);
  };

  double train_seconds = 0;
  double reduce_seconds = 0;  // of which in the gradient reduction across ranks
  const std::int64_t first_step = state.step;
  std::size_t next_milestone = 0;
  while (next_milestone < milestone_steps.size() && milestone_steps[next_milestone] <= state.step) ++next_milestone;

  auto checkpoint = [&] {
    state.loader = loader.position();
    if (!root) return;
    state.metrics_bytes = static_cast<std::int64_t>(fs::file_size(metrics));
    save_checkpoint(out, config, layout, backend->host_state(), state, config_toml, train_data.tokenizer_spec());
  };

  while (state.step < total_steps) {
    // Every rank must stop at the same step, so a signal seen by one rank stops all.
    const bool stop = (opt_in.stop != nullptr && opt_in.stop->load()) ||
                      (opt_in.stop_at_step > 0 && state.step >= opt_in.stop_at_step);
    if (comm.any(stop)) {
      checkpoint();
      status.message(concat(prefix, "stopped at step ", state.step, "; checkpoint saved; continue with --resume"));
      result.finished = false;
      result.steps = state.step;
      return result;
    }
    const auto t_step = std::chrono::steady_clock::now();
    loader.next(batch);
    loss_sum.reset();
    for (int m = 0; m < geo.local_micro; ++m) {
      const std::size_t len = static_cast<std::size_t>(geo.micro_batch) * window;
      double micro_loss = backend->accumulate(std::span<const std::int32_t>(batch).subspan(m * len, len),
                                              geo.micro_batch, config.seq_len);
      loss_sum.add(std::span<double>(&micro_loss, 1));
    }
    double loss = 0;
    loss_sum.result(std::span<double>(&loss, 1));
    const auto t_reduce = std::chrono::steady_clock::now();
    backend->finish_gradient(comm, geo.micro_batches);
    loss = comm.sum(loss) / geo.micro_batches;  // micro-batch losses are means; the step's is their mean
    reduce_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_reduce).count();
    require(std::isfinite(loss), "the training loss became ", loss, " at step ", state.step, " of '", out,
            "'; stopping. The last good checkpoint (step <= ", state.step, ") is in '", ckpt,
            "'; lower train.lr or raise train.warmup_fraction");
    const double lr = schedule.at(state.step);
    const double grad_norm = backend->update(lr, config.grad_clip);
    ++state.step;
    const std::int64_t tokens = state.step * config.tokens_per_step();
    state.curve.emplace_back(tokens, loss);

    // Speed counts training steps only, not evaluations and checkpoints.
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
    const double tps = double((state.step - first_step) * config.tokens_per_step()) / std::max(train_seconds, 1e-9);
    if (root)
      append_line(metrics, nlohmann::json{{"step", state.step}, {"tokens", tokens}, {"loss", loss}, {"lr", lr},
                                          {"grad_norm", grad_norm}, {"tokens_per_sec", tps}}
                               .dump());
    char line[256];
    std::snprintf(line, sizeof line, "%sstep %lld/%lld  tokens %lld  loss %.4f  %.0f tok/s  ETA %s", prefix.c_str(),
                  static_cast<long long>(state.step), static_cast<long long>(total_steps),
                  static_cast<long long>(tokens), loss, tps,
                  format_eta(double(total_steps - state.step) * config.tokens_per_step() / tps).c_str());
    status.update(line, state.step == total_steps);

    if (next_milestone < milestone_steps.size() && state.step == milestone_steps[next_milestone]) {
      const EvalResult ev =
          evaluate_split(eval_loss, val_data, geo.micro_batch, config.seq_len, config.eval_tokens, &comm);
      state.milestones.push_back({state.step, tokens, ev.nll});
      if (root)
        append_line(metrics, nlohmann::json{{"step", state.step}, {"tokens", tokens}, {"val_nll", ev.nll},
                                            {"val_tokens", ev.tokens}}
                                 .dump());
      char msg[192];
      std::snprintf(msg, sizeof msg, "%sval NLL %.4f at %lld tokens", prefix.c_str(), ev.nll,
                    static_cast<long long>(tokens));
      status.message(msg);
      ++next_milestone;
    }
    if (state.step % config.checkpoint_every == 0 || state.step == total_steps) {
      state.finished = state.step == total_steps;
      checkpoint();
    }
  }
  const double elapsed = train_seconds;
  const std::int64_t ran = state.step - first_step;
  result.finished = true;
  result.steps = state.step;
  for (const auto& m : state.milestones) result.milestones.push_back({m.step, m.tokens, m.val_nll});
  for (const auto& [tokens, loss] : state.curve) result.curve.push_back({tokens, loss});
  result.tokens_per_sec = ran > 0 ? double(ran * config.tokens_per_step()) / elapsed : 0;
  result.step_time_ms = ran > 0 ? 1000.0 * elapsed / double(ran) : 0;
  result.peak_rss_bytes = peak_rss_bytes();
  result.reduce_fraction = elapsed > 0 ? reduce_seconds / elapsed : 0;
  result.processes = comm.world();
  result.micro_batches = geo.micro_batches;
  if (root) results::write_train_result(results::train_result_path(out), result);
  return result;
}

}  // namespace attnres
