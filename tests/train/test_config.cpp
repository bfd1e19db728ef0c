// The configuration key table and everything it drives: --set, TOML files (errors with file and
// line), to_toml, the model's JSON, the comparison on resume, ranges, `attnres config` and the
// key table of docs/training.md. Every test loops over the table, so a new key is covered by
// adding it to the table.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/cli_util.hpp"
#include "model/family.hpp"
#include "train/train_config.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

// A value of `key`'s type different from `v` (doubles with no short decimal form, so a round
// trip that loses digits fails).
ConfigValue other_value(const ConfigKey<TrainConfig>& key, const ConfigValue& v) {
  switch (key.type) {
    case ConfigType::boolean: return !std::get<bool>(v);
    // Values stay in the key's range: set_config_value checks it.
    case ConfigType::integer: {
      const std::int64_t x = std::get<std::int64_t>(v);
      return key.range.empty() || key.range.contains(double(x + 3)) ? x + 3 : x - 1;
    }
    case ConfigType::number: {
      const double x = std::get<double>(v);
      for (double other : {x + 0.1, x - 0.05, x + 0.001})  // the last for narrow ranges ([0, 0.01])
        if (key.range.empty() || key.range.contains(other)) return other;
      return x;
    }
    case ConfigType::numbers: return std::vector<double>{0.1, 1.0 / 3.0, 1.0};
    case ConfigType::choice: {
      const auto& c = key.choices;
      const auto it = std::find(c.begin(), c.end(), std::get<std::string>(v));
      return c[(static_cast<std::size_t>(it - c.begin()) + 1) % c.size()];
    }
  }
  return v;
}

// Changes of a model key's value `v`, to try in turn for one that is still a valid model.
std::vector<ConfigValue> model_changes(const ConfigKey<ModelConfig>& k, const ConfigValue& v) {
  switch (k.type) {
    case ConfigType::integer: return {std::get<std::int64_t>(v) * 2, std::get<std::int64_t>(v) * 3};
    case ConfigType::number: return {std::get<double>(v) * 2 + 0.1};
    case ConfigType::boolean: return {!std::get<bool>(v)};
    case ConfigType::numbers: return {std::vector<double>{0.1, 0.2}};
    case ConfigType::choice: {
      std::vector<ConfigValue> out;
      for (const auto& c : k.choices)
        if (c != std::get<std::string>(v)) out.emplace_back(std::in_place_type<std::string>, c);
      return out;
    }
  }
  return {};
}

// Every key set to another value than the default.
TrainConfig all_changed() {
  TrainConfig c;
  for (const auto& k : train_config_keys()) k.set(c, other_value(k, k.get(TrainConfig{})));
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// What the code before the key table wrote as config.toml for the tiny preset: no
// micro_batches and precision (written only when set), keys in another order.
const char* const kOldTinyToml = R"([model]
vocab_size = 0
d_model = 128
n_layers = 4
n_heads = 2
mlp_hidden = 640
residual = "block"
n_blocks = 4
value_route = "decoupled"
tie_embeddings = true
norm_eps = 9.9999999999999995e-07
rope_theta = 10000
max_seq_len = 128

[train]
batch_size = 8
seq_len = 128
tokens = 131072
lr = 0.0030000000000000001
min_lr_ratio = 0.10000000000000001
warmup_fraction = 0.050000000000000003
decay = "cosine"
decay_fraction = 0.20000000000000001
weight_decay = 0.10000000000000001
beta1 = 0.90000000000000002
beta2 = 0.94999999999999996
grad_clip = 1
seed = 1
data_seed = 1
milestones = [0.125, 0.25, 0.5, 1]
eval_tokens = 16384
checkpoint_every = 200
threads = 0
)";

}  // namespace

