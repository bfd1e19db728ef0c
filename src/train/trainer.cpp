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
#include "model/model.hpp"
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

void save_checkpoint(const std::string& out, const TrainConfig& config, const Model<float>& model,
                     const AdamW<float>& opt, const State& state, const std::string& config_toml,
                     const std::string& tokenizer_spec) {
  const auto& layout = model.layout();
  // One file holds everything resume needs, so it can never disagree with itself.
  const std::vector<TensorRef> tensors = {
      {"params", DType::F32, {layout.total()}, model.params().data()},
      {"adam.m", DType::F32, {layout.total()}, opt.m().data()},
      {"adam.v", DType::F32, {layout.total()}, opt.v().data()},
  };
  write_safetensors(checkpoint_path(out),
                    {{"state", state_to_json(state, config_toml).dump()},
                     {"config", nlohmann::json(config.model).dump()},
                     {"adam_steps", std::to_string(opt.steps())}},
                    tensors);
  save_weights<float>((fs::path(out) / "model.safetensors").string(), config.model, layout, model.params(),
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

TrainResult train(const TrainConfig& requested, const TrainRunOptions& opt_in) {
  const TrainConfig config = resolve_vocab(requested, opt_in.data_dir);
  config.validate();
  set_num_threads(config.threads);
  const std::string& out = opt_in.out_dir;
  const std::string config_toml = to_toml(config);
  const std::string ckpt = checkpoint_path(out);
  const std::string metrics = (fs::path(out) / "metrics.jsonl").string();
  StatusLine status(opt_in.progress);

  const bool have_checkpoint = fs::exists(ckpt);
  require(!have_checkpoint || opt_in.resume, "'", out,
          "' already holds a training run; pass --resume to continue it, or choose another --out");
  fs::create_directories(out);

  const data::TokenDataset train_data = data::TokenDataset::open(opt_in.data_dir, "train");
  const data::TokenDataset val_data = data::TokenDataset::open(opt_in.data_dir, "val");
  require(train_data.tokenizer_hash() == val_data.tokenizer_hash(), "'", opt_in.data_dir,
          "': train and val splits disagree on the tokenizer");

  Model<float> model(config.model, config.batch_size, config.seq_len, true);
  AdamW<float> opt(model.layout(), config.adamw());
  data::BatchLoader loader(train_data, config.batch_size, config.seq_len, config.data_seed);
  const LrSchedule schedule = config.schedule();
  const std::int64_t total_steps = config.total_steps();
  const std::vector<std::int64_t> milestone_steps = config.milestone_steps();

  State state;
  if (have_checkpoint) {
    const SafetensorsFile f = read_safetensors(ckpt);
    require(f.metadata.count("state") == 1, "'", ckpt, "' has no training state");
    nlohmann::json sj;
    try {
      sj = nlohmann::json::parse(f.metadata.at("state"));
    } catch (const nlohmann::json::exception& e) {
      fail("'", ckpt, "': corrupt training state: ", e.what());
    }
    require(sj.value("config", std::string()) == config_toml, "'", ckpt,
            "' was written with a different configuration; resume with the same preset/config/--set values "
            "(see ", (fs::path(out) / "config.toml").string(), ")");
    state = state_from_json(sj, ckpt);
    for (auto [name, dst] : {std::pair{"params", model.params()}, std::pair{"adam.m", opt.m()},
                             std::pair{"adam.v", opt.v()}}) {
      const StoredTensor& t = f.at(name, ckpt);
      require(t.dtype == DType::F32 && t.numel() == model.layout().total(), "'", ckpt, "': tensor '", name,
              "' does not match this model");
      std::memcpy(dst.data(), t.bytes.data(), t.bytes.size());
    }
    opt.set_steps(state.step);
    loader.seek(state.loader);
    if (fs::exists(metrics)) fs::resize_file(metrics, static_cast<std::uintmax_t>(state.metrics_bytes));
    status.message(concat(opt_in.label, opt_in.label.empty() ? "" : ": ", "resuming '", out, "' at step ",
                          state.step, "/", total_steps));
  } else {
    init_params<float>(model.layout(), config.seed, model.params());
    write_text_atomically((fs::path(out) / "config.toml").string(), config_toml);
    std::FILE* f = std::fopen(metrics.c_str(), "wb");
    require(f != nullptr, "cannot create '", metrics, "'");
    std::fclose(f);
  }

  TrainResult result;
  result.params = model.layout().total();
  result.weights_path = (fs::path(out) / "model.safetensors").string();
  status.message(concat(opt_in.label, opt_in.label.empty() ? "" : ": ", "model ", to_string(config.model.residual),
                        config.model.residual == ResidualMode::rd ? "/" + to_string(config.model.value_route) : "",
                        ", ", result.params, " parameters; ", total_steps, " steps of ", config.tokens_per_step(),
                        " tokens"));

  std::vector<std::int32_t> batch(static_cast<std::size_t>(config.batch_size) * (config.seq_len + 1));
  double train_seconds = 0;
  const std::int64_t first_step = state.step;
  std::size_t next_milestone = 0;
  while (next_milestone < milestone_steps.size() && milestone_steps[next_milestone] <= state.step) ++next_milestone;

  auto checkpoint = [&] {
    state.loader = loader.position();
    state.metrics_bytes = static_cast<std::int64_t>(fs::file_size(metrics));
    save_checkpoint(out, config, model, opt, state, config_toml, train_data.tokenizer_spec());
  };

  while (state.step < total_steps) {
    if (opt_in.stop != nullptr && opt_in.stop->load()) {
      checkpoint();
      status.message(concat(opt_in.label, opt_in.label.empty() ? "" : ": ", "stopped at step ", state.step,
                            "; checkpoint saved; continue with --resume"));
      result.finished = false;
      result.steps = state.step;
      return result;
    }
    const auto t_step = std::chrono::steady_clock::now();
    loader.next(batch);
    const double loss = model.forward_backward(batch, config.batch_size, config.seq_len);
    require(std::isfinite(loss), "the training loss became ", loss, " at step ", state.step, " of '", out,
            "'; stopping. The last good checkpoint (step <= ", state.step, ") is in '", ckpt,
            "'; lower train.lr or raise train.warmup_fraction");
    const double grad_norm = clip_grad_norm<float>(model.grads(), config.grad_clip);
    const double lr = schedule.at(state.step);
    opt.step(model.params(), model.grads(), lr);
    ++state.step;
    const std::int64_t tokens = state.step * config.tokens_per_step();
    state.curve.emplace_back(tokens, loss);

    // Speed counts training steps only, not evaluations and checkpoints.
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
    const double tps = double((state.step - first_step) * config.tokens_per_step()) / std::max(train_seconds, 1e-9);
    append_line(metrics, nlohmann::json{{"step", state.step}, {"tokens", tokens}, {"loss", loss}, {"lr", lr},
                                        {"grad_norm", grad_norm}, {"tokens_per_sec", tps}}
                             .dump());
    char line[256];
    std::snprintf(line, sizeof line, "%s%sstep %lld/%lld  tokens %lld  loss %.4f  %.0f tok/s  ETA %s",
                  opt_in.label.c_str(), opt_in.label.empty() ? "" : ": ", static_cast<long long>(state.step),
                  static_cast<long long>(total_steps), static_cast<long long>(tokens), loss, tps,
                  format_eta(double(total_steps - state.step) * config.tokens_per_step() / tps).c_str());
    status.update(line, state.step == total_steps);

    if (next_milestone < milestone_steps.size() && state.step == milestone_steps[next_milestone]) {
      const EvalResult ev = evaluate_split(model, val_data, config.batch_size, config.seq_len, config.eval_tokens);
      state.milestones.push_back({state.step, tokens, ev.nll});
      append_line(metrics, nlohmann::json{{"step", state.step}, {"tokens", tokens}, {"val_nll", ev.nll},
                                          {"val_tokens", ev.tokens}}
                               .dump());
      char msg[192];
      std::snprintf(msg, sizeof msg, "%s%sval NLL %.4f at %lld tokens", opt_in.label.c_str(),
                    opt_in.label.empty() ? "" : ": ", ev.nll, static_cast<long long>(tokens));
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
  result.milestones = state.milestones;
  result.curve = state.curve;
  result.tokens_per_sec = ran > 0 ? double(ran * config.tokens_per_step()) / elapsed : 0;
  result.step_time_ms = ran > 0 ? 1000.0 * elapsed / double(ran) : 0;
  result.peak_rss_bytes = peak_rss_bytes();
  nlohmann::json ms = nlohmann::json::array();
  for (const auto& m : result.milestones) ms.push_back({{"step", m.step}, {"tokens", m.tokens}, {"val_nll", m.val_nll}});
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& [t, l] : result.curve) curve.push_back({{"tokens", t}, {"train_loss", l}});
  write_text_atomically((fs::path(out) / "train_result.json").string(),
                        nlohmann::json{{"params", result.params},
                                       {"steps", result.steps},
                                       {"milestones", ms},
                                       {"curve", curve},
                                       {"tokens_per_sec", result.tokens_per_sec},
                                       {"step_time_ms", result.step_time_ms},
                                       {"peak_rss_bytes", result.peak_rss_bytes}}
                            .dump(1));
  return result;
}

}  // namespace attnres
