// Training configuration: presets, TOML files and `--set key=value` overrides, validated
// strictly (an unknown key or an out-of-range value is an error naming the key).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/precision.hpp"
#include "model/config.hpp"
#include "optim/adamw.hpp"

namespace attnres {

struct TrainConfig {
  ModelConfig model;              // model.vocab_size = 0: take it from the data's tokenizer
  int batch_size = 8;             // sequences per step
  // The global batch is computed as this many equal micro-batches whose gradients are summed in a
  // fixed tree order (gradient accumulation; under MPI the ranks share them). 0: one per process.
  int micro_batches = 0;
  int seq_len = 128;              // tokens per sequence
  std::int64_t tokens = 1 << 20;  // training budget
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  double warmup_fraction = 0.05;  // of the steps
  LrDecay decay = LrDecay::cosine;
  double decay_fraction = 0.2;  // wsd only
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 1.0;
  std::uint64_t seed = 1;       // initialisation
  std::uint64_t data_seed = 1;  // batch order
  // A twin of a run (the noise floor, docs/experiments.md): every initial weight w becomes
  // w·(1 + init_perturbation·ξ), ξ ~ N(0, 1) from a stream of its own per (seed, tensor). 0: none.
  double init_perturbation = 0;
  std::vector<double> milestones = {0.125, 0.25, 0.5, 1.0};  // fractions of `tokens`
  std::int64_t eval_tokens = 1 << 16;                        // validation tokens per evaluation
  int checkpoint_every = 200;                                // steps
  int keep_checkpoints = 2;                                  // the newest this many are kept
  int threads = 0;                                           // 0: all cores
  kernels::MatmulPrecision precision = kernels::MatmulPrecision::fp32;  // Linear GEMMs: fp32 or bf16

  std::int64_t tokens_per_step() const { return std::int64_t(batch_size) * seq_len; }
  std::int64_t total_steps() const { return tokens / tokens_per_step(); }
  std::vector<std::int64_t> milestone_steps() const;  // step counts after which to evaluate
  LrSchedule schedule() const;
  AdamWConfig adamw() const;

  void validate() const;  // throws Error naming the key
};

// The presets: tiny (tests, demo), small (an hour on a CPU), S (~120M) and M (~343M).
std::vector<std::string> preset_names();
TrainConfig preset(const std::string& name);

// Every key of a training configuration: the model's (section "model") then "train", in the
// order config files list them. The one list behind --set, TOML files, to_toml, the comparison
// on resume and the key table of docs/training.md.
const ConfigKeys<TrainConfig>& train_config_keys();

// Applies one "section.key = value" setting (TOML syntax for the value), e.g.
// "model.residual=rd", "train.lr=1e-3", "train.milestones=[0.5, 1.0]".
void apply_setting(TrainConfig& config, const std::string& assignment, const std::string& where);
// Reads a TOML file with [model] and [train] tables over the given base config. Errors (unknown
// keys, wrong types, bad values) name the file and line.
void apply_toml_file(TrainConfig& config, const std::string& path);
// The keys a TOML config file sets ("section.key"), each with where ("FILE:LINE"), in file order,
// without applying them (errors in their values are apply_toml_file's to report).
struct KeyLocation {
  std::string key;
  std::string where;
};
std::vector<KeyLocation> toml_file_keys(const std::string& path);
// A configuration stored as TOML text (config.toml, a checkpoint's state) over the preset-free
// defaults: keys the text lacks (it was written before they existed) take their defaults.
// `source` names the text in errors.
TrainConfig parse_toml_config(const std::string& text, const std::string& source);

std::string to_toml(const TrainConfig& config);  // every key: a complete config file

// The key table for people: key, type and range, the preset-free default, the tiny preset's
// value (what --config files apply over) and the help line. Markdown is the table of
// docs/training.md; text is what `attnres config --keys` prints.
std::string config_key_table_markdown();
std::string config_key_table_text();
// `document` (docs/training.md) with the table between its "<!-- begin config keys ... -->" and
// "<!-- end config keys -->" lines replaced by config_key_table_markdown().
std::string with_config_key_table(const std::string& document, const std::string& source);

}  // namespace attnres