TEST(ConfigKeys, TheTableIsWellFormed) {
  const auto& keys = train_config_keys();
  ASSERT_FALSE(keys.empty());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& k = keys[i];
    EXPECT_TRUE(k.section == "model" || k.section == "train") << k.path();
    EXPECT_FALSE(k.help.empty()) << k.path();
    EXPECT_EQ(k.help.find('\n'), std::string::npos) << k.path() << ": help must be one line";
    EXPECT_EQ(k.help.find('|'), std::string::npos) << k.path() << ": '|' breaks the docs table";
    EXPECT_EQ(k.type == ConfigType::choice, !k.choices.empty()) << k.path();
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(keys[j].path(), k.path()) << "listed twice";
  }
  // The model's keys are the model table's, in its order.
  const auto& model = model_config_keys();
  ASSERT_LE(model.size(), keys.size());
  for (std::size_t i = 0; i < model.size(); ++i) EXPECT_EQ(keys[i].path(), model[i].path());
  // Every preset, and the defaults, pass their own ranges.
  for (const auto& name : preset_names()) EXPECT_NO_THROW(preset(name).validate()) << name;
}

TEST(Presets, KeepTheirDocumentedShapes) {
  // docs/training.md's preset table; a change here changes every study that names a preset.
  const TrainConfig tiny = preset("tiny"), small = preset("small"), s = preset("S"), m = preset("M");
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"tiny", "small", "S", "M"}));
  EXPECT_EQ(tiny.model.d_model, 128);
  EXPECT_EQ(tiny.model.n_layers, 4);
  EXPECT_EQ(tiny.model.vocab_size, 0);  // from the data
  EXPECT_EQ(tiny.checkpoint_every, TrainConfig{}.checkpoint_every);
  EXPECT_EQ(small.tokens, std::int64_t{1} << 23);
  EXPECT_EQ(s.model.d_model, 576);
  EXPECT_EQ(s.model.n_heads, 9);
  EXPECT_EQ(s.model.mlp_hidden, 5 * 576);
  EXPECT_EQ(s.model.max_seq_len, 1024);
  EXPECT_EQ(s.model.vocab_size, 32000);
  EXPECT_EQ(s.tokens, 2'000'000'000);
  EXPECT_EQ(s.checkpoint_every, 1000);
  EXPECT_DOUBLE_EQ(m.lr, 7.5e-4);
  EXPECT_EQ(m.model.n_layers, 24);
  EXPECT_EQ(m.model.residual, ResidualMode::block);
}

TEST(Presets, AnUnknownNameListsThemAndSuggestsTheClosest) {
  try {
    preset("smal");
    FAIL() << "an unknown preset was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("unknown preset 'smal' (expected one of tiny, small, S, M)"), std::string::npos) << what;
    EXPECT_NE(what.find("small"), what.rfind("small")) << "no suggestion: " << what;
  }
}

TEST(ConfigKeys, TomlRoundTripOfEveryKey) {
  const TrainConfig changed = all_changed();
  // The generator does change every key, so the round trip below checks each of them.
  EXPECT_EQ(config_differences(train_config_keys(), TrainConfig{}, changed).size(), train_config_keys().size());
  const std::string text = to_toml(changed);
  for (const auto& k : train_config_keys())
    EXPECT_NE(text.find("\n" + k.name + " = " + toml_literal(k.get(changed)) + "\n"), std::string::npos)
        << k.path() << " is not written:\n" << text;
  const TrainConfig back = parse_toml_config(text, "round trip");
  EXPECT_EQ(describe_differences(config_differences(train_config_keys(), changed, back), "written", "read"), "");
  EXPECT_EQ(to_toml(back), text);
  // The same through a file, over another base: the file sets every key.
  TempDir dir("attnres_config_roundtrip");
  std::ofstream(dir.path() / "c.toml") << text;
  TrainConfig from_file = preset("M");
  apply_toml_file(from_file, dir.str("c.toml"));
  EXPECT_EQ(describe_differences(config_differences(train_config_keys(), changed, from_file), "written", "read"), "");
}

