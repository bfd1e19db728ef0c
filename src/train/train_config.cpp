#include "train/train_config.hpp"

#include <cmath>
#include <sstream>
#include <toml++/toml.h>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

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
  require(batch_size >= 1, "train.batch_size must be at least 1 (got ", batch_size, ")");
  require(micro_batches >= 0, "train.micro_batches must be non-negative (0: one per process)");
  require(micro_batches == 0 || batch_size % micro_batches == 0, "train.batch_size (", batch_size,
          ") must be a multiple of train.micro_batches (", micro_batches, ")");
  require(seq_len >= 1, "train.seq_len must be at least 1 (got ", seq_len, ")");
  require(tokens >= tokens_per_step(), "train.tokens (", tokens, ") must cover at least one step of ",
          tokens_per_step(), " tokens");
  require(lr > 0 && lr < 1, "train.lr must be in (0, 1) (got ", lr, ")");
  require(min_lr_ratio >= 0 && min_lr_ratio <= 1, "train.min_lr_ratio must be in [0, 1]");
  require(warmup_fraction >= 0 && warmup_fraction < 1, "train.warmup_fraction must be in [0, 1)");
  require(decay_fraction > 0 && decay_fraction <= 1, "train.decay_fraction must be in (0, 1]");
  require(weight_decay >= 0, "train.weight_decay must be non-negative");
  require(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "train.beta1 and train.beta2 must be in [0, 1)");
  require(grad_clip >= 0, "train.grad_clip must be non-negative (0 disables clipping)");
  require(!milestones.empty(), "train.milestones must not be empty");
  for (std::size_t i = 0; i < milestones.size(); ++i) {
    require(milestones[i] > 0 && milestones[i] <= 1, "train.milestones must be fractions in (0, 1]");
    require(i == 0 || milestones[i] > milestones[i - 1], "train.milestones must increase");
  }
  require(eval_tokens >= seq_len + 1, "train.eval_tokens must be at least seq_len + 1");
  require(checkpoint_every >= 1, "train.checkpoint_every must be at least 1");
  require(threads >= 0, "train.threads must be non-negative");
  ModelConfig m = model;
  if (m.vocab_size == 0) m.vocab_size = 2;  // filled from the data later
  require(seq_len <= m.max_seq_len, "train.seq_len (", seq_len, ") exceeds model.max_seq_len (", m.max_seq_len, ")");
  m.validate();
}

std::vector<std::string> preset_names() { return {"tiny", "small", "S", "M"}; }

TrainConfig preset(const std::string& name) {
  TrainConfig c;
  ModelConfig& m = c.model;
  m.vocab_size = 0;
  m.residual = ResidualMode::block;
  if (name == "tiny") {
    m.d_model = 128;
    m.n_layers = 4;
    m.n_heads = 2;
    m.n_blocks = 4;
    c.batch_size = 8;
    c.seq_len = 128;
    c.tokens = 1 << 17;
    c.lr = 3e-3;
    c.eval_tokens = 1 << 14;
  } else if (name == "small") {
    m.d_model = 256;
    m.n_layers = 8;
    m.n_heads = 4;
    m.n_blocks = 4;
    c.batch_size = 16;
    c.seq_len = 256;
    c.tokens = 1 << 23;
    c.lr = 2e-3;
    c.eval_tokens = 1 << 17;
  } else if (name == "S") {
    m.vocab_size = 32000;
    m.d_model = 576;
    m.n_layers = 16;
    m.n_heads = 9;
    m.n_blocks = 8;
    c.batch_size = 64;
    c.seq_len = 1024;
    c.tokens = 2'000'000'000;
    c.lr = 1e-3;
    c.eval_tokens = 1 << 21;
    c.checkpoint_every = 1000;
  } else if (name == "M") {
    m.vocab_size = 32000;
    m.d_model = 832;
    m.n_layers = 24;
    m.n_heads = 13;
    m.n_blocks = 8;
    c.batch_size = 64;
    c.seq_len = 1024;
    c.tokens = 2'000'000'000;
    c.lr = 7.5e-4;
    c.eval_tokens = 1 << 21;
    c.checkpoint_every = 1000;
  } else {
    fail("unknown preset '", name, "' (expected tiny, small, S or M)");
  }
  m.mlp_hidden = 5 * m.d_model;
  m.max_seq_len = c.seq_len;
  return c;
}

namespace {

template <class T>
T get_value(const toml::node& node, const std::string& key, const std::string& where) {
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = node.value<bool>()) return *v;
    fail(where, ": '", key, "' must be true or false");
  } else if constexpr (std::is_integral_v<T>) {
    if (auto v = node.value<std::int64_t>()) return static_cast<T>(*v);
    fail(where, ": '", key, "' must be an integer");
  } else if constexpr (std::is_floating_point_v<T>) {
    if (auto v = node.value<double>()) return static_cast<T>(*v);
    fail(where, ": '", key, "' must be a number");
  } else {
    if (auto v = node.value<std::string>()) return *v;
    fail(where, ": '", key, "' must be a string");
  }
}

