// The inference role (train/inference.hpp) on the CPU: weights loaded from a file give exactly
// Model<float>'s loss, logits, depth routing and KV-cache decoding, and the evaluation of a
// split through it equals the evaluation through the model; the training backend answers the
// same calls the same way.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/cli_util.hpp"
#include "common/model_util.hpp"
#include "data/loader.hpp"
#include "experiment/diagnostics.hpp"
#include "kernels/gemm_f32.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "model/topology.hpp"
#include "results/run_result.hpp"
#include "train/backend.hpp"
#include "train/evaluate.hpp"
#include "train/inference.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

// Model<float> with random weights, and the same weights in a file.
struct SavedModel {
  SavedModel(const ModelConfig& c, int batch, int seq, const fs::path& path) : model(c, batch, seq, false) {
    randomize_weights(model, 5);
    save_weights<float>(path.string(), c, model.layout(), model.params());
  }
  Model<float> model;
};

class InferenceBackendTest : public ::testing::TestWithParam<Variant> {};

}  // namespace

TEST_P(InferenceBackendTest, CpuMatchesTheModelExactly) {
  const Variant v = GetParam();
  const ModelConfig c = tiny_config(v);
  const int B = 2, T = 6;
  TempDir dir("attnres_inference_" + v.name);
  const fs::path path = dir.path() / "model.safetensors";
  SavedModel saved(c, B, T, path);
  Model<float>& model = saved.model;

  const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", c, B, T);
  backend->load_weights(path.string());
  EXPECT_EQ(nlohmann::json(backend->config()), nlohmann::json(c));
  EXPECT_EQ(backend->layout().total(), model.layout().total());
  EXPECT_EQ(backend->describe().rfind("cpu, ", 0), 0u) << backend->describe();
  // It names the kernels that decide a run's last bits.
  EXPECT_NE(backend->describe().find(concat("fp32 matmuls (", kernels::to_string(kernels::fp32_gemm_backend()), ")")),
            std::string::npos)
      << backend->describe();

  // Loss, and the routing of that pass.
  const std::vector<std::int32_t> tokens = random_tokens(B, T, c.vocab_size, 11);
  EXPECT_EQ(backend->loss(tokens, B, T), model.forward(tokens, B, T));
  const Topology topology(c);
  const Model<float>* routing = backend->host_model();
  ASSERT_NE(routing, nullptr);
  int compared = 0;
  for (int r = 0; topology.has_reads() && r <= topology.final_read(); ++r) {
    const ReadPlan& plan = topology.read(r);
    std::vector<float> got(plan.sources.size()), want(plan.sources.size());
    for (int route = 0; route < plan.n_routes; ++route)
      for (std::int64_t t = 0; t < std::int64_t(B) * T; ++t) {
        routing->read_weights(r, route, t, got);
        model.read_weights(r, route, t, want);
        EXPECT_EQ(got, want) << "read " << r << " route " << route << " token " << t;
        ++compared;
      }
  }
  EXPECT_EQ(compared > 0, topology.has_reads());
  if (c.uses_streams()) {  // the stream coefficients of that pass, every sublayer and token
    std::vector<float> got(static_cast<std::size_t>(c.n_streams() * (c.n_streams() + 2))), want(got.size());
    for (int j = 0; j < c.n_sublayers(); ++j)
      for (std::int64_t t = 0; t < std::int64_t(B) * T; ++t) {
        routing->stream_weights(j, t, got);
        model.stream_weights(j, t, want);
        EXPECT_EQ(got, want) << "sublayer " << j << " token " << t;
      }
  } else {
    std::vector<float> none(8);
    EXPECT_THROW(routing->stream_weights(0, 0, none), Error);
  }

  // Logits of a shorter batch.
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(B * (T - 1)));
  for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = static_cast<std::int32_t>((i * 7 + 3) % c.vocab_size);
  std::vector<float> got(inputs.size() * c.vocab_size), want(got.size());
  backend->logits(inputs, B, T - 1, got);
  model.logits(inputs, B, T - 1, want);
  EXPECT_EQ(got, want);

  // Decoding: a prompt, then one token at a time, as Model::decode with its own cache.
  Model<float> reference(c, 1, c.max_seq_len, false);
  std::copy(model.params().begin(), model.params().end(), reference.params().begin());
  KvCache<float> cache(c, 1, c.max_seq_len);
  const std::unique_ptr<Decoder> decoder = backend->decoder(1);
  std::vector<float> step(c.vocab_size), step_ref(c.vocab_size);
  const std::vector<std::int32_t> prompt = {1, 4, 2};
  decoder->append(prompt, 3, step);
  reference.decode(prompt, 1, 3, cache, step_ref);
  EXPECT_EQ(step, step_ref);
  for (std::int32_t next = 5; decoder->length() < c.max_seq_len; next = (next + 3) % c.vocab_size) {
    decoder->append(std::span<const std::int32_t>(&next, 1), 1, step);
    reference.decode(std::span<const std::int32_t>(&next, 1), 1, 1, cache, step_ref);
    EXPECT_EQ(step, step_ref) << "position " << decoder->length();
  }
  EXPECT_EQ(decoder->length(), cache.length);
  const std::int32_t one = 0;
  EXPECT_THROW(decoder->append(std::span<const std::int32_t>(&one, 1), 1, step), Error);  // the context is full
}

