// The inference role (train/inference.hpp) on the CPU: weights loaded from a file give exactly
// Model<float>'s loss, logits, depth routing and KV-cache decoding, and the evaluation of a
// split through it equals the evaluation through the model; the training backend answers the
// same calls the same way.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/cli_util.hpp"
#include "common/model_util.hpp"
#include "data/loader.hpp"
#include "experiment/routing.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "model/topology.hpp"
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

  // Loss, and the routing of that pass.
  const std::vector<std::int32_t> tokens = random_tokens(B, T, c.vocab_size, 11);
  EXPECT_EQ(backend->loss(tokens, B, T), model.forward(tokens, B, T));
  const Topology topology(c);
  const DepthRouting* routing = backend->routing();
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
  ASSERT_NE(train->routing(), nullptr);
  std::vector<float> got(3), want(3);
  train->routing()->read_weights(3, 0, 1, got);  // sublayer 3 reads [emb, b_1, partial]
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

// MUDD's connections for an experiment's result.json (experiment/routing.hpp): the token-mean of
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
    const auto connections = experiment::mudd_connections(*backend, val, B, T, 64);
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
    for (const auto& way : experiment::mudd_connections(*backend, val, B, T, 64))
      for (const auto& row : way.rows)
        for (std::size_t j = 0; j < row.weights.size(); ++j)
          EXPECT_EQ(row.weights[j], j + 1 == row.weights.size() ? 1.0 : 0.0) << way.name << " " << row.target;
  }
  // The prenorm backend has no DA modules; other modes have no MUDD connections.
  ModelConfig prenorm = c;
  prenorm.residual = ResidualMode::prenorm;
  const std::unique_ptr<InferenceBackend> pre = make_inference_backend("cpu", prenorm, B, T);
  EXPECT_TRUE(experiment::mudd_connections(*pre, val, B, T, 64).empty());
}
