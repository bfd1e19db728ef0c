#include "train/checkpoint.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "data/dataset_identity.hpp"
#include "model/safetensors.hpp"
#include "results/train_result.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace attnres {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kCheckpointPrefix = "checkpoint-";
constexpr std::string_view kCheckpointSuffix = ".safetensors";
constexpr const char* kLegacyCheckpoint = "checkpoint.safetensors";

// STEP of "checkpoint-STEP.safetensors"; empty for any other name.
std::optional<std::int64_t> checkpoint_step_of(std::string_view name) {
  if (!name.starts_with(kCheckpointPrefix) || !name.ends_with(kCheckpointSuffix)) return std::nullopt;
  const std::string_view digits =
      name.substr(kCheckpointPrefix.size(), name.size() - kCheckpointPrefix.size() - kCheckpointSuffix.size());
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  return step;
}

}  // namespace

std::string checkpoint_file_name(std::int64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%06lld", static_cast<long long>(step));
  return concat(kCheckpointPrefix, digits, kCheckpointSuffix);
}

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::vector<CheckpointFile> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == kLegacyCheckpoint) found.push_back({CheckpointFile::kLegacyStep, it->path().string()});
    else if (const auto step = checkpoint_step_of(name)) found.push_back({*step, it->path().string()});
  }
  std::sort(found.begin(), found.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return a.step != b.step ? a.step > b.step : a.path < b.path;
  });
  return found;
}

RunFiles::RunFiles(const std::string& out_dir)
    : dir(out_dir),
      config((fs::path(out_dir) / "config.toml").string()),
      metrics((fs::path(out_dir) / "metrics.jsonl").string()),
      weights((fs::path(out_dir) / "model.safetensors").string()),
      result(results::train_result_path(out_dir)) {}

OutputKind run_directory_kind() {
  OutputKind kind;
  kind.what = "run directory";
  kind.lock_name = ".lock";
  kind.in_use = "another 'attnres train' (or an experiment's training process) is writing this run; wait for it "
                "to end, or choose another --out";
  kind.recognised = [](const fs::path& dir) {
    const RunFiles files(dir.string());
    std::error_code ec;
    for (const std::string& path : {files.config, files.metrics, files.weights, files.result, (dir / "run.toml").string()})
      if (fs::exists(path, ec)) return true;
    return !files.checkpoints().empty();
  };
  kind.holds = "config.toml, metrics.jsonl, model.safetensors, checkpoint-STEP.safetensors";
  return kind;
}

std::string RunFiles::checkpoint(std::int64_t step) const { return (fs::path(dir) / checkpoint_file_name(step)).string(); }
std::vector<CheckpointFile> RunFiles::checkpoints() const { return list_checkpoints(dir); }
std::string RunFiles::checkpoint_pattern() const { return (fs::path(dir) / kCheckpointPattern).string(); }

namespace {

nlohmann::json state_to_json(const TrainState& s, const std::string& config_toml, const nlohmann::json& dataset) {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& x : s.milestones) m.push_back({{"step", x.step}, {"tokens", x.tokens}, {"val_nll", x.val_nll}});
  // [tokens, loss, grad_norm]: the norm null where unknown.
  nlohmann::json c = nlohmann::json::array();
  for (const auto& p : s.curve) c.push_back({p.tokens, p.train_loss, results::number_or_null(p.grad_norm)});
  return {{"step", s.step},           {"loader", s.loader},  {"metrics_bytes", s.metrics_bytes},
          {"milestones", m},          {"curve", c},          {"finished", s.finished},
          {"config", config_toml},    {"dataset", dataset}};
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
    // A checkpoint written before gradient norms were kept has [tokens, loss]: the norm is unknown.
    for (const auto& c : j.at("curve")) {
      results::LossPoint& p = s.curve.emplace_back();
      p.tokens = c.at(0).get<std::int64_t>();
      p.train_loss = c.at(1).get<double>();
      if (c.size() > 2 && !c.at(2).is_null()) p.grad_norm = c.at(2).get<double>();
    }
    s.finished = j.at("finished").get<bool>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "': corrupt training state: ", e.what());
  }
}

