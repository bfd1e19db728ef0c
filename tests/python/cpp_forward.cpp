// Test helper for tests/python: the C++ model's logits and depth weights for given inputs, so the
// Python package can be compared with it on a trained checkpoint (the CLI prints neither).
//
//   attnres_cpp_forward WEIGHTS INPUTS OUT
//   WEIGHTS: model.safetensors; INPUTS: tensor "inputs", I32 or I64 [B, T];
//   OUT (F32): "logits" [B, T, vocab] from Model<float>::logits, and for every read r and route q
//   "read.<r>.route.<q>" [B, T, n_sources] from Model<float>::read_weights after that forward, with
//   "read.<r>.sources" (I32) its ReadPlan::sources (model/topology.hpp); for every DenseFormer DWA
//   "dwa.<block>.sources" (I32, DwaPlan::sources) and "dwa.<block>.alpha" (F32, the weights it mixes with).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "model/safetensors.hpp"

using namespace attnres;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s WEIGHTS INPUTS OUT\n", argv[0]);
    return 2;
  }
  try {
    const std::string weights = argv[1], inputs_path = argv[2], out_path = argv[3];
    const ModelConfig config = read_weights_config(weights);
    const SafetensorsFile in = read_safetensors(inputs_path);
    const StoredTensor& t = in.at("inputs", inputs_path);
    if (t.shape.size() != 2) throw std::runtime_error("inputs must be [B, T]");
    const std::int64_t B = t.shape[0];
    const int T = static_cast<int>(t.shape[1]);
    const std::vector<std::int32_t> ids = t.values<std::int32_t>();

    Model<float> model(config, B, T, false);
    load_weights<float>(weights, config, model.layout(), model.params());
    std::vector<float> logits(static_cast<std::size_t>(B * T * config.vocab_size));
    model.logits(ids, B, T, logits);

    std::vector<TensorRef> out = {{"logits", DType::F32, {B, T, config.vocab_size}, logits.data()}};
    // Storage first, refs after: the vectors must not move once referenced.
    std::vector<std::vector<float>> alphas;
    std::vector<std::vector<std::int32_t>> sources;
    std::vector<std::string> names;
    const std::vector<ReadPlan>& plans = model.topology().reads();
    const int n_reads = static_cast<int>(plans.size());
    alphas.reserve(static_cast<std::size_t>(2 * n_reads));
    const std::vector<DwaPlan>& dwas = model.topology().dwas();
    sources.reserve(static_cast<std::size_t>(n_reads) + dwas.size());
    for (int r = 0; r < n_reads; ++r) {
      const ReadPlan& plan = plans[static_cast<std::size_t>(r)];
      const auto n = static_cast<std::int64_t>(plan.sources.size());
      sources.emplace_back(plan.sources.begin(), plan.sources.end());
      out.push_back({"read." + std::to_string(r) + ".sources", DType::I32, {n}, sources.back().data()});
      for (int q = 0; q < plan.n_routes; ++q) {
        std::vector<float> a(static_cast<std::size_t>(B * T * n));
        for (std::int64_t tok = 0; tok < B * T; ++tok)
          model.read_weights(r, q, tok, std::span<float>(a.data() + tok * n, static_cast<std::size_t>(n)));
        alphas.push_back(std::move(a));
        out.push_back({"read." + std::to_string(r) + ".route." + std::to_string(q), DType::F32, {B, T, n},
                       alphas.back().data()});
      }
    }
    for (const DwaPlan& p : dwas) {
      const auto n = static_cast<std::int64_t>(p.sources.size());
      const std::string name = "dwa." + std::to_string(p.block);
      sources.emplace_back(p.sources.begin(), p.sources.end());
      out.push_back({name + ".sources", DType::I32, {n}, sources.back().data()});
      const ParamInfo& alpha = model.layout().at(name + ".alpha");
      out.push_back({name + ".alpha", DType::F32, {n}, model.params().data() + alpha.offset});
    }
    write_safetensors(out_path, {}, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnres_cpp_forward: %s\n", e.what());
    return 1;
  }
  return 0;
}
