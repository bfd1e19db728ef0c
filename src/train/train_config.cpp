#include "train/train_config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <toml++/toml.h>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres {

std::vector<std::int64_t> TrainConfig::milestone_steps() const {
  std::vector<std::int64_t> steps;
  for (double f : milestones) {
    const auto s = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(f * double(total_steps()))));
    if (steps.empty() || s > steps.back()) steps.push_back(s);
  }
  return steps;
}

LrSchedule TrainConfig::schedule() const {
  LrSchedule s;
  s.max_lr = lr;
  s.min_lr_ratio = min_lr_ratio;
  s.warmup_steps = static_cast<std::int64_t>(std::llround(warmup_fraction * double(total_steps())));
  s.total_steps = total_steps();
  s.decay = decay;
  s.decay_fraction = decay_fraction;
  return s;
}

AdamWConfig TrainConfig::adamw() const { return AdamWConfig{beta1, beta2, 1e-8, weight_decay}; }

void TrainConfig::validate() const {
  check_config_ranges(train_config_keys(), *this);  // first, so a value out of range is the error named
  require(micro_batches == 0 || batch_size % micro_batches == 0, "train.batch_size (", batch_size,
          ") must be a multiple of train.micro_batches (", micro_batches, ")");
  require(tokens >= tokens_per_step(), "train.tokens (", tokens, ") must cover at least one step of ",
          tokens_per_step(), " tokens");
  require(!milestones.empty(), "train.milestones must not be empty");
  for (std::size_t i = 1; i < milestones.size(); ++i)
    require(milestones[i] > milestones[i - 1], "train.milestones must increase");
  require(eval_tokens >= seq_len + 1, "train.eval_tokens must be at least seq_len + 1");
  ModelConfig m = model;
  if (m.vocab_size == 0) m.vocab_size = 2;  // filled from the data later
  require(seq_len <= m.max_seq_len, "train.seq_len (", seq_len, ") exceeds model.max_seq_len (", m.max_seq_len, ")");
  m.validate();
}