INSTANTIATE_TEST_SUITE_P(AllModes, InferenceBackendTest, ::testing::ValuesIn(all_variants()),
                         [](const auto& info) { return info.param.name; });

// make_recompute_decoder (`sample --device cuda`: no KV cache on the GPU) on the CPU backend: each
// append's logits are the full pass's last position, which the KV cache gives too (to rounding:
// other GEMM shapes), for two rows with different prompts, to the full context; then it is full.
TEST(InferenceBackend, RecomputeDecodingMatchesTheKvCache) {
  for (const Variant& v : all_variants()) {
    if (v.name != "block" && v.name != "rd" && v.name != "prenorm") continue;
    SCOPED_TRACE(v.name);
    const ModelConfig c = tiny_config(v);
    const int B = 2;
    TempDir dir("attnres_recompute_" + v.name);
    const fs::path path = dir.path() / "model.safetensors";
    SavedModel saved(c, B, c.max_seq_len, path);
    const std::unique_ptr<InferenceBackend> cached = make_inference_backend("cpu", c, B, c.max_seq_len);
    const std::unique_ptr<InferenceBackend> plain = make_inference_backend("cpu", c, B, c.max_seq_len);
    cached->load_weights(path.string());
    plain->load_weights(path.string());
    const std::unique_ptr<Decoder> kv = cached->decoder(B);
    const std::unique_ptr<Decoder> recompute = make_recompute_decoder(*plain, B);
    std::vector<float> want(static_cast<std::size_t>(B * c.vocab_size)), got(want.size());
    const std::vector<std::int32_t> prompts = {1, 4, 2, 7, 0, 3};  // [2, 3]
    kv->append(prompts, 3, want);
    recompute->append(prompts, 3, got);
    for (std::int32_t next = 5; recompute->length() < c.max_seq_len; next = (next + 3) % c.vocab_size) {
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "position " << recompute->length() << " logit " << i;
      const std::vector<std::int32_t> step = {next, (next + 1) % c.vocab_size};
      kv->append(step, 1, want);
      recompute->append(step, 1, got);
    }
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << "last position, logit " << i;
    EXPECT_EQ(recompute->length(), kv->length());
    const std::vector<std::int32_t> more = {0, 0};
    EXPECT_THROW(recompute->append(more, 1, got), Error);  // the context is full
    EXPECT_THROW(make_recompute_decoder(*plain, 0), Error);
  }
}

