// Guard for reproducibility of fp32 training: losses, gradients and AdamW updates of a fixed small
// model, block and rd, hashed bit for bit and compared with values recorded from the committed
// fp32 code (main at e00ccc4, before the bf16 kernels of issue #14). Any change to the fp32
// arithmetic of a kernel or of the model changes a hash; bf16-only code paths must not.
//
// The hashes hold for one machine class: the OpenBLAS kernel set (the sgemm blocking decides the
// summation order), the instruction set the build targets (-march=native: AVX-512 and AVX2
// builds vectorise and contract the model's own loops differently) and the fp32 GEMM backend of
// the Linear layers (kernels/gemm_f32.hpp: OpenBLAS, or the AVX2 kernel with its own summation
// order, since issue #32). Every backend the CPU has is checked, each forced in turn, so the
// OpenBLAS hashes recorded before the AVX2 kernel keep guarding that path unchanged. The test runs
// where hashes are recorded for the class it finds, and otherwise skips, saying which class it is
// and printing the hashes to record. OPENBLAS_CORETYPE=Prescott (SSE3 kernels, every x86-64)
// gives a recorded class on any AVX-512 or AVX2 machine: `.ci/run` runs the test that way too.
#include <gtest/gtest.h>
#include <cblas.h>

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/model_util.hpp"
#include "kernels/gemm_f32.hpp"
#include "model/model.hpp"
#include "optim/adamw.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

using namespace attnres;
using namespace attnres::testing;