// What rank 0 reads from a checkpoint: the state's JSON text and the arrays.
struct StoredCheckpoint {
  std::string path;
  std::string state_text;
  std::vector<float> params, m, v;
  // Why the run cannot resume from it at all (another tokenizer or configuration than the
  // requested; the older checkpoints share it); empty when none.
  std::string refusal;
  bool data_unchecked = false;  // written before checkpoints recorded their data
};

// Reads and verifies one checkpoint; an Error says why it is not usable (its digests, values or
// state). A checkpoint written with another tokenizer or configuration is read: the caller
// refuses it.
StoredCheckpoint read_checkpoint(const std::string& ckpt, const ParamLayout& layout, const TrainConfig& config,
                                 const RunFiles& files, const data::Tokenizer& tokenizer, const RunDataset& dataset) {
  const SafetensorsFile f = read_safetensors(ckpt);
  require(f.metadata.count("state") == 1, "'", ckpt, "' has no training state");
  StoredCheckpoint stored;
  stored.path = ckpt;
  stored.state_text = f.metadata.at("state");
  nlohmann::json sj;
  try {
    sj = nlohmann::json::parse(stored.state_text);
  } catch (const nlohmann::json::exception& e) {
    fail("'", ckpt, "': corrupt training state: ", e.what());
  }
  state_from_json(sj, ckpt);  // readable before it is chosen
  // The tokenizer first: data of another tokenizer shows in the configuration too (a vocabulary
  // of another size), but that is not what to fix.
  stored.refusal = tokenizer_mismatch(f.metadata, ckpt, tokenizer, dataset.dir);
  if (!stored.refusal.empty()) return stored;
  // Then the data, by content: a run resumed on another corpus (even with the same tokenizer)
  // would silently continue on it.
  const auto recorded = sj.find("dataset");
  if (recorded == sj.end()) {
    stored.data_unchecked = true;
  } else {
    const std::vector<ConfigDifference> data = data::dataset_identity_differences(*recorded, dataset.identity);
    if (!data.empty()) {
      stored.refusal = concat("'", ckpt, "' was trained on other data than '", dataset.dir, "': ",
                              describe_differences(data, "checkpoint", "--data"),
                              "; resume with the --data the run started with (datasets are matched by content, not "
                              "path: docs/data.md, \"Dataset identity\")");
      return stored;
    }
  }
  // Compared as configurations, not text: a checkpoint written before a key existed lacks it,
  // and the key takes its default.
  const TrainConfig stored_config = parse_toml_config(sj.value("config", std::string()), ckpt + " (its configuration)");
  const std::vector<ConfigDifference> differences = config_differences(train_config_keys(), stored_config, config);
  if (!differences.empty()) {
    stored.refusal =
        concat("'", ckpt, "' was written with a different configuration: ",
               describe_differences(differences, "checkpoint", "requested"),
               "; resume with the same preset/config/--set values (see ", files.config, ")");
    return stored;
  }
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

// The newest of the run's checkpoints that verifies; says on stderr which newer ones it skipped
// and why. One written with another tokenizer or configuration is an error, not skipped: the
// older ones were written with the same.
StoredCheckpoint newest_verified_checkpoint(const std::vector<CheckpointFile>& checkpoints, const ParamLayout& layout,
                                            const TrainConfig& config, const RunFiles& files,
                                            const data::Tokenizer& tokenizer, const RunDataset& dataset) {
  std::vector<std::string> skipped;  // the reason of each, in order
  for (const CheckpointFile& c : checkpoints) {
    std::optional<StoredCheckpoint> stored;
    try {
      stored = read_checkpoint(c.path, layout, config, files, tokenizer, dataset);
    } catch (const Error& e) {
      // The readers' errors name the file; one that does not gets its name here.
      const std::string_view what = e.what();
      skipped.push_back(what.find(c.path) != std::string_view::npos ? std::string(what) : concat("'", c.path, "': ", what));
      std::fprintf(stderr, "attnres: warning: skipping checkpoint '%s' (it does not verify): %s\n", c.path.c_str(),
                   skipped.back().c_str());
      continue;
    }
    require(stored->refusal.empty(), stored->refusal);
    if (stored->data_unchecked)
      std::fprintf(stderr,
                   "attnres: note: '%s' records no dataset identity (written before attnres recorded one): resuming "
                   "without checking that '%s' is the data the run started on\n",
                   c.path.c_str(), dataset.dir.c_str());
    return std::move(*stored);
  }
  std::string list;
  for (const std::string& reason : skipped) list += "\n  " + reason;
  fail("'", files.dir, "': ",
       checkpoints.size() == 1 ? std::string("its checkpoint does not verify")
                               : concat("none of its ", checkpoints.size(), " checkpoints verifies"),
       ", so the run cannot resume:", list,
       "\nto start it over, choose another --out (or remove the run directory)");
}

// A new run's files: the configuration and an empty metrics log.
void create_run(const RunFiles& files, const std::string& config_toml) {
  write_text_atomically(files.config, config_toml);
  std::FILE* f = std::fopen(files.metrics.c_str(), "wb");
  require(f != nullptr, "cannot create '", files.metrics, "'");
  std::fclose(f);
}

// Removes the checkpoints beyond the newest `keep` of a step up to `step`, and with `later_too`
// those of a later step as well.
void prune_checkpoints(const RunFiles& files, int keep, std::int64_t step, bool later_too) {
  std::size_t kept = 0;
  for (const CheckpointFile& c : files.checkpoints()) {
    if (c.step > step && !later_too) continue;
    if (c.step <= step && kept < static_cast<std::size_t>(keep)) {
      ++kept;
      continue;
    }
    std::error_code ec;
    fs::remove(c.path, ec);
    if (ec)  // the run goes on: an extra old checkpoint costs disk space, not correctness
      std::fprintf(stderr, "attnres: warning: cannot remove the old checkpoint '%s': %s\n", c.path.c_str(),
                   ec.message().c_str());
  }
}

// model.safetensors: the weights of `step`, for eval and sample.
void save_run_weights(const RunFiles& files, const TrainConfig& config, const ParamLayout& layout,
                      std::span<const float> params, std::int64_t step, const data::Tokenizer& tokenizer) {
  save_weights<float>(files.weights, config.model, layout, params,
                      {{"step", std::to_string(step)},
                       {"tokenizer", tokenizer.spec()},
                       {"tokenizer_hash", tokenizer.content_hash()}});
}

}  // namespace