TEST(InferenceBackend, TrainBackendAnswersTheSameCalls) {
  const ModelConfig c = tiny_config(ResidualMode::rd);
  const int B = 2, T = 6;
  TempDir dir("attnres_inference_train");
  const fs::path path = dir.path() / "model.safetensors";
  SavedModel saved(c, B, T, path);
  TrainConfig tc;
  tc.model = c;
  tc.batch_size = B;
  tc.seq_len = T;
  dist::Communicator single;
  const std::unique_ptr<TrainBackend> train = make_train_backend("cpu", tc, B, 1, single);
  train->load_weights(path.string());
  const std::vector<std::int32_t> tokens = random_tokens(B, T, c.vocab_size, 3);
  EXPECT_EQ(train->loss(tokens, B, T), saved.model.forward(tokens, B, T));
  ASSERT_NE(train->host_model(), nullptr);
  std::vector<float> got(3), want(3);
  train->host_model()->read_weights(3, 0, 1, got);  // sublayer 3 reads [emb, b_1, partial]
  saved.model.read_weights(3, 0, 1, want);
  EXPECT_EQ(got, want);
}

TEST(InferenceBackend, BadInputIsAClearError) {
  const ModelConfig c = tiny_config(ResidualMode::block);
  TempDir dir("attnres_inference_errors");
  const fs::path path = dir.path() / "model.safetensors";
  SavedModel saved(c, 1, 4, path);
  EXPECT_THROW(make_inference_backend("tpu", c, 1, 4), Error);
  if (!cuda_backend_built()) {
    EXPECT_THROW(make_inference_backend("cuda", c, 1, 4), Error);
  }
  // Weights of another model.
  const std::unique_ptr<InferenceBackend> other = make_inference_backend("cpu", tiny_config(ResidualMode::rd), 1, 4);
  try {
    other->load_weights(path.string());
    ADD_FAILURE() << "loading another model's weights succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos) << e.what();
  }
}

// An evaluation through the backend equals the same evaluation through Model::forward, on a
// prepared split (the path of `attnres eval --data` and of an experiment's test NLL).
TEST(InferenceBackend, EvaluationOfACheckpointIsUnchanged) {
  TempDir dir("attnres_inference_eval");
  const std::string data_dir = prepare_synthetic_data(dir.path());
  const data::TokenDataset test = data::TokenDataset::open(data_dir, "test", {false, nullptr});
  ModelConfig c = tiny_config(ResidualMode::rd);
  c.vocab_size = test.vocab_size();
  c.max_seq_len = 16;
  const int B = 3, T = 16;
  const fs::path path = dir.path() / "model.safetensors";
  SavedModel saved(c, B, T, path);

  Model<float>& model = saved.model;
  const BatchLoss direct = [&model](std::span<const std::int32_t> tokens, int b, int s) {
    return model.forward(tokens, b, s);
  };
  const EvalResult want = evaluate_split(direct, test, B, T, 1000);
  const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", c, B, T);
  backend->load_weights(path.string());
  const EvalResult got = evaluate_split(*backend, test, B, T, 1000);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.nll, want.nll);
  EXPECT_GT(got.tokens, 0);
}