TEST(ConfigKeys, EveryKeyIsSettableWithSet) {
  for (const auto& k : train_config_keys()) {
    const TrainConfig base;
    const ConfigValue want = other_value(k, k.get(base));
    for (const std::string& text : {toml_literal(want), "  " + toml_literal(want) + "  "}) {
      TrainConfig c = base;
      apply_setting(c, k.path() + " = " + text, "--set");
      EXPECT_EQ(k.get(c), want) << k.path() << "=" << text;
      const auto diff = config_differences(train_config_keys(), base, c);
      ASSERT_EQ(diff.size(), 1u) << k.path() << "=" << text << ": " << describe_differences(diff, "before", "after");
      EXPECT_EQ(diff[0].key, k.path());
    }
    if (k.type == ConfigType::choice) {  // bare words are strings
      TrainConfig c = base;
      apply_setting(c, k.path() + "=" + std::get<std::string>(want), "--set");
      EXPECT_EQ(k.get(c), want) << k.path();
    }
    // A value of another type names the source and the key.
    const std::string wrong = k.type == ConfigType::choice || k.type == ConfigType::numbers ? "1" : "\"x\"";
    TrainConfig c = base;
    const std::string msg = error_of([&] { apply_setting(c, k.path() + "=" + wrong, "--set " + k.path()); });
    EXPECT_NE(msg.find("--set " + k.path() + ": '" + k.path() + "' must be " + type_phrase(k.type)), std::string::npos)
        << msg;
  }
  // train.seq_len raises model.max_seq_len to itself, as before the table.
  TrainConfig c;
  apply_setting(c, "train.seq_len=1000", "--set");
  EXPECT_EQ(c.model.max_seq_len, 1000);
  apply_setting(c, "train.seq_len=10", "--set");
  EXPECT_EQ(c.model.max_seq_len, 1000);
}

TEST(ConfigKeys, IntegersOutsideTheFieldsTypeAreErrors) {
  TrainConfig c;
  const std::string msg = error_of([&] { apply_setting(c, "train.batch_size=4294967304", "--set"); });
  EXPECT_NE(msg.find("'train.batch_size': must be an integer from -2147483648 to 2147483647"), std::string::npos)
      << msg;
  EXPECT_EQ(c.batch_size, TrainConfig{}.batch_size);
  EXPECT_NE(error_of([&] { apply_setting(c, "train.seed=-1", "--set"); }).find("'train.seed'"), std::string::npos);
  apply_setting(c, "train.tokens=4294967304", "--set");  // an int64 field takes it
  EXPECT_EQ(c.tokens, 4294967304);
}

TEST(ConfigKeys, OutOfRangeValuesNameTheKey) {
  // For every key with a range: a value outside it is refused by validate(), naming the key.
  const std::vector<double> candidates = {-1e9, -1, 0, 0.5, 1, 2, 1e9};
  int checked = 0;
  for (const auto& k : train_config_keys()) {
    if (k.range.empty()) continue;
    const auto bad = std::find_if(candidates.begin(), candidates.end(), [&](double x) { return !k.range.contains(x); });
    ASSERT_NE(bad, candidates.end()) << k.path();
    TrainConfig c = preset("tiny");
    if (k.type == ConfigType::integer) k.set(c, static_cast<std::int64_t>(*bad));
    else if (k.type == ConfigType::number) k.set(c, *bad);
    else k.set(c, std::vector<double>{*bad});
    const std::string msg = error_of([&] { c.validate(); });
    EXPECT_EQ(msg.rfind(k.path(), 0), 0u) << k.path() << " = " << *bad << ": " << msg;
    EXPECT_NE(msg.find(k.range.requirement()), std::string::npos) << msg;
    ++checked;
  }
  EXPECT_GE(checked, 20);
  TrainConfig c = preset("tiny");
  c.lr = std::nan("");
  EXPECT_NE(error_of([&] { c.validate(); }).find("train.lr must be in (0, 1) (got nan)"), std::string::npos);
}

TEST(ConfigKeys, FileErrorsNameTheFileAndLine) {
  TempDir dir("attnres_config_errors");
  auto error_in = [&](const std::string& text) {
    std::ofstream(dir.path() / "c.toml") << text;
    TrainConfig c = preset("tiny");
    return error_of([&] { apply_toml_file(c, dir.str("c.toml")); });
  };
  const std::string file = dir.str("c.toml");
  std::string msg = error_in("[train]\nlr = 1e-3\nunknown_key = 4\n");
  EXPECT_NE(msg.find(file + ":3: unknown config key 'train.unknown_key'"), std::string::npos) << msg;
  msg = error_in("[model]\nd_model = 64\n\nresidual = 3\n");
  EXPECT_NE(msg.find(file + ":4: 'model.residual' must be a string"), std::string::npos) << msg;
  msg = error_in("[train]\nmilestones = [0.5, \"x\"]\n");
  EXPECT_NE(msg.find(file + ":2: 'train.milestones' must be an array of numbers"), std::string::npos) << msg;
  msg = error_in("[model]\nresidual = \"blocky\"\n");
  EXPECT_NE(msg.find(file + ":2: 'model.residual': unknown value 'blocky' (expected prenorm, full, block, rd, "
                     "denseformer, hc, mhc, mudd, delta, delta_block or gr)"),
            std::string::npos)
      << msg;
  msg = error_in("[optimizer]\nlr = 1\n");
  EXPECT_NE(msg.find(file + ":1: unknown config key 'optimizer'"), std::string::npos) << msg;
  msg = error_in("[train]\nlr = = 1\n");
  EXPECT_NE(msg.find(file + ":2: "), std::string::npos) << msg;  // a TOML syntax error
}

