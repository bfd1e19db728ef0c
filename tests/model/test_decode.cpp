// Incremental decoding with the KV cache must give the logits of a full forward pass.
#include <gtest/gtest.h>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;

class Decode : public ::testing::TestWithParam<Variant> {};

TEST_P(Decode, CachedStepsMatchTheFullPass) {
  const Variant v = GetParam();
  const ModelConfig c = tiny_config(v);
  const int B = 2, T = 7;
  Model<double> model(c, B, T, false);
  randomize_weights(model, 8);
  std::vector<std::int32_t> inputs(B * T);
  for (int i = 0; i < B * T; ++i) inputs[i] = (i * 5 + 1) % c.vocab_size;
  std::vector<double> full(B * T * c.vocab_size);
  model.logits(inputs, B, T, full);

  KvCache<double> cache(c, B, T);
  std::vector<double> step(B * c.vocab_size);
  // A prompt of 3 tokens, then one token at a time.
  auto feed = [&](int t0, int len) {
    std::vector<std::int32_t> chunk;
    for (int b = 0; b < B; ++b)
      for (int t = t0; t < t0 + len; ++t) chunk.push_back(inputs[b * T + t]);
    model.decode(chunk, B, len, cache, step);
    const int last = t0 + len - 1;
    for (int b = 0; b < B; ++b)
      for (int x = 0; x < c.vocab_size; ++x)
        EXPECT_NEAR(step[b * c.vocab_size + x], full[(b * T + last) * c.vocab_size + x], 1e-12)
            << "position " << last;
  };
  feed(0, 3);
  for (int t = 3; t < T; ++t) feed(t, 1);
  EXPECT_EQ(cache.length, T);
  EXPECT_THROW(feed(0, 1), Error);  // the context is full
}

INSTANTIATE_TEST_SUITE_P(AllModes, Decode, ::testing::ValuesIn(all_variants()),
                         [](const auto& info) { return info.param.name; });