// MUDD's connections for an experiment's result.json (experiment/diagnostics.hpp): the token-mean of
// each DA's mixing weights, read through the backend's routing.
TEST(InferenceBackend, MuddConnectionsAreTokenMeansOfTheMixingWeights) {
  TempDir dir("attnres_inference_mudd");
  const std::string data_dir = prepare_synthetic_data(dir.path());
  const data::TokenDataset val = data::TokenDataset::open(data_dir, "val", {false, nullptr});
  ModelConfig c = tiny_config(ResidualMode::mudd, ValueRoute::decoupled, 3);
  c.vocab_size = val.vocab_size();
  c.max_seq_len = 16;
  const int B = 2, T = 16;
  for (const bool dynamic : {true, false}) {
    c.mudd_dynamic = dynamic;
    const fs::path path = dir.path() / (dynamic ? "dynamic.safetensors" : "static.safetensors");
    SavedModel saved(c, B, T, path);  // random weights: dw varies by token when dynamic
    const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", c, B, T);
    backend->load_weights(path.string());
    const auto connections = experiment::diagnose(*backend, val, B, T, 64).connections;
    ASSERT_EQ(connections.size(), 4u);
    const char* names[] = {"mudd.q", "mudd.k", "mudd.v", "mudd.r"};
    for (int w = 0; w < 4; ++w) {
      const auto& way = connections[static_cast<std::size_t>(w)];
      EXPECT_EQ(way.name, names[w]);
      ASSERT_EQ(way.rows.size(), w == 3 ? 3u : 2u);  // the last DA writes R alone
      for (std::size_t i = 0; i < way.rows.size(); ++i) {
        const auto& row = way.rows[i];
        EXPECT_EQ(row.target, int(i) + 1);
        ASSERT_EQ(row.sources.size(), i + 2);
        const ParamInfo& a = saved.model.layout().at("mudd." + std::to_string(i) + ".a");
        const int ways = static_cast<int>(a.shape[0]), way_index = ways == 1 ? 0 : w;
        double differs = 0;
        for (std::size_t j = 0; j < row.sources.size(); ++j) {
          EXPECT_EQ(row.sources[j], int(j));
          const double static_weight = saved.model.params()[a.offset + way_index * (i + 2) + j];
          differs = std::max(differs, std::abs(row.weights[j] - static_weight));
        }
        if (dynamic) {
          EXPECT_GT(differs, 1e-3) << way.name << " row " << i;  // the generator's share
        } else {
          EXPECT_LT(differs, 1e-12) << way.name << " row " << i;  // dw = a for every token
        }
      }
    }
    if (!dynamic) continue;
    // At initialisation (W2 = 0) every token's dw is a = e_last exactly.
    Model<float> init(c, 1, 1, false);
    init_params<float>(init.layout(), 3, init.params());
    save_weights<float>(path.string(), c, init.layout(), init.params());
    backend->load_weights(path.string());
    for (const auto& way : experiment::diagnose(*backend, val, B, T, 64).connections)
      for (const auto& row : way.rows)
        for (std::size_t j = 0; j < row.weights.size(); ++j)
          EXPECT_EQ(row.weights[j], j + 1 == row.weights.size() ? 1.0 : 0.0) << way.name << " " << row.target;
  }
  // The prenorm backend has no DA modules; other modes have no MUDD connections.
  ModelConfig prenorm = c;
  prenorm.residual = ResidualMode::prenorm;
  const std::unique_ptr<InferenceBackend> pre = make_inference_backend("cpu", prenorm, B, T);
  EXPECT_TRUE(experiment::diagnose(*pre, val, B, T, 64).connections.empty());
}

// GR's diagnostics (docs/delta-gated-spec.md §2.7): the read gates' channel mean and the write gates
// per branch, averaged over the evaluation tokens, as the connections gr.read (every module and the
// final mixer) and gr.write (every sublayer). With W_up = 0 and W_inject = 0 they are 1/2 and 1.
TEST(InferenceBackend, GatedResidualDiagnosticsAreItsGatesPerBranch) {
  TempDir dir("attnres_inference_gr");
  const std::string data_dir = prepare_synthetic_data(dir.path());
  const data::TokenDataset val = data::TokenDataset::open(data_dir, "val", {false, nullptr});
  const int B = 2, T = 16;
  ModelConfig c = tiny_config(ResidualMode::gr, ValueRoute::decoupled, 3);
  c.gr_n = 3;
  c.vocab_size = val.vocab_size();
  c.max_seq_len = T;
  const fs::path path = dir.path() / "gr.safetensors";
  SavedModel saved(c, B, T, path);
  const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", c, B, T);
  backend->load_weights(path.string());
  const auto trained = experiment::diagnose(*backend, val, B, T, 64).connections;
  ASSERT_EQ(trained.size(), 2u);
  EXPECT_EQ(trained[0].name, "gr.read");
  EXPECT_EQ(trained[1].name, "gr.write");
  ASSERT_EQ(trained[0].rows.size(), 7u);
  ASSERT_EQ(trained[1].rows.size(), 6u);
  for (const auto& row : trained[1].rows) {
    EXPECT_EQ(row.sources, (std::vector<int>{0, 1, 2}));
    for (double w : row.weights) EXPECT_TRUE(w > 0 && w < 2) << row.target;  // 2 sigmoid(.)
  }
  Model<float>& m = saved.model;
  for (const auto& p : m.layout().params())
    if (p.name.ends_with(".w_up") || p.name.ends_with(".w_inject"))
      std::fill_n(m.params().data() + p.offset, p.numel, 0.0f);
  save_weights<float>(path.string(), c, m.layout(), m.params());
  backend->load_weights(path.string());
  const auto neutral = experiment::diagnose(*backend, val, B, T, 64).connections;
  for (const auto& row : neutral[0].rows)
    for (double w : row.weights) EXPECT_EQ(w, 0.5) << row.target;
  for (const auto& row : neutral[1].rows)
    for (double w : row.weights) EXPECT_EQ(w, 1.0) << row.target;
}