TEST(ConfigKeys, UnknownKeysAndValuesSuggestTheClosest) {
  TrainConfig c;
  EXPECT_NE(error_of([&] { apply_setting(c, "model.d_modl=64", "--set"); })
                .find("--set: unknown config key 'model.d_modl'; did you mean 'model.d_model'?"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_setting(c, "modle.d_model=64", "--set"); }).find("did you mean 'model.d_model'?"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_setting(c, "model.value_route=tide", "--set"); })
                .find("unknown value 'tide' (expected decoupled, tied, average or frozen); did you mean 'tied'?"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_toml_config("[trian]\nlr = 0.1\n", "c.toml"); })
                .find("c.toml:1: unknown config key 'trian' (expected [model] and [train] tables); did you mean 'train'?"),
            std::string::npos);
  EXPECT_NE(error_of([] { model_config_from_json(nlohmann::json{{"n_layer", 2}}, "ckpt"); })
                .find("ckpt: unknown model config key 'n_layer'; did you mean 'n_layers'?"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_residual_mode("blocks"); })
                .find("unknown residual mode 'blocks' (expected prenorm, full, block, rd, denseformer, hc, mhc, "
                      "mudd, delta, delta_block or gr); did you mean 'block'?"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_value_route("froze"); }).find("did you mean 'frozen'?"), std::string::npos);
  // Nothing close: no guess.
  EXPECT_EQ(error_of([&] { apply_setting(c, "model.residual=transformer", "--set"); }).find("did you mean"),
            std::string::npos);
}

TEST(ConfigKeys, OldFormatConfigsReadWithDefaultsForNewerKeys) {
  const TrainConfig old = parse_toml_config(kOldTinyToml, "old config.toml");
  EXPECT_EQ(describe_differences(config_differences(train_config_keys(), old, preset("tiny")), "old", "tiny"), "");
  EXPECT_EQ(old.micro_batches, 0);
  EXPECT_EQ(old.precision, kernels::MatmulPrecision::fp32);
  // The current writer writes every key, and what it writes reads back the same.
  const std::string now = to_toml(preset("tiny"));
  EXPECT_NE(now.find("\nmicro_batches = 0\n"), std::string::npos) << now;
  EXPECT_NE(now.find("\nprecision = \"fp32\"\n"), std::string::npos) << now;
  EXPECT_TRUE(config_differences(train_config_keys(), parse_toml_config(now, "now"), old).empty());
}

TEST(ConfigKeys, NumbersAreWrittenInTheirShortestExactForm) {
  // What people read (`attnres config`, config.toml, --keys, the docs) is 0.003, not
  // 0.0030000000000000001, and still reads back as the same double.
  const std::string tiny = to_toml(preset("tiny"));
  for (const char* line : {"\nlr = 0.003\n", "\nnorm_eps = 1e-06\n", "\nbeta2 = 0.95\n", "\nrope_theta = 10000\n",
                           "\nmilestones = [0.125, 0.25, 0.5, 1]\n"})
    EXPECT_NE(tiny.find(line), std::string::npos) << line << "\n" << tiny;
  EXPECT_EQ(tiny.find("0000000"), std::string::npos) << tiny;
  EXPECT_EQ(config_key_table_text().find("0000000"), std::string::npos);
  // Every double reads back exactly, those without a short decimal form and the integral ones
  // too large for a TOML integer included.
  for (const double x : {0.1 + 0.2, 1.0 / 3.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1e15,
                         123456789012345.0, 1234567890123456.0, 123456789012345678901.0, 0.5, 1e-6, 3e-3}) {
    TrainConfig c;
    c.model.rope_theta = x;
    const std::string text = to_toml(c);
    const TrainConfig back = parse_toml_config(text, "round trip");
    EXPECT_EQ(std::bit_cast<std::uint64_t>(back.model.rope_theta), std::bit_cast<std::uint64_t>(x))
        << text.substr(text.find("rope_theta"), 40);
  }
  // Written by the 17-digit writer before (committed experiments record such text): the same values.
  EXPECT_TRUE(config_differences(train_config_keys(), parse_toml_config(kOldTinyToml, "old"),
                                 parse_toml_config(tiny, "now"))
                  .empty());
}