namespace {

// The presets (docs/training.md): Block AttnRes at four sizes, SwiGLU of 5 d_model, max_seq_len =
// seq_len. vocab_size 0: taken from the data's tokenizer.
struct Preset {
  const char* name;
  int vocab_size, d_model, n_layers, n_heads, n_blocks;
  int batch_size, seq_len;
  std::int64_t tokens;
  double lr;
  std::int64_t eval_tokens;
  int checkpoint_every;  // 0: the default
};

// clang-format off
constexpr Preset kPresets[] = {
    // name   vocab  d_model layers heads blocks batch  seq   tokens         lr      eval_tokens checkpoint_every
    {"tiny",  0,     128,    4,     2,    4,     8,     128,  1 << 17,       3e-3,   1 << 14,    0},
    {"small", 0,     256,    8,     4,    4,     16,    256,  1 << 23,       2e-3,   1 << 17,    0},
    {"S",     32000, 576,    16,    9,    8,     64,    1024, 2'000'000'000, 1e-3,   1 << 21,    1000},
    {"M",     32000, 832,    24,    13,   8,     64,    1024, 2'000'000'000, 7.5e-4, 1 << 21,    1000},
};
// clang-format on

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

TrainConfig preset(const std::string& name) {
  const Preset* p = nullptr;
  for (const Preset& row : kPresets)
    if (name == row.name) p = &row;
  if (p == nullptr) {
    std::string list;
    for (const std::string& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    fail("unknown preset '", name, "' (expected one of ", list, ")", did_you_mean(name, preset_names()));
  }
  TrainConfig c;
  ModelConfig& m = c.model;
  m.vocab_size = p->vocab_size;
  m.d_model = p->d_model;
  m.n_layers = p->n_layers;
  m.n_heads = p->n_heads;
  m.n_blocks = p->n_blocks;
  m.mlp_hidden = 5 * p->d_model;
  c.batch_size = p->batch_size;
  c.seq_len = p->seq_len;
  m.max_seq_len = p->seq_len;
  c.tokens = p->tokens;
  c.lr = p->lr;
  c.eval_tokens = p->eval_tokens;
  if (p->checkpoint_every > 0) c.checkpoint_every = p->checkpoint_every;
  return c;
}

const ConfigKeys<TrainConfig>& train_config_keys() {
  using T = TrainConfig;
  static const ConfigKeys<TrainConfig> keys = [] {
    ConfigKeys<T> all = nested_config_keys(model_config_keys(), &T::model);
    ConfigKeys<T> train = config_section<T>(
        "train",
        {
            config_field("batch_size", &T::batch_size, ">= 1", "sequences per step"),
            config_field("micro_batches", &T::micro_batches, ">= 0",
                         "split each batch into this many micro-batches whose gradients are summed (gradient "
                         "accumulation; under MPI shared by the ranks, docs/distributed.md). 0: one per process"),
            with_effect(config_field("seq_len", &T::seq_len, ">= 1",
                                     "tokens per sequence (raises model.max_seq_len to at least this)"),
                        [](T& c) { c.model.max_seq_len = std::max(c.model.max_seq_len, c.seq_len); }),
            config_field("tokens", &T::tokens, "",
                         "training budget: steps = tokens / (batch_size·seq_len), at least one"),
            config_field("lr", &T::lr, "(0, 1)", "peak learning rate"),
            config_field("min_lr_ratio", &T::min_lr_ratio, "[0, 1]", "the schedule's floor = ratio · peak"),
            config_field("warmup_fraction", &T::warmup_fraction, "[0, 1)",
                         "linear warmup over this fraction of the steps"),
            config_choice("decay", &T::decay, kLrDecays,
                          "after warmup: cosine to the floor, wsd (warmup-stable-decay: linear over the last "
                          "decay_fraction of the steps) or constant"),
            config_field("decay_fraction", &T::decay_fraction, "(0, 1]", "wsd: the share of steps that decay"),
            config_field("weight_decay", &T::weight_decay, ">= 0",
                         "AdamW decoupled weight decay, on matrices only (never norms or pseudo-queries)"),
            config_field("beta1", &T::beta1, "[0, 1)", "AdamW first-moment decay"),
            config_field("beta2", &T::beta2, "[0, 1)", "AdamW second-moment decay"),
            config_field("grad_clip", &T::grad_clip, ">= 0", "global gradient-norm clipping (0: off)"),
            config_field("seed", &T::seed, "", "initialisation"),
            config_field("data_seed", &T::data_seed, "", "batch order"),
            config_field("init_perturbation", &T::init_perturbation, "[0, 0.01]",
                         "relative size of a seeded perturbation of every initial weight, w·(1 + ε·N(0, 1)), from "
                         "a stream of its own: makes the run a twin of the unperturbed one, differing as rounding "
                         "would (the noise floor of an experiment: arm suffix ~, docs/experiments.md); 0: none"),
            config_field("milestones", &T::milestones, "(0, 1]",
                         "increasing fractions of the budget after which validation NLL is measured"),
            config_field("eval_tokens", &T::eval_tokens, "",
                         "validation tokens per measurement (the split's first windows), at least seq_len + 1"),
            config_field("checkpoint_every", &T::checkpoint_every, ">= 1",
                         "steps between checkpoints (and one at the end)"),
            config_field("keep_checkpoints", &T::keep_checkpoints, ">= 1",
                         "checkpoints kept in the run directory (the newest; --resume takes the newest that "
                         "verifies)"),
            config_field("threads", &T::threads, ">= 0",
                         "OpenMP/OpenBLAS threads (0: OMP_NUM_THREADS if set, else all cores, shared among the "
                         "MPI ranks on a machine)"),
            config_choice("precision", &T::precision, kernels::kMatmulPrecisions,
                          "the Linear GEMMs (Q, K, V, O, SwiGLU, LM head) and attention's products; bf16: "
                          "bf16-rounded operands, fp32 accumulation and softmax statistics, on AMX or AVX-512 "
                          "when the CPU has them; weights, gradients, optimizer and depth routing stay fp32 "
                          "(docs/performance.md)"),
        });
    for (auto& k : train) all.push_back(std::move(k));
    return all;
  }();
  return keys;
}

namespace {

// The value of a TOML node as `type` (toml++'s permissive conversions, e.g. 2 as a number).
std::optional<ConfigValue> value_of(const toml::node& node, ConfigType type) {
  switch (type) {
    case ConfigType::boolean:
      if (auto v = node.value<bool>()) return *v;
      break;
    case ConfigType::integer:
      if (auto v = node.value<std::int64_t>()) return *v;
      break;
    case ConfigType::number:
      if (auto v = node.value<double>()) return *v;
      break;
    case ConfigType::choice:
      if (auto v = node.value<std::string>()) return *v;
      break;
    case ConfigType::numbers:
      if (const toml::array* array = node.as_array()) {
        std::vector<double> list;
        for (const auto& e : *array) {
          const auto v = e.value<double>();
          if (!v) return std::nullopt;
          list.push_back(*v);
        }
        return list;
      }
      break;
  }
  return std::nullopt;
}

void set_key(TrainConfig& c, const std::string& section, const std::string& name, const toml::node& node,
             const std::string& where) {
  const ConfigKey<TrainConfig>* key = find_config_key(train_config_keys(), section, name);
  if (key == nullptr) {
    std::vector<std::string> paths;
    for (const auto& k : train_config_keys()) paths.push_back(k.path());
    fail(where, ": unknown config key '", section, ".", name, "'", did_you_mean(section + "." + name, paths));
  }
  const std::optional<ConfigValue> value = value_of(node, key->type);
  require(value.has_value(), where, ": '", key->path(), "' must be ", type_phrase(key->type));
  set_config_value(c, *key, *value, where);
}

// Applies the [model] and [train] tables of a parsed file; errors name `source`:LINE.
void apply_table(TrainConfig& c, const toml::table& root, const std::string& source) {
  auto where = [&](const toml::node& node) { return concat(source, ":", node.source().begin.line); };
  const auto& keys = train_config_keys();
  for (const auto& [section_key, node] : root) {
    const std::string section(section_key.str());
    std::vector<std::string> sections;
    for (const auto& k : keys)
      if (std::find(sections.begin(), sections.end(), k.section) == sections.end()) sections.push_back(k.section);
    const bool known = std::find(sections.begin(), sections.end(), section) != sections.end();
    require(node.is_table() && known, where(node), ": unknown config key '", section,
            "' (expected [model] and [train] tables)", known ? "" : did_you_mean(section, sections));
    const toml::table* table = node.as_table();
    for (const auto& [key, value] : *table) set_key(c, section, std::string(key.str()), value, where(value));
  }
}

void apply_toml_text(TrainConfig& c, const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail(source, ":", e.source().begin.line, ": ", e.description());
  }
  apply_table(c, root, source);
}

}  // namespace

void apply_setting(TrainConfig& c, const std::string& assignment, const std::string& where) {
  const auto eq = assignment.find('=');
  require(eq != std::string::npos, where, ": expected key=value, got '", assignment, "'");
  auto trim = [](std::string s) {
    const auto a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
    return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
  };
  const std::string key = trim(assignment.substr(0, eq));
  std::string value = trim(assignment.substr(eq + 1));
  const auto dot = key.find('.');
  require(dot != std::string::npos, where, ": key '", key, "' must be section.key, e.g. train.lr");
  // Bare words are strings: --set model.residual=rd.
  const bool bare = !value.empty() && std::isalpha(static_cast<unsigned char>(value[0])) && value != "true" &&
                    value != "false" && value != "inf" && value != "nan";
  if (bare) value = "\"" + value + "\"";
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    fail(where, ": cannot parse the value of '", key, "': ", e.description());
  }
  set_key(c, key.substr(0, dot), key.substr(dot + 1), *parsed.get("v"), where);
}

void apply_toml_file(TrainConfig& c, const std::string& path) { apply_toml_text(c, read_text_file(path), path); }

std::vector<KeyLocation> toml_file_keys(const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(read_text_file(path), path);
  } catch (const toml::parse_error& e) {
    fail(path, ":", e.source().begin.line, ": ", e.description());
  }
  std::vector<KeyLocation> keys;
  for (const auto& [section, node] : root)
    if (const toml::table* table = node.as_table())
      for (const auto& [key, value] : *table)
        keys.push_back({concat(section.str(), ".", key.str()), concat(path, ":", value.source().begin.line)});
  return keys;
}

TrainConfig parse_toml_config(const std::string& text, const std::string& source) {
  TrainConfig c;
  apply_toml_text(c, text, source);
  return c;
}

std::string to_toml(const TrainConfig& c) {
  std::string out, section;
  for (const auto& k : train_config_keys()) {
    if (k.section != section) {
      out += (section.empty() ? "[" : "\n[") + k.section + "]\n";
      section = k.section;
    }
    out += k.name + " = " + toml_literal(k.get(c)) + "\n";
  }
  return out;
}

namespace {

const char* const kTableBegin = "<!-- begin config keys";
const char* const kTableEnd = "<!-- end config keys -->";

std::string type_text(const ConfigKey<TrainConfig>& k, bool markdown) {
  std::string t;
  switch (k.type) {
    case ConfigType::boolean: t = "boolean"; break;
    case ConfigType::integer: t = "integer"; break;
    case ConfigType::number: t = "number"; break;
    case ConfigType::numbers: t = "list of numbers"; break;
    case ConfigType::choice:
      for (std::size_t i = 0; i < k.choices.size(); ++i)
        t += (i ? markdown ? ", " : " | " : "") + (markdown ? "`" + k.choices[i] + "`" : k.choices[i]);
      break;
  }
  if (!k.range.empty()) {
    const char first = k.range.text().front();
    t += (first == '[' || first == '(' ? " in " : " ") + k.range.text();
  }
  return t;
}

std::string value_text(const ConfigKey<TrainConfig>& k, const TrainConfig& c, bool markdown) {
  const ConfigValue v = k.get(c);
  if (k.type == ConfigType::choice) return markdown ? "`" + std::get<std::string>(v) + "`" : std::get<std::string>(v);
  return toml_literal(v);
}

}  // namespace

std::string config_key_table_markdown() {
  const TrainConfig defaults, tiny = preset("tiny");
  std::string out = "| key | type | default | tiny | meaning |\n|---|---|---|---|---|\n";
  for (const auto& k : train_config_keys())
    out += "| `" + k.path() + "` | " + type_text(k, true) + " | " + value_text(k, defaults, true) + " | " +
           value_text(k, tiny, true) + " | " + k.help + " |\n";
  return out;
}

std::string config_key_table_text() {
  const TrainConfig defaults, tiny = preset("tiny");
  std::vector<std::array<std::string, 5>> rows = {{"key", "type", "default", "tiny", "meaning"}};
  for (const auto& k : train_config_keys())
    rows.push_back({k.path(), type_text(k, false), value_text(k, defaults, false), value_text(k, tiny, false), k.help});
  std::array<std::size_t, 4> width{};
  for (const auto& r : rows)
    for (std::size_t i = 0; i < width.size(); ++i) width[i] = std::max(width[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < width.size(); ++i) out += r[i] + std::string(width[i] + 2 - r[i].size(), ' ');
    out += r[4] + "\n";
  }
  return out;
}

std::string with_config_key_table(const std::string& document, const std::string& source) {
  const auto begin = document.find(kTableBegin);
  const auto end = document.find(kTableEnd);
  require(begin != std::string::npos && end != std::string::npos && begin < end, "'", source, "' has no '",
          kTableBegin, " ... -->' / '", kTableEnd, "' markers around the config key table");
  const auto body = document.find('\n', begin);
  require(body != std::string::npos && body < end, "'", source,
          "': the config key table's begin marker must end its line");
  return document.substr(0, body + 1) + config_key_table_markdown() + document.substr(end);
}

}  // namespace attnres