// MUDD's routing diagnostic (experiment/diagnostics.hpp, baselines-spec §6.5): per block, the token
// means of p_c(j) = |dw[c,j]|·‖X_j‖ / Σ_j |dw[c,j]|·‖X_j‖ of the Q, K and V ways of the DA feeding
// it and the per-token JS(p_Q, p_V), JS(p_K, p_V), recomputed here from the routing of the pass
// (one batch: the backend's routing afterwards is the pass the diagnostic read).
TEST(InferenceBackend, MuddRoutingIsThePerTokenJsOfTheWeighedWays) {
  TempDir dir("attnres_inference_mudd_routing");
  const std::string data_dir = prepare_synthetic_data(dir.path());
  const data::TokenDataset val = data::TokenDataset::open(data_dir, "val", {false, nullptr});
  const int B = 2, T = 16;
  auto js = [](const std::vector<double>& p, const std::vector<double>& q) {  // spec §7, 0·log 0 = 0
    double out = 0;
    for (std::size_t j = 0; j < p.size(); ++j) {
      const double m = 0.5 * (p[j] + q[j]);
      if (p[j] > 0) out += 0.5 * p[j] * std::log(p[j] / m);
      if (q[j] > 0) out += 0.5 * q[j] * std::log(q[j] / m);
    }
    return out;
  };
  for (const char* variant : {"mudd", "mudd_static", "mudd_prepost"}) {
    ModelConfig c;
    for (const Variant& v : all_variants())
      if (v.name == variant) c = tiny_config(v, 3);
    ASSERT_EQ(c.residual, ResidualMode::mudd) << variant;
    c.vocab_size = val.vocab_size();
    c.max_seq_len = T;
    const fs::path path = dir.path() / (std::string(variant) + ".safetensors");
    SavedModel saved(c, B, T, path);
    const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", c, B, T);
    backend->load_weights(path.string());
    const auto layers = experiment::diagnose(*backend, val, B, T, B * T).routing;
    ASSERT_EQ(layers.size(), 3u) << variant;
    EXPECT_EQ(layers[0].sources, 1);  // block 0 reads the embedding alone
    EXPECT_EQ(layers[0].k_mean, std::vector<double>{1.0});
    EXPECT_EQ(layers[0].js_nats, 0.0);
    EXPECT_EQ(layers[0].js_k_nats, 0.0);
    const Model<float>& routing = *backend->host_model();
    for (int b = 1; b < 3; ++b) {
      const auto& l = layers[static_cast<std::size_t>(b)];
      SCOPED_TRACE(std::string(variant) + " block " + std::to_string(b));
      EXPECT_EQ(l.layer, b);
      ASSERT_EQ(l.sources, b + 1);
      std::vector<double> mean[3], js_sum(2, 0.0);
      for (auto& x : mean) x.assign(static_cast<std::size_t>(b + 1), 0.0);
      for (std::int64_t t = 0; t < B * T; ++t) {
        std::vector<float> norms(static_cast<std::size_t>(b + 1)), dw(norms.size());
        routing.mudd_source_norms(b - 1, t, norms);
        std::vector<double> p[3];
        for (int way = 0; way < 3; ++way) {
          routing.mudd_weights(b - 1, way, t, dw);
          double sum = 0;
          for (std::size_t j = 0; j < dw.size(); ++j) sum += std::abs(double(dw[j])) * norms[j];
          for (std::size_t j = 0; j < dw.size(); ++j) {
            p[way].push_back(std::abs(double(dw[j])) * norms[j] / sum);
            mean[way][j] += p[way][j] / (B * T);
          }
        }
        js_sum[0] += js(p[0], p[2]) / (B * T);
        js_sum[1] += js(p[1], p[2]) / (B * T);
      }
      for (std::size_t j = 0; j < mean[0].size(); ++j) {
        EXPECT_NEAR(l.qk_mean[j], mean[0][j], 1e-9);
        EXPECT_NEAR(l.k_mean[j], mean[1][j], 1e-9);
        EXPECT_NEAR(l.v_mean[j], mean[2][j], 1e-9);
      }
      EXPECT_NEAR(l.js_nats, js_sum[0], 1e-9);
      EXPECT_NEAR(l.js_k_nats, js_sum[1], 1e-9);
      // Random weights: the ways differ (though static block 1's Q and V rows of a happen to have
      // nearly the same ratio, so JS(p_Q, p_V) is tiny there).
      EXPECT_GT(l.js_nats + l.js_k_nats, 1e-3);
    }
  }
  // mudd_ways = r has one stream per block, nothing to compare; prenorm has no routing at all.
  ModelConfig r = tiny_config(ResidualMode::mudd, ValueRoute::decoupled, 3);
  r.mudd_ways = MuddWays::r;
  r.vocab_size = val.vocab_size();
  r.max_seq_len = T;
  EXPECT_TRUE(experiment::diagnose(*make_inference_backend("cpu", r, B, T), val, B, T, B * T).routing.empty());
  r.residual = ResidualMode::prenorm;
  EXPECT_TRUE(experiment::diagnose(*make_inference_backend("cpu", r, B, T), val, B, T, B * T).routing.empty());
}