TEST(ConfigKeys, DifferencesNameEveryDifferingKeyWithBothValues) {
  TrainConfig a = preset("tiny"), b = a;
  EXPECT_TRUE(config_differences(train_config_keys(), a, b).empty());
  b.model.residual = ResidualMode::rd;
  b.lr = 1e-3;
  const auto diff = config_differences(train_config_keys(), a, b);
  ASSERT_EQ(diff.size(), 2u);
  EXPECT_EQ(describe_differences(diff, "checkpoint", "requested"),
            "model.residual = \"block\" (checkpoint) vs \"rd\" (requested); "
            "train.lr = 0.003 (checkpoint) vs 0.001 (requested)");
}

TEST(ConfigKeys, ModelJsonRoundTripOfEveryKey) {
  // The format of the checkpoint metadata `config`: every key of the table (the baselines' keys
  // since #13). A config written before them (the keys of 2026-11) reads back with their defaults.
  const std::string before_baselines =
      R"({"d_model":64,"max_seq_len":256,"mlp_hidden":320,"n_blocks":2,"n_heads":2,"n_layers":2,)"
      R"("norm_eps":1e-06,"residual":"block","rope_theta":10000.0,"tie_embeddings":true,)"
      R"("value_route":"decoupled","vocab_size":257})";
  EXPECT_EQ(nlohmann::json(ModelConfig{}).dump(),
            R"({"d_model":64,"delta_block_partial":true,"delta_decay_all":true,"delta_gate":"none",)"
            R"("delta_null_source":false,"delta_value_route":"none","dwa_dilation":1,"dwa_period":1,)"
            R"("dwa_weight_decay":true,"gr_decay_norm":false,"gr_n":4,"gr_rank":0,"hc_dynamic":true,"hc_n":4,)"
            R"("hc_reduce":"sum","hc_scale_init":0.01,"hc_tanh":true,"max_seq_len":256,"mhc_alpha_init":0.01,)"
            R"("mhc_bias_init":"home_pm3","mhc_n":4,"mhc_phi_std":0.02,"mhc_pre_eps":0.0,"mhc_reduce":"sum",)"
            R"("mhc_sinkhorn_iters":20,"mhc_sinkhorn_order":"col_row",)"
            R"("mlp_hidden":320,"mudd_decay_all":true,"mudd_dynamic":true,"mudd_gelu":"erf","mudd_hidden_round":64,)"
            R"("mudd_last_expand":4,"mudd_prepost_norm":false,"mudd_sep_qkv_norm":true,"mudd_ways":"qkvr",)"
            R"("n_blocks":2,"n_heads":2,"n_layers":2,"norm_eps":1e-06,"residual":"block",)"
            R"("rope_theta":10000.0,"tie_embeddings":true,"value_residual":false,"value_route":"decoupled",)"
            R"("vocab_size":257,"vres_lambda1":0.5,"vres_lambda2":0.5,"vres_mode":"fixed"})");
  EXPECT_EQ(nlohmann::json(model_config_from_json(nlohmann::json::parse(before_baselines), "old")).dump(),
            nlohmann::json(ModelConfig{}).dump());
  const ModelConfig base;
  for (const auto& k : model_config_keys()) {
    // The first change of this key alone that is still a valid model, on the base or, for a key that
    // applies to some modes only (delta_*, gr_*), on the base with one of them.
    const std::vector<ConfigValue> candidates = model_changes(k, k.get(base));
    bool found = false;
    for (const auto& c : candidates) {
      ModelConfig m = base;
      bool valid = false;
      for (std::size_t mode = 0; mode <= residual_mode_values().size() && !valid; ++mode) {
        m = base;
        if (mode > 0) m.residual = residual_mode_values()[mode - 1];
        k.set(m, c);
        try {
          m.validate();
          valid = true;
        } catch (const Error&) {
        }
      }
      if (!valid) continue;
      found = true;
      const nlohmann::json j = m;
      EXPECT_EQ(j.size(), model_config_keys().size());
      const ModelConfig back = model_config_from_json(nlohmann::json::parse(j.dump()), "json");
      EXPECT_TRUE(config_differences(model_config_keys(), m, back).empty()) << k.name << ": " << j.dump();
      EXPECT_EQ(k.get(back), c) << k.name;
      break;
    }
    EXPECT_TRUE(found) << k.name << ": no valid change to test";
  }
  // Strict: unknown keys and wrong types name the source and key; missing keys take defaults.
  EXPECT_NE(error_of([] { model_config_from_json(nlohmann::json{{"d_modle", 64}}, "ckpt"); })
                .find("ckpt: unknown model config key 'd_modle'"),
            std::string::npos);
  EXPECT_NE(error_of([] { model_config_from_json(nlohmann::json{{"d_model", 64.5}}, "ckpt"); })
                .find("ckpt: model config key 'd_model' must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { model_config_from_json(nlohmann::json{{"tie_embeddings", 1}}, "ckpt"); })
                .find("ckpt: model config key 'tie_embeddings' must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of([] { model_config_from_json(nlohmann::json{{"residual", "blocky"}}, "ckpt"); })
                .find("ckpt: 'model.residual': unknown value 'blocky'"),
            std::string::npos);
  EXPECT_TRUE(config_differences(model_config_keys(), model_config_from_json(nlohmann::json::object(), "j"), ModelConfig{})
                  .empty());
}

TEST(ConfigKeys, DocsTableIsTheGeneratedOne) {
  const std::string path = std::string(ATTNRES_SOURCE_DIR) + "/docs/training.md";
  const std::string doc = read_file(path);
  ASSERT_FALSE(doc.empty()) << path;
  const std::string generated = with_config_key_table(doc, path);
  if (doc != generated) {  // name the first line that differs, not the whole page
    std::istringstream a(doc), b(generated);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    ADD_FAILURE() << path << " differs from the key table: run 'make docs' (attnres config --update-docs "
                  << "docs/training.md)\n  in the file: " << la << "\n  generated:   " << lb;
  }
  for (const auto& k : train_config_keys())
    EXPECT_NE(config_key_table_markdown().find("| `" + k.path() + "` |"), std::string::npos) << k.path();
  EXPECT_THROW(with_config_key_table("no markers", "x.md"), Error);
}

TEST(ConfigKeys, ConfigCommandPrintsKeysAndResolvedConfigs) {
  CliResult r = run_cli("config --keys");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, config_key_table_text());
  r = run_cli("config --keys --markdown");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, config_key_table_markdown());
  r = run_cli("config --preset small --set model.residual=rd --set train.lr=1e-3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  TrainConfig want = preset("small");
  want.model.residual = ResidualMode::rd;
  want.lr = 1e-3;
  EXPECT_EQ(r.output, to_toml(want));
  r = run_cli("config --preset tiny --set train.lr=2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("train.lr must be in (0, 1) (got 2)"), std::string::npos) << r.output;
  // The commands that take --set list the keys in their help.
  for (const char* command : {"train", "experiment", "bench", "config"}) {
    r = run_cli(std::string(command) + " --help");
    EXPECT_NE(r.output.find("attnres config --keys"), std::string::npos) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("model: " + model_config_keys().front().name), std::string::npos) << command;
    EXPECT_NE(r.output.find(" " + train_config_keys().back().name + "\n"), std::string::npos) << command;
  }
  // --update-docs rewrites the table of a file, and only the table.
  TempDir dir("attnres_config_docs");
  std::ofstream(dir.path() / "d.md") << "# x\n<!-- begin config keys -->\nstale\n<!-- end config keys -->\ntail\n";
  r = run_cli("config --update-docs " + dir.str("d.md"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_file(dir.path() / "d.md"),
            "# x\n<!-- begin config keys -->\n" + config_key_table_markdown() + "<!-- end config keys -->\ntail\n");
}
