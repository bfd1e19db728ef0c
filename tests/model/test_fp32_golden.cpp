// Guard for reproducibility of fp32 training: losses, gradients and AdamW updates of a fixed small
// model, block and rd, hashed bit for bit and compared with values recorded from the committed
// fp32 code (main at e00ccc4, before the bf16 kernels of issue #14). Any change to the fp32
// arithmetic of a kernel or of the model changes a hash; bf16-only code paths must not.
//
// The hashes hold for one OpenBLAS kernel set (the sgemm blocking decides the summation order): the
// test runs where OpenBLAS reports the core they were recorded with and skips elsewhere. To
// record after an intended change, run the test and copy the printed hashes.
#include <gtest/gtest.h>
#include <cblas.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "optim/adamw.hpp"
#include "util/threads.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

constexpr const char* kRecordedCore = "Prescott";  // what Debian's OpenBLAS 0.3.21 reports on this VM

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
};

// Three training steps (forward_backward, clip, AdamW) of a 2-layer model: d 64, 2 heads of 32,
// SwiGLU 96, vocabulary 97, batch 2 x 80 tokens (more than one 64-query attention block).
std::uint64_t train_hash(ResidualMode residual, int threads) {
  ModelConfig c = tiny_config(residual);
  c.vocab_size = 97;
  c.d_model = 64;
  c.mlp_hidden = 96;
  c.max_seq_len = 80;
  const int batch = 2, seq = 80;
  const int saved = num_threads();
  set_num_threads(threads);
  Model<float> model(c, batch, seq, true);
  randomize_weights(model, 5);
  AdamW<float> opt(model.layout(), AdamWConfig{});
  Fnv fnv;
  for (int step = 0; step < 3; ++step) {
    const double loss = model.forward_backward(random_tokens(batch, seq, c.vocab_size, 40 + step), batch, seq);
    fnv.add(&loss, sizeof loss);
    fnv.add(model.grads().data(), model.grads().size_bytes());
    const double norm = clip_grad_norm<float>(model.grads(), 1.0);
    fnv.add(&norm, sizeof norm);
    opt.step(model.params(), model.grads(), 1e-2);
    fnv.add(model.params().data(), model.params().size_bytes());
  }
  set_num_threads(saved);
  return fnv.h;
}

}  // namespace

TEST(Fp32Golden, TrainingStepsBitIdentical) {
  const std::string core = openblas_get_corename();
  if (core != kRecordedCore) GTEST_SKIP() << "hashes recorded with OpenBLAS core " << kRecordedCore << ", this is " << core;
  struct Expect {
    ResidualMode residual;
    int threads;
    std::uint64_t hash;
  };
  const Expect expected[] = {
      {ResidualMode::block, 1, 0xbf6b7727ad0236deull},
      {ResidualMode::block, 2, 0x91abdcff59cb7499ull},
      {ResidualMode::rd, 1, 0x7cb75d3101f3984bull},
      {ResidualMode::rd, 2, 0xa0309cd50416c685ull},
  };
  for (const Expect& e : expected) {
    const std::uint64_t got = train_hash(e.residual, e.threads);
    EXPECT_EQ(got, e.hash) << to_string(e.residual) << ", " << e.threads << " threads: got 0x" << std::hex << got;
  }
}
