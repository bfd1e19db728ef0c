// Safetensors weights I/O, AdamW, clipping, schedules, and a tiny model overfitting a batch.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "optim/adamw.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() {
  fs::path p = fs::temp_directory_path() / ("attnres_test_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Checkpoint, WeightsRoundTripExactly) {
  const ModelConfig c = tiny_config(ResidualMode::rd, ValueRoute::average);
  Model<float> a(c, 1, 4, false), b(c, 1, 4, false);
  randomize_weights(a, 3);
  const std::string path = (temp_dir() / "w.safetensors").string();
  save_weights<float>(path, c, a.layout(), a.params(), {{"step", "12"}});
  load_weights<float>(path, c, b.layout(), b.params());
  EXPECT_TRUE(std::equal(a.params().begin(), a.params().end(), b.params().begin()));
  const SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata.at("step"), "12");
  EXPECT_EQ(f.at("layers.1.attn_res.value_query", path).shape, std::vector<std::int64_t>{8});
  EXPECT_EQ(f.at("layers.0.mlp.w_down.weight", path).shape, (std::vector<std::int64_t>{8, 12}));
  EXPECT_EQ(nlohmann::json(read_weights_config(path)), nlohmann::json(c));
}

TEST(Checkpoint, CorruptOrForeignFilesAreRejectedWithTheirName) {
  const ModelConfig c = tiny_config(ResidualMode::block);
  Model<float> a(c, 1, 4, false);
  randomize_weights(a, 3);
  const std::string path = (temp_dir() / "good.safetensors").string();
  save_weights<float>(path, c, a.layout(), a.params());

  // Another model's checkpoint.
  ModelConfig other = c;
  other.residual = ResidualMode::rd;
  Model<float> b(other, 1, 4, false);
  std::string msg = error_of([&] { load_weights<float>(path, other, b.layout(), b.params()); });
  EXPECT_NE(msg.find("different model"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;

  // Truncated.
  const std::string cut = (temp_dir() / "cut.safetensors").string();
  fs::copy_file(path, cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, fs::file_size(cut) - 10);
  msg = error_of([&] { load_weights<float>(cut, c, a.layout(), a.params()); });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;

  // Garbage header.
  const std::string junk = (temp_dir() / "junk.safetensors").string();
  std::ofstream(junk) << "this is not a checkpoint at all";
  msg = error_of([&] { read_safetensors(junk); });
  EXPECT_NE(msg.find(junk), std::string::npos) << msg;

  // Missing file.
  msg = error_of([&] { read_safetensors((temp_dir() / "absent.safetensors").string()); });
  EXPECT_NE(msg.find("absent.safetensors"), std::string::npos) << msg;
}

TEST(Optimizer, LearningRateSchedules) {
  LrSchedule s;
  s.max_lr = 1.0;
  s.min_lr_ratio = 0.1;
  s.warmup_steps = 4;
  s.total_steps = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);             // cosine starts at the peak
  EXPECT_NEAR(s.at(9), 0.1 + 0.9 * 0.5, 1e-12);  // half way
  EXPECT_NEAR(s.at(14), 0.1, 1e-12);
  s.decay = LrDecay::wsd;
  s.decay_fraction = 0.2;  // decay over the last round(2.8) = 3 steps: starts at 11
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_DOUBLE_EQ(s.at(11), 1.0);
  EXPECT_NEAR(s.at(12), 1.0 - 0.9 / 3, 1e-12);
  EXPECT_NEAR(s.at(14), 0.1, 1e-12);
}

TEST(Optimizer, AdamWMatchesHandComputedUpdate) {
  const ModelConfig c = tiny_config(ResidualMode::block);
  const ParamLayout layout(c);
  std::vector<double> p(layout.total(), 1.0), g(layout.total(), 0.5);
  AdamW<double> opt(layout, AdamWConfig{0.9, 0.95, 1e-8, 0.1});
  opt.step(p, g, 0.01);
  // t=1: m = 0.05, v = 0.0125; update = lr * (m/0.1) / (sqrt(v)/sqrt(0.05) + eps) = 0.01 * 0.5/0.5
  const double update = 0.01 * 0.5 / (std::sqrt(0.0125) / std::sqrt(0.05) + 1e-8);
  const ParamInfo& wq = layout.at("layers.0.attn.wq.weight");
  const ParamInfo& q = layout.at("layers.0.attn_res.query");
  const ParamInfo& norm = layout.at("final_norm.weight");
  EXPECT_NEAR(p[wq.offset], 1.0 * (1 - 0.01 * 0.1) - update, 1e-15);  // decayed matrix
  EXPECT_NEAR(p[q.offset], 1.0 - update, 1e-15);                       // queries: no decay
  EXPECT_NEAR(p[norm.offset], 1.0 - update, 1e-15);                    // norms: no decay
}

TEST(Optimizer, GradientClipping) {
  std::vector<float> g = {3, 4};
  EXPECT_NEAR(clip_grad_norm<float>(g, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(g[0], 0.6f, 1e-6);
  EXPECT_NEAR(g[1], 0.8f, 1e-6);
  std::vector<float> h = {0.3f, 0.4f};
  clip_grad_norm<float>(h, 1.0);
  EXPECT_EQ(h[0], 0.3f);  // under the limit: untouched
}

TEST(Training, TinyModelOverfitsOneBatch) {
  for (const Variant& v : {Variant{"block", ResidualMode::block, ValueRoute::decoupled},
                           Variant{"rd", ResidualMode::rd, ValueRoute::decoupled}}) {
    ModelConfig c = tiny_config(v.residual, v.route);
    c.d_model = 32;
    c.n_heads = 2;
    c.mlp_hidden = 64;
    c.vocab_size = 32;
    c.max_seq_len = 16;
    const int B = 4, T = 16;
    Model<float> model(c, B, T, true);
    init_params<float>(model.layout(), 1, model.params());
    const auto tokens = random_tokens(B, T, c.vocab_size, 5);
    AdamW<float> opt(model.layout(), AdamWConfig{0.9, 0.95, 1e-8, 0.0});
    double loss = 0;
    for (int step = 0; step < 300; ++step) {
      loss = model.forward_backward(tokens, B, T);
      clip_grad_norm<float>(model.grads(), 1.0);
      opt.step(model.params(), model.grads(), 3e-3);
    }
    loss = model.forward(tokens, B, T);
    EXPECT_LT(loss, 0.1) << v.name;
  }
}
