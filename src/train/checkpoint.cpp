#include "train/checkpoint.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/safetensors.hpp"
#include "results/train_result.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres {

namespace fs = std::filesystem;

RunFiles::RunFiles(const std::string& out_dir)
    : dir(out_dir),
      config((fs::path(out_dir) / "config.toml").string()),
      metrics((fs::path(out_dir) / "metrics.jsonl").string()),
      weights((fs::path(out_dir) / "model.safetensors").string()),
      checkpoint((fs::path(out_dir) / "checkpoint.safetensors").string()),
      result(results::train_result_path(out_dir)) {}

namespace {

nlohmann::json state_to_json(const TrainState& s, const std::string& config_toml) {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& x : s.milestones) m.push_back({{"step", x.step}, {"tokens", x.tokens}, {"val_nll", x.val_nll}});
  nlohmann::json c = nlohmann::json::array();
  for (const auto& [t, l] : s.curve) c.push_back({t, l});
  return {{"step", s.step},           {"loader", s.loader},  {"metrics_bytes", s.metrics_bytes},
          {"milestones", m},          {"curve", c},          {"finished", s.finished},
          {"config", config_toml}};
}

TrainState state_from_json(const nlohmann::json& j, const std::string& path) {
  try {
    TrainState s;
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

// What rank 0 reads from a checkpoint: the state's JSON text and the arrays.
struct StoredCheckpoint {
  std::string state_text;
  std::vector<float> params, m, v;
};

StoredCheckpoint read_checkpoint(const RunFiles& files, const ParamLayout& layout, const TrainConfig& config) {
  const std::string& ckpt = files.checkpoint;
  const SafetensorsFile f = read_safetensors(ckpt);
  require(f.metadata.count("state") == 1, "'", ckpt, "' has no training state");
  StoredCheckpoint stored;
  stored.state_text = f.metadata.at("state");
  nlohmann::json sj;
  try {
    sj = nlohmann::json::parse(stored.state_text);
  } catch (const nlohmann::json::exception& e) {
    fail("'", ckpt, "': corrupt training state: ", e.what());
  }
  // Compared as configurations, not text: a checkpoint written before a key existed lacks it,
  // and the key takes its default.
  const TrainConfig stored_config = parse_toml_config(sj.value("config", std::string()), ckpt + " (its configuration)");
  const std::vector<ConfigDifference> differences = config_differences(train_config_keys(), stored_config, config);
  require(differences.empty(), "'", ckpt, "' was written with a different configuration: ",
          describe_differences(differences, "checkpoint", "requested"),
          "; resume with the same preset/config/--set values (see ", files.config, ")");
  for (auto [name, dst] : {std::pair{"params", &stored.params}, std::pair{"adam.m", &stored.m},
                           std::pair{"adam.v", &stored.v}}) {
    const StoredTensor& t = f.at(name, ckpt);
    require(t.dtype == DType::F32 && t.numel() == layout.total(), "'", ckpt, "': tensor '", name,
            "' does not match this model");
    require_finite(t, name, ckpt);
    dst->resize(static_cast<std::size_t>(layout.total()));
    std::memcpy(dst->data(), t.bytes.data(), t.bytes.size());
  }
  return stored;
}

// A new run's files: the configuration and an empty metrics log.
void create_run(const RunFiles& files, const std::string& config_toml) {
  write_text_atomically(files.config, config_toml);
  std::FILE* f = std::fopen(files.metrics.c_str(), "wb");
  require(f != nullptr, "cannot create '", files.metrics, "'");
  std::fclose(f);
}

}  // namespace

void save_checkpoint(const RunFiles& files, const TrainConfig& config, const ParamLayout& layout,
                     const HostTrainState& host, const TrainState& state, const std::string& config_toml,
                     const data::Tokenizer& tokenizer) {
  const std::vector<TensorRef> tensors = {
      {"params", DType::F32, {layout.total()}, host.params.data()},
      {"adam.m", DType::F32, {layout.total()}, host.m.data()},
      {"adam.v", DType::F32, {layout.total()}, host.v.data()},
  };
  write_safetensors(files.checkpoint,
                    {{"state", state_to_json(state, config_toml).dump()},
                     {"config", nlohmann::json(config.model).dump()},
                     {"adam_steps", std::to_string(host.adam_steps)}},
                    tensors);
  save_weights<float>(files.weights, config.model, layout, host.params,
                      {{"step", std::to_string(state.step)},
                       {"tokenizer", tokenizer.spec()},
                       {"tokenizer_hash", tokenizer.content_hash()}});
}

RunStart start_or_resume(const RunFiles& files, const TrainConfig& config, const std::string& config_toml,
                         bool resume, TrainBackend& backend, dist::Communicator& comm) {
  StoredCheckpoint stored;  // on rank 0 while resuming; the others receive it below
  if (comm.is_root()) {
    const bool have_checkpoint = fs::exists(files.checkpoint);
    require(!have_checkpoint || resume, "'", files.dir,
            "' already holds a training run; pass --resume to continue it, or choose another --out");
    fs::create_directories(files.dir);
    if (have_checkpoint) stored = read_checkpoint(files, backend.layout(), config);
    else create_run(files, config_toml);
  }
  comm.broadcast(stored.state_text);
  RunStart start;
  if (stored.state_text.empty()) {
    backend.init_params(config.seed);  // the same on every rank: keyed by (seed, tensor name)
    return start;
  }
  for (auto* a : {&stored.params, &stored.m, &stored.v}) {
    a->resize(static_cast<std::size_t>(backend.layout().total()));
    comm.broadcast(*a);
  }
  start.state = state_from_json(nlohmann::json::parse(stored.state_text), files.checkpoint);
  start.resumed = true;
  backend.load_state(stored.params, stored.m, stored.v, start.state.step);
  if (comm.is_root() && fs::exists(files.metrics))
    fs::resize_file(files.metrics, static_cast<std::uintmax_t>(start.state.metrics_bytes));
  return start;
}

}  // namespace attnres