void save_checkpoint(const RunFiles& files, const TrainConfig& config, const ParamLayout& layout,
                     const HostTrainState& host, const TrainState& state, const std::string& config_toml,
                     const RunDataset& dataset, const data::Tokenizer& tokenizer) {
  const std::vector<TensorRef> tensors = {
      {"params", DType::F32, {layout.total()}, host.params.data()},
      {"adam.m", DType::F32, {layout.total()}, host.m.data()},
      {"adam.v", DType::F32, {layout.total()}, host.v.data()},
  };
  write_safetensors(files.checkpoint(state.step),
                    {{"state", state_to_json(state, config_toml, dataset.identity).dump()},
                     {"config", nlohmann::json(config.model).dump()},
                     {"adam_steps", std::to_string(host.adam_steps)},
                     {"tokenizer", tokenizer.spec()},
                     {"tokenizer_hash", tokenizer.content_hash()}},
                    tensors);
  // Only now that the new checkpoint is durable (write_safetensors synced it and its directory),
  // and before anything else: a process stopped between the two leaves one checkpoint too many.
  prune_checkpoints(files, config.keep_checkpoints, state.step, true);
  save_run_weights(files, config, layout, host.params, state.step, tokenizer);
  // A process killed while writing a checkpoint leaves its temporary, and the next write of that
  // name, which would remove it, may never come: the steps go on.
  std::error_code ec;
  for (fs::directory_iterator it(files.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto tmp = name.find(".tmp.");
    if (name.starts_with(".") && tmp != std::string::npos && checkpoint_step_of(name.substr(1, tmp - 1)))
      remove_stale_temporaries((fs::path(files.dir) / name.substr(1, tmp - 1)).string());
  }
}

RunStart start_or_resume(const RunFiles& files, const TrainConfig& config, const std::string& config_toml,
                         const data::Tokenizer& tokenizer, const RunDataset& dataset, bool resume,
                         TrainBackend& backend, dist::Communicator& comm) {
  StoredCheckpoint stored;  // on rank 0 while resuming; the others receive it below
  if (comm.is_root()) {
    const std::vector<CheckpointFile> checkpoints = files.checkpoints();
    require(checkpoints.empty() || resume, "'", files.dir,
            "' already holds a training run; pass --resume to continue it, or choose another --out");
    fs::create_directories(files.dir);
    if (!checkpoints.empty())
      stored = newest_verified_checkpoint(checkpoints, backend.layout(), config, files, tokenizer, dataset);
    else create_run(files, config_toml);
  }
  comm.broadcast(stored.state_text);
  RunStart start;
  if (stored.state_text.empty()) {
    // The same on every rank: keyed by (seed, tensor name).
    backend.init_params(config.seed, config.init_perturbation);
    return start;
  }
  comm.broadcast(stored.path);
  for (auto* a : {&stored.params, &stored.m, &stored.v}) {
    a->resize(static_cast<std::size_t>(backend.layout().total()));
    comm.broadcast(*a);
  }
  start.state = state_from_json(nlohmann::json::parse(stored.state_text), stored.path);
  start.resumed = true;
  start.checkpoint = stored.path;
  backend.load_state(stored.params, stored.m, stored.v, start.state.step);
  if (comm.is_root() && fs::exists(files.metrics))
    fs::resize_file(files.metrics, static_cast<std::uintmax_t>(start.state.metrics_bytes));
  // model.safetensors is written after its checkpoint, so a process stopped between the two left
  // the weights of an earlier step (and perhaps a temporary). Rewritten here, it always holds the
  // weights of the checkpoint resumed from: also when nothing is left to train.
  if (comm.is_root())
    save_run_weights(files, config, backend.layout(), stored.params, start.state.step, tokenizer);
  // A run stopped between a checkpoint and the pruning after it left one too many; without this,
  // every such stop of the resumed runs would add one more. Later checkpoints (skipped because
  // they did not verify) stay until this run's next checkpoint replaces their steps.
  if (comm.is_root()) prune_checkpoints(files, config.keep_checkpoints, start.state.step, false);
  return start;
}

std::string tokenizer_mismatch(const std::map<std::string, std::string>& metadata, const std::string& path,
                               const data::Tokenizer& tokenizer, const std::string& data_dir) {
  const auto hash = metadata.find("tokenizer_hash");
  if (hash == metadata.end() || hash->second == tokenizer.content_hash()) return {};
  const auto named = metadata.find("tokenizer");
  return concat("'", path, "' was trained with a tokenizer of hash ", hash->second,
                named != metadata.end() ? " (" + named->second + ")" : std::string(), " but '", data_dir,
                "' was prepared with one of hash ", tokenizer.content_hash(), " (", tokenizer.spec(), ")");
}

std::optional<SafetensorsFile> checkpoint_as_weights(const SafetensorsFile& checkpoint, const std::string& path) {
  const auto tokenizer = checkpoint.metadata.find("tokenizer");
  if (tokenizer == checkpoint.metadata.end()) return std::nullopt;
  const ModelConfig config = weights_config(checkpoint, path);
  const ParamLayout layout(config);
  const StoredTensor& params = checkpoint.at("params", path);
  require(params.dtype == DType::F32 && params.numel() == layout.total(), "'", path,
          "': tensor 'params' does not match the model of its config (", layout.total(), " parameters)");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(checkpoint.metadata.at("state"));
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "': corrupt training state: ", e.what());
  }
  SafetensorsFile weights;
  weights.checksummed = checkpoint.checksummed;
  weights.metadata = {{"config", checkpoint.metadata.at("config")},
                      {"step", std::to_string(state_from_json(state, path).step)},
                      {"tokenizer", tokenizer->second}};
  // Checked by eval and sample against the tokenizer they use, as for model.safetensors.
  if (const auto hash = checkpoint.metadata.find("tokenizer_hash"); hash != checkpoint.metadata.end())
    weights.metadata["tokenizer_hash"] = hash->second;
  for (const ParamInfo& p : layout.params()) {
    StoredTensor& t = weights.tensors[p.name];
    t.dtype = DType::F32;
    t.shape = p.shape;
    const auto* first = params.bytes.data() + static_cast<std::size_t>(p.offset) * sizeof(float);
    t.bytes.assign(first, first + static_cast<std::size_t>(p.numel) * sizeof(float));
  }
  return weights;
}

}  // namespace attnres