namespace {

// HC's and mHC's part of a run's diagnostics (experiment::diagnose): the connections of the
// stream mixing and its Amax gains; nullopt for modes without streams.
struct StreamDiagnostics {
  results::Connections connections;
  results::AmaxGain gain;
};
std::optional<StreamDiagnostics> stream_diagnostics(InferenceBackend& backend, const data::TokenDataset& split,
                                                    int batch, int seq, std::int64_t max_tokens) {
  DepthDiagnostics d = experiment::diagnose(backend, split, batch, seq, max_tokens);
  if (!d.amax_gain) return std::nullopt;
  EXPECT_EQ(d.connections.size(), 1u);
  if (d.connections.size() != 1) return std::nullopt;
  return StreamDiagnostics{d.connections[0], *d.amax_gain};
}

void expect_same_connections(const results::Connections& got, const results::Connections& want, double tolerance) {
  EXPECT_EQ(got.name, want.name);
  ASSERT_EQ(got.rows.size(), want.rows.size());
  for (std::size_t k = 0; k < got.rows.size(); ++k) {
    EXPECT_EQ(got.rows[k].target, want.rows[k].target);
    EXPECT_EQ(got.rows[k].sources, want.rows[k].sources);
    ASSERT_EQ(got.rows[k].weights.size(), want.rows[k].weights.size());
    for (std::size_t s = 0; s < got.rows[k].weights.size(); ++s)
      EXPECT_NEAR(got.rows[k].weights[s], want.rows[k].weights[s],
                  tolerance * std::max(1.0, std::abs(want.rows[k].weights[s])))
          << "target " << k << " source " << s;
  }
}

double largest_difference(const results::Connections& a, const results::Connections& b) {
  double most = 0;
  for (std::size_t k = 0; k < a.rows.size(); ++k)
    for (std::size_t s = 0; s < a.rows[k].weights.size(); ++s)
      most = std::max(most, std::abs(a.rows[k].weights[s] - b.rows[k].weights[s]));
  return most;
}

}  // namespace