// One place that knows every key: sets `key` (e.g. "train.lr") from a TOML node.
void set_key(TrainConfig& c, const std::string& key, const toml::node& v, const std::string& where) {
  ModelConfig& m = c.model;
  auto i32 = [&] { return get_value<int>(v, key, where); };
  auto i64 = [&] { return get_value<std::int64_t>(v, key, where); };
  auto num = [&] { return get_value<double>(v, key, where); };
  auto str = [&] { return get_value<std::string>(v, key, where); };
  try {
    if (key == "model.vocab_size") m.vocab_size = i32();
    else if (key == "model.d_model") m.d_model = i32();
    else if (key == "model.n_layers") m.n_layers = i32();
    else if (key == "model.n_heads") m.n_heads = i32();
    else if (key == "model.mlp_hidden") m.mlp_hidden = i32();
    else if (key == "model.residual") m.residual = parse_residual_mode(str());
    else if (key == "model.n_blocks") m.n_blocks = i32();
    else if (key == "model.value_route") m.value_route = parse_value_route(str());
    else if (key == "model.tie_embeddings") m.tie_embeddings = get_value<bool>(v, key, where);
    else if (key == "model.norm_eps") m.norm_eps = num();
    else if (key == "model.rope_theta") m.rope_theta = num();
    else if (key == "model.max_seq_len") m.max_seq_len = i32();
    else if (key == "train.batch_size") c.batch_size = i32();
    else if (key == "train.micro_batches") c.micro_batches = i32();
    else if (key == "train.seq_len") {
      c.seq_len = i32();
      m.max_seq_len = std::max(m.max_seq_len, c.seq_len);
    } else if (key == "train.tokens") c.tokens = i64();
    else if (key == "train.lr") c.lr = num();
    else if (key == "train.min_lr_ratio") c.min_lr_ratio = num();
    else if (key == "train.warmup_fraction") c.warmup_fraction = num();
    else if (key == "train.decay") c.decay = parse_lr_decay(str());
    else if (key == "train.decay_fraction") c.decay_fraction = num();
    else if (key == "train.weight_decay") c.weight_decay = num();
    else if (key == "train.beta1") c.beta1 = num();
    else if (key == "train.beta2") c.beta2 = num();
    else if (key == "train.grad_clip") c.grad_clip = num();
    else if (key == "train.seed") c.seed = static_cast<std::uint64_t>(i64());
    else if (key == "train.data_seed") c.data_seed = static_cast<std::uint64_t>(i64());
    else if (key == "train.eval_tokens") c.eval_tokens = i64();
    else if (key == "train.checkpoint_every") c.checkpoint_every = i32();
    else if (key == "train.threads") c.threads = i32();
    else if (key == "train.precision") c.precision = kernels::parse_matmul_precision(str());
    else if (key == "train.milestones") {
      const toml::array* arr = v.as_array();
      require(arr != nullptr, where, ": 'train.milestones' must be an array of fractions, e.g. [0.5, 1.0]");
      c.milestones.clear();
      for (const auto& e : *arr) c.milestones.push_back(get_value<double>(e, key, where));
    } else {
      fail(where, ": unknown config key '", key, "'");
    }
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(where) == 0) throw;
    fail(where, ": '", key, "': ", msg);
  }
}

void apply_table(TrainConfig& c, const toml::table& root, const std::string& where) {
  for (const auto& [section, node] : root) {
    const std::string s(section.str());
    const toml::table* t = node.as_table();
    require(t != nullptr && (s == "model" || s == "train"), where, ": unknown config key '", s,
            "' (expected [model] and [train] tables)");
    for (const auto& [key, value] : *t) set_key(c, s + "." + std::string(key.str()), value, where);
  }
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
  require(key.find('.') != std::string::npos, where, ": key '", key, "' must be section.key, e.g. train.lr");
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
  set_key(c, key, *parsed.get("v"), where);
}

void apply_toml_file(TrainConfig& c, const std::string& path) {
  toml::table root;
  try {
    root = toml::parse(read_text_file(path), path);
  } catch (const toml::parse_error& e) {
    fail(path, ":", e.source().begin.line, ": ", e.description());
  }
  apply_table(c, root, path);
}

std::string to_toml(const TrainConfig& c) {
  const ModelConfig& m = c.model;
  std::ostringstream o;
  o.precision(17);
  o << "[model]\n"
    << "vocab_size = " << m.vocab_size << "\nd_model = " << m.d_model << "\nn_layers = " << m.n_layers
    << "\nn_heads = " << m.n_heads << "\nmlp_hidden = " << m.mlp_hidden << "\nresidual = \"" << to_string(m.residual)
    << "\"\nn_blocks = " << m.n_blocks << "\nvalue_route = \"" << to_string(m.value_route)
    << "\"\ntie_embeddings = " << (m.tie_embeddings ? "true" : "false") << "\nnorm_eps = " << m.norm_eps
    << "\nrope_theta = " << m.rope_theta << "\nmax_seq_len = " << m.max_seq_len << "\n\n[train]\n"
    << "batch_size = " << c.batch_size << "\nseq_len = " << c.seq_len << "\ntokens = " << c.tokens
    << "\nlr = " << c.lr << "\nmin_lr_ratio = " << c.min_lr_ratio << "\nwarmup_fraction = " << c.warmup_fraction
    << "\ndecay = \"" << to_string(c.decay) << "\"\ndecay_fraction = " << c.decay_fraction
    << "\nweight_decay = " << c.weight_decay << "\nbeta1 = " << c.beta1 << "\nbeta2 = " << c.beta2
    << "\ngrad_clip = " << c.grad_clip << "\nseed = " << c.seed << "\ndata_seed = " << c.data_seed
    << "\nmilestones = [";
  for (std::size_t i = 0; i < c.milestones.size(); ++i) o << (i ? ", " : "") << c.milestones[i];
  o << "]\neval_tokens = " << c.eval_tokens << "\ncheckpoint_every = " << c.checkpoint_every
    << "\nthreads = " << c.threads << "\n";
  // Keys added later are written only when set, so runs started before them still resume (their
  // config text, compared on resume, is unchanged).
  if (c.micro_batches != 0) o << "micro_batches = " << c.micro_batches << "\n";
  if (c.precision != kernels::MatmulPrecision::fp32) o << "precision = \"" << kernels::to_string(c.precision) << "\"\n";
  return o.str();
}

}  // namespace attnres