namespace {

// The instruction set of this build (the model's own loops): part of the machine class.
#if defined(__AVX512F__)
constexpr const char* kIsa = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* kIsa = "avx2-fma";
#else
constexpr const char* kIsa = "baseline";
#endif

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

std::string to_hex(std::uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

}  // namespace

namespace k = attnres::kernels;

struct Expect {
  const char* core;  // openblas_get_corename()
  const char* isa;   // kIsa
  k::Fp32Gemm gemm;  // the Linear GEMMs' backend
  ResidualMode residual;
  int threads;
  std::uint64_t hash;
};

constexpr auto kBlas = k::Fp32Gemm::openblas;
constexpr auto kAvx2 = k::Fp32Gemm::avx2;

// OpenBLAS: recorded from main at e00ccc4 (Prescott, AVX-512: an Intel Xeon VM, Debian's OpenBLAS
// 0.3.21) and from main at ce3f50c, the same fp32 code (an AMD EPYC VM without AVX-512: Zen,
// Haswell and Prescott). AVX2 kernel: recorded where it was introduced (issue #32, the same AMD
// EPYC VM); it runs the Linear GEMMs and attention's products, so block and rd call no OpenBLAS
// at all and the hashes agree across OpenBLAS cores and thread counts.
constexpr Expect kExpected[] = {
    {"Prescott", "avx512", kBlas, ResidualMode::block, 1, 0xbf6b7727ad0236deull},
    {"Prescott", "avx512", kBlas, ResidualMode::block, 2, 0x91abdcff59cb7499ull},
    {"Prescott", "avx512", kBlas, ResidualMode::rd, 1, 0x7cb75d3101f3984bull},
    {"Prescott", "avx512", kBlas, ResidualMode::rd, 2, 0xa0309cd50416c685ull},
    {"Prescott", "avx2-fma", kBlas, ResidualMode::block, 1, 0xd84d770408c9bc18ull},
    {"Prescott", "avx2-fma", kBlas, ResidualMode::block, 2, 0x8a86000a99b801faull},
    {"Prescott", "avx2-fma", kBlas, ResidualMode::rd, 1, 0x24d7c6c589cb6950ull},
    {"Prescott", "avx2-fma", kBlas, ResidualMode::rd, 2, 0x41701dbcb5853d19ull},
    // Zen and Haswell: the same sgemm kernels, the same hashes.
    {"Zen", "avx2-fma", kBlas, ResidualMode::block, 1, 0x49d5cfbd265ea7eeull},
    {"Zen", "avx2-fma", kBlas, ResidualMode::block, 2, 0xf2ce6aab1b98e073ull},
    {"Zen", "avx2-fma", kBlas, ResidualMode::rd, 1, 0x9621552ce92d3e45ull},
    {"Zen", "avx2-fma", kBlas, ResidualMode::rd, 2, 0xa2a62fd48719f0daull},
    {"Haswell", "avx2-fma", kBlas, ResidualMode::block, 1, 0x49d5cfbd265ea7eeull},
    {"Haswell", "avx2-fma", kBlas, ResidualMode::block, 2, 0xf2ce6aab1b98e073ull},
    {"Haswell", "avx2-fma", kBlas, ResidualMode::rd, 1, 0x9621552ce92d3e45ull},
    {"Haswell", "avx2-fma", kBlas, ResidualMode::rd, 2, 0xa2a62fd48719f0daull},
    {"Prescott", "avx2-fma", kAvx2, ResidualMode::block, 1, 0x88d4ddba68b1cfd7ull},
    {"Prescott", "avx2-fma", kAvx2, ResidualMode::block, 2, 0x88d4ddba68b1cfd7ull},
    {"Prescott", "avx2-fma", kAvx2, ResidualMode::rd, 1, 0x30875ed97dcae59full},
    {"Prescott", "avx2-fma", kAvx2, ResidualMode::rd, 2, 0x30875ed97dcae59full},
    {"Zen", "avx2-fma", kAvx2, ResidualMode::block, 1, 0x88d4ddba68b1cfd7ull},
    {"Zen", "avx2-fma", kAvx2, ResidualMode::block, 2, 0x88d4ddba68b1cfd7ull},
    {"Zen", "avx2-fma", kAvx2, ResidualMode::rd, 1, 0x30875ed97dcae59full},
    {"Zen", "avx2-fma", kAvx2, ResidualMode::rd, 2, 0x30875ed97dcae59full},
    {"Haswell", "avx2-fma", kAvx2, ResidualMode::block, 1, 0x88d4ddba68b1cfd7ull},
    {"Haswell", "avx2-fma", kAvx2, ResidualMode::block, 2, 0x88d4ddba68b1cfd7ull},
    {"Haswell", "avx2-fma", kAvx2, ResidualMode::rd, 1, 0x30875ed97dcae59full},
    {"Haswell", "avx2-fma", kAvx2, ResidualMode::rd, 2, 0x30875ed97dcae59full},
};

TEST(Fp32Golden, TrainingStepsBitIdentical) {
  const std::string core = openblas_get_corename();
  int checked = 0;
  std::string record;
  for (const k::Fp32Gemm gemm : {kBlas, kAvx2}) {
    if (!k::fp32_gemm_available(gemm)) continue;
    k::set_fp32_gemm_backend(gemm);
    int found = 0;
    for (const Expect& e : kExpected) {
      if (core != e.core || std::string(kIsa) != e.isa || gemm != e.gemm) continue;
      const std::uint64_t got = train_hash(e.residual, e.threads);
      EXPECT_EQ(got, e.hash) << k::to_string(gemm) << " GEMMs, " << to_string(e.residual) << ", " << e.threads
                             << " threads: got 0x" << std::hex << got;
      ++found;
    }
    if (found == 0)
      for (ResidualMode residual : {ResidualMode::block, ResidualMode::rd})
        for (int threads : {1, 2})
          record += concat("\n    {\"", core, "\", \"", kIsa, "\", ", gemm == kBlas ? "kBlas" : "kAvx2",
                           ", ResidualMode::", to_string(residual), ", ", threads, ", 0x",
                           to_hex(train_hash(residual, threads)), "ull},");
    checked += found;
  }
  k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
  const std::string what = concat("OpenBLAS core ", core, ", ", kIsa, " build");
  if (checked == 0)
    GTEST_SKIP() << "no hashes recorded for this machine class (" << what
                 << "); run with OPENBLAS_CORETYPE=Prescott, or record these if this build is known good:" << record;
  if (!record.empty())
    std::printf("[ NOTE     ] %s: no hashes recorded for some fp32 GEMM backends; if this build is known good:%s\n",
                what.c_str(), record.c_str());
}