// HC's and mHC's diagnostics for an experiment's result.json (experiment/diagnostics.hpp): the token
// mean of each token's unfolded connections and the Amax gains, through the backend's routing.
TEST(InferenceBackend, StreamDiagnosticsArePerTokenConnectionsAndGains) {
  TempDir dir("attnres_inference_streams");
  const std::string data_dir = prepare_synthetic_data(dir.path());
  const data::TokenDataset val = data::TokenDataset::open(data_dir, "val", {false, nullptr});
  const int B = 2, T = 16, L = 4;  // tiny_config: 2 layers, 4 sublayers
  const auto config = [&](const Variant& v) {
    ModelConfig c = tiny_config(v);
    c.vocab_size = val.vocab_size();
    c.max_seq_len = 16;
    return c;
  };
  const fs::path path = dir.path() / "model.safetensors";
  const auto diagnostics = [&](const ModelConfig& c) {
    const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", c, B, T);
    backend->load_weights(path.string());
    std::optional<StreamDiagnostics> d = stream_diagnostics(*backend, val, B, T, 64);
    EXPECT_TRUE(d.has_value());
    return d.value_or(StreamDiagnostics{});
  };
  const auto save_initial = [&](const ModelConfig& c) {
    Model<float> init(c, 1, 1, false);
    init_params<float>(init.layout(), 3, init.params());
    save_weights<float>(path.string(), c, init.layout(), init.params());
  };

  // Static HC: every token's coefficients are A and B, so the token mean is the exact unfolding of
  // the weights file (what result.json records for it), and each gain is every token's.
  const ModelConfig hc_static =
      config({.name = "hc_static", .residual = ResidualMode::hc, .n_streams = 3, .hc_dynamic = false});
  { SavedModel saved(hc_static, B, T, path); }  // random weights
  const StreamDiagnostics st = diagnostics(hc_static);
  const std::vector<results::Connections> exact =
      static_connections(hc_static, read_safetensors(path.string()), path.string());
  ASSERT_EQ(exact.size(), 1u);
  expect_same_connections(st.connections, exact[0], 1e-12);
  EXPECT_GT(std::abs(exact[0].rows[2].weights[1] - 1.0), 1e-3);  // not the initial all-ones
  EXPECT_NEAR(st.gain.composite_forward_mean, st.gain.composite_forward_max, 1e-12 * st.gain.composite_forward_max);
  EXPECT_NEAR(st.gain.composite_backward_mean, st.gain.composite_backward_max,
              1e-12 * st.gain.composite_backward_max);
  EXPECT_GT(std::abs(st.gain.composite_forward_max - 1.0), 1e-3);  // A_r is far from I

  // Dynamic HC: the per-token terms s tanh(.) move the connections away from the unfolding of A
  // and B alone (what "hc_static_part" recorded before), and they vary by token.
  const ModelConfig hc = config({.name = "hc", .residual = ResidualMode::hc, .n_streams = 3});
  {
    SavedModel saved(hc, B, T, path);
    const StreamDiagnostics dy = diagnostics(hc);
    EXPECT_EQ(dy.connections.name, "hc");
    ASSERT_EQ(dy.connections.rows.size(), static_cast<std::size_t>(L + 1));
    ModelConfig static_part = hc;
    static_part.hc_dynamic = false;
    const std::vector<results::Connections> part =
        static_connections(static_part, read_safetensors(path.string()), path.string());
    EXPECT_GT(largest_difference(dy.connections, part[0]), 1e-3);
    // Every token's own product: the forward gains recomputed here token by token from the model,
    // over the windows the diagnostics read (one pass of B windows).
    const std::unique_ptr<InferenceBackend> backend = make_inference_backend("cpu", hc, B, T);
    backend->load_weights(path.string());
    const StreamDiagnostics one = *stream_diagnostics(*backend, val, B, T, B * T);
    const data::BatchLoader order(val, 1, T, 0);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * (T + 1));
    for (int w = 0; w < B; ++w)
      order.window(w, std::span<std::int32_t>(tokens).subspan(static_cast<std::size_t>(w) * (T + 1), T + 1));
    saved.model.forward(tokens, B, T);
    const int n = 3;
    std::vector<float> coef(static_cast<std::size_t>(n * (n + 2)));
    double sum = 0, most = 0;
    for (std::int64_t t = 0; t < std::int64_t(B) * T; ++t) {
      double P[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
      for (int j = 0; j < L; ++j) {
        saved.model.stream_weights(j, t, coef);
        double next[3][3] = {};
        for (int k = 0; k < n; ++k)  // new stream k = sum_i alpha[i, k+1] H_i
          for (int c = 0; c < n; ++c)
            for (int i = 0; i < n; ++i) next[k][c] += double(coef[static_cast<std::size_t>(i * (n + 1) + 1 + k)]) * P[i][c];
        std::copy(&next[0][0], &next[0][0] + 9, &P[0][0]);
      }
      double forward = 0;
      for (const auto& row : P) forward = std::max(forward, std::abs(row[0] + row[1] + row[2]));
      sum += forward;
      most = std::max(most, forward);
    }
    EXPECT_NEAR(one.gain.composite_forward_mean, sum / (B * T), 1e-12);
    EXPECT_NEAR(one.gain.composite_forward_max, most, 1e-12);
    EXPECT_GT(most, sum / (B * T) * (1 + 1e-6));  // it varies by token
  }
  // At initialisation (W_alpha = w_beta = 0) every token's coefficients are A = [e_home, I] and
  // B = 1: pre-norm's running sum (1 from every earlier output, n at the sum readout), gains 1.
  save_initial(hc);
  const StreamDiagnostics init = diagnostics(hc);
  for (const auto& row : init.connections.rows)
    for (double w : row.weights) EXPECT_EQ(w, row.target == L ? 3.0 : 1.0) << "target " << row.target;
  for (double g : {init.gain.composite_forward_mean, init.gain.composite_forward_max, init.gain.composite_backward_mean,
                   init.gain.composite_backward_max, init.gain.layer_forward_max, init.gain.layer_backward_max})
    EXPECT_EQ(g, 1.0);

  // mHC: Sinkhorn ends on the rows (col -> row, the paper's order), so every H_res and their
  // product keep a forward gain of 1 up to float rounding; row -> col ends on the columns.
  for (const auto order : kernels::kSinkhornOrders) {
    const ModelConfig mhc =
        config({.name = "mhc", .residual = ResidualMode::mhc, .n_streams = 3, .sinkhorn_order = order});
    { SavedModel saved(mhc, B, T, path); }
    const StreamDiagnostics m = diagnostics(mhc);
    SCOPED_TRACE(kernels::to_string(order));
    EXPECT_EQ(m.connections.name, "mhc");
    ASSERT_EQ(m.connections.rows.size(), static_cast<std::size_t>(L + 1));
    const bool rows = order == kernels::SinkhornOrder::col_row;
    EXPECT_NEAR(rows ? m.gain.composite_forward_max : m.gain.composite_backward_max, 1.0, 1e-5);
    EXPECT_NEAR(rows ? m.gain.layer_forward_max : m.gain.layer_backward_max, 1.0, 1e-5);
    EXPECT_LE(rows ? m.gain.composite_backward_mean : m.gain.composite_forward_mean,
              rows ? m.gain.composite_backward_max : m.gain.composite_forward_max);
  }

  // Other modes have no streams.
  const std::unique_ptr<InferenceBackend> block = make_inference_backend("cpu", config({"block", ResidualMode::block}), B, T);
  EXPECT_FALSE(stream_diagnostics(*block, val, B, T, 64).has_value());
}
