// The bf16 GEMM (kernels/gemm_bf16.hpp): the AMX path and the portable fallback against a
// double-precision product of the same bf16-rounded operands, every transpose combination, odd
// sizes, alpha/beta and padded leading dimensions; thread-count determinism; and bf16 Linear
// GEMMs in a whole model (kernels::MatmulPrecision).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/model_util.hpp"
#include "common/test_util.hpp"
#include "kernels/cross_entropy.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_bf16.hpp"
#include "model/model.hpp"
#include "optim/adamw.hpp"
#include "train/train_config.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// One GEMM problem: stored operands with padded leading dimensions, and C's initial value.
struct Case {
  bool ta = false, tb = false;
  std::int64_t m = 1, n = 1, k = 1, pad = 0;
  float alpha = 1, beta = 0;

  std::int64_t lda() const { return (ta ? m : k) + pad; }
  std::int64_t ldb() const { return (tb ? k : n) + pad; }
  std::int64_t ldc() const { return n + pad; }
  std::size_t a_size() const { return static_cast<std::size_t>((ta ? k : m) * lda()); }
  std::size_t b_size() const { return static_cast<std::size_t>((tb ? n : k) * ldb()); }
  std::size_t c_size() const { return static_cast<std::size_t>(m * ldc()); }
  float a_at(const std::vector<float>& a, std::int64_t i, std::int64_t p) const {
    return ta ? a[static_cast<std::size_t>(p * lda() + i)] : a[static_cast<std::size_t>(i * lda() + p)];
  }
  float b_at(const std::vector<float>& b, std::int64_t p, std::int64_t j) const {
    return tb ? b[static_cast<std::size_t>(j * ldb() + p)] : b[static_cast<std::size_t>(p * ldb() + j)];
  }
};

struct Data {
  std::vector<float> a, b, c0;
};

Data make_data(const Case& c, std::uint64_t seed) {
  Data d{random_vector<float>(c.a_size(), seed), random_vector<float>(c.b_size(), seed + 1),
         random_vector<float>(c.c_size(), seed + 2)};
  return d;
}

// alpha * op(round(A)) op(round(B)) + beta * C in double; padding columns of C keep their value.
std::vector<double> reference(const Case& c, const Data& d) {
  std::vector<double> out(d.c0.begin(), d.c0.end());
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < c.n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < c.k; ++p)
        s += double(k::round_to_bf16(c.a_at(d.a, i, p))) * double(k::round_to_bf16(c.b_at(d.b, p, j)));
      const double old = d.c0[static_cast<std::size_t>(i * c.ldc() + j)];
      out[static_cast<std::size_t>(i * c.ldc() + j)] = double(c.alpha) * s + (c.beta == 0 ? 0.0 : double(c.beta) * old);
    }
  return out;
}

std::vector<float> run(const Case& c, const Data& d, k::Bf16Backend backend) {
  std::vector<float> out = d.c0;
  if (c.beta == 0)  // C must not be read: NaN in the valid part would otherwise propagate
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j)
        out[static_cast<std::size_t>(i * c.ldc() + j)] = std::numeric_limits<float>::quiet_NaN();
  k::gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, c.alpha, d.a.data(), c.lda(), d.b.data(), c.ldb(), c.beta, out.data(),
               c.ldc(), backend);
  return out;
}

// Every listed combination of sizes, transposes, alpha/beta and padding.
std::vector<Case> cases() {
  std::vector<Case> out;
  const std::int64_t sizes[] = {1, 15, 17, 33, 100};
  int variant = 0;
  for (std::int64_t m : sizes)
    for (std::int64_t n : sizes)
      for (std::int64_t kk : sizes)
        for (int t = 0; t < 4; ++t) {
          Case c;
          c.ta = (t & 1) != 0;
          c.tb = (t & 2) != 0;
          c.m = m;
          c.n = n;
          c.k = kk;
          switch (variant++ % 4) {
            case 0: break;
            case 1: c.alpha = 0.75f, c.beta = 1.0f; break;
            case 2: c.pad = 3, c.beta = -0.5f; break;
            case 3: c.pad = 16, c.alpha = -2.0f; break;
          }
          out.push_back(c);
        }
  // Model-like shapes: several k tiles and k passes, more than one task per thread, and (k = 2048,
  // 10 column pairs) B in more than one column chunk.
  for (int t = 0; t < 4; ++t) {
    out.push_back(Case{(t & 1) != 0, (t & 2) != 0, 64, 96, 256, 0, 1, 0});
    out.push_back(Case{(t & 1) != 0, (t & 2) != 0, 130, 70, 300, 5, 1, 1});
    out.push_back(Case{(t & 1) != 0, (t & 2) != 0, 70, 300, 2048, 2, 1, 0.5f});
  }
  return out;
}

std::string describe(const Case& c) {
  return concat("m=", c.m, " n=", c.n, " k=", c.k, " trans_a=", c.ta, " trans_b=", c.tb, " pad=", c.pad,
                " alpha=", c.alpha, " beta=", c.beta);
}

// max |got - ref| over the valid part / max |ref|, and the padding columns untouched.
double check(const Case& c, const std::vector<float>& got, const std::vector<double>& ref, const Data& d) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < c.ldc(); ++j) {
      const auto at = static_cast<std::size_t>(i * c.ldc() + j);
      if (j >= c.n) {
        EXPECT_EQ(to_bits(got[at]), to_bits(d.c0[at])) << "padding overwritten, " << describe(c);
        continue;
      }
      diff = std::max(diff, std::abs(double(got[at]) - ref[at]));
      scale = std::max(scale, std::abs(ref[at]));
      if (!std::isfinite(got[at])) return std::numeric_limits<double>::infinity();
    }
  return scale == 0 ? diff : diff / scale;
}

constexpr double kTol = 1e-5;

}  // namespace

TEST(Bf16, RoundingIsNearestEven) {
  EXPECT_EQ(k::round_to_bf16(1.0f), 1.0f);
  EXPECT_EQ(k::round_to_bf16(-3.5f), -3.5f);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(k::round_to_bf16(1.0f + 0x1p-8f), 1.0f);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one, 1 + 2^-6.
  EXPECT_EQ(k::round_to_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
  EXPECT_EQ(k::round_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_EQ(k::bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(k::bf16_bits(-2.0f), 0xc000);
  EXPECT_TRUE(std::isinf(k::round_to_bf16(std::numeric_limits<float>::max())));  // rounds up to inf
  EXPECT_TRUE(std::isinf(k::round_to_bf16(-std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(k::round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(k::round_to_bf16(from_bits(0x7f800001u))));  // a NaN that would round to inf
  EXPECT_EQ(to_bits(k::round_to_bf16(from_bits(0x00000001u))), 0u);           // denormal -> +0
  EXPECT_EQ(to_bits(k::round_to_bf16(from_bits(0x807fffffu))), 0x80000000u);  // -denormal -> -0
  EXPECT_EQ(k::round_to_bf16(std::numeric_limits<float>::min()), std::numeric_limits<float>::min());
  // Every rounded value is a bf16: the low 16 bits are zero, and rounding again changes nothing.
  const auto v = random_vector<float>(1000, 5, 100.0);
  for (float x : v) {
    const float r = k::round_to_bf16(x);
    EXPECT_EQ(to_bits(r) & 0xffffu, 0u);
    EXPECT_EQ(k::round_to_bf16(r), r);
    EXPECT_LE(std::abs(r - x), std::abs(x) * 0x1p-8f);
  }
}

TEST(Bf16, FallbackMatchesReference) {
  std::uint64_t seed = 100;
  for (const Case& c : cases()) {
    const Data d = make_data(c, seed += 3);
    const double err = check(c, run(c, d, k::Bf16Backend::fallback), reference(c, d), d);
    EXPECT_LT(err, kTol) << describe(c);
  }
}

// ---- the hardware backends (each skips where the CPU or OS lacks it) -------------------------

// How GoogleTest shows a backend (found by argument-dependent lookup, so in the enum's namespace):
// "avx512-fma", not "4-byte object <02-00 00-00>".
namespace attnres::kernels {
void PrintTo(Bf16Backend backend, std::ostream* os) { *os << to_string(backend); }
}  // namespace attnres::kernels

class Bf16Hardware : public ::testing::TestWithParam<k::Bf16Backend> {
 protected:
  void SetUp() override {
    if (!k::bf16_backend_available(GetParam()))
      GTEST_SKIP() << k::to_string(GetParam()) << " is not available on this machine";
  }
};

INSTANTIATE_TEST_SUITE_P(Backends, Bf16Hardware,
                         ::testing::Values(k::Bf16Backend::amx, k::Bf16Backend::avx512_fma,
                                           k::Bf16Backend::avx512_bf16),
                         [](const ::testing::TestParamInfo<k::Bf16Backend>& info) {
                           std::string name = k::to_string(info.param);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST_P(Bf16Hardware, MatchesReference) {
  std::uint64_t seed = 100;
  for (const Case& c : cases()) {
    const Data d = make_data(c, seed += 3);
    const double err = check(c, run(c, d, GetParam()), reference(c, d), d);
    EXPECT_LT(err, kTol) << describe(c);
  }
}

// Element by element, the difference from the float64 product of the rounded operands stays within
// the bound of a k-term fp32 sum of exact products, (k + 2) * 2^-24 * (|alpha| sum |a b| + |beta c|):
// any summation order meets it, a dropped or doubled product does not.
TEST_P(Bf16Hardware, WithinSummationBound) {
  std::uint64_t seed = 300;
  for (const Case& c : cases()) {
    const Data d = make_data(c, seed += 3);
    const std::vector<float> got = run(c, d, GetParam());
    const std::vector<double> ref = reference(c, d);
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j) {
        double magnitude = 0;
        for (std::int64_t p = 0; p < c.k; ++p)
          magnitude += std::abs(double(k::round_to_bf16(c.a_at(d.a, i, p))) * double(k::round_to_bf16(c.b_at(d.b, p, j))));
        const auto at = static_cast<std::size_t>(i * c.ldc() + j);
        const double bound = double(c.k + 2) * 0x1p-24 *
                             (std::abs(double(c.alpha)) * magnitude + std::abs(double(c.beta) * d.c0[at])) + 1e-30;
        ASSERT_LE(std::abs(double(got[at]) - ref[at]), bound) << describe(c) << " at " << i << "," << j;
      }
  }
}

TEST_P(Bf16Hardware, MatchesFallback) {
  std::uint64_t seed = 7;
  for (const Case& c : cases()) {
    const Data d = make_data(c, seed += 3);
    const std::vector<float> hw = run(c, d, GetParam()), fb = run(c, d, k::Bf16Backend::fallback);
    EXPECT_LT(max_rel_error(hw, fb), kTol) << describe(c);
  }
}

// The AVX-512 backends sum in a documented order, so a scalar model reproduces them bit for bit
// (inputs of magnitude ~1: no denormal partial sums, which VDPBF16PS would flush):
//   avx512-fma:  acc = fma(a_p, b_p, acc) for p = 0, 1, ..., k-1;
//   avx512-bf16: per pair, acc = fma(a_2q+1, b_2q+1, acc), then acc = fma(a_2q, b_2q, acc);
// then C = fma(beta, C, alpha * acc) (alpha * acc when beta == 0).
TEST_P(Bf16Hardware, ExactSummationOrder) {
  const k::Bf16Backend backend = GetParam();
  if (backend == k::Bf16Backend::amx) GTEST_SKIP() << "the tile unit's internal order is not specified";
  std::uint64_t seed = 500;
  for (const Case& c : cases()) {
    const Data d = make_data(c, seed += 3);
    const std::vector<float> got = run(c, d, backend);
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j) {
        auto term = [&](std::int64_t p, float acc) {
          return std::fma(k::round_to_bf16(c.a_at(d.a, i, p)), k::round_to_bf16(c.b_at(d.b, p, j)), acc);
        };
        float acc = 0;
        if (backend == k::Bf16Backend::avx512_fma) {
          for (std::int64_t p = 0; p < c.k; ++p) acc = term(p, acc);
        } else {
          for (std::int64_t p = 0; p < c.k; p += 2) {
            if (p + 1 < c.k) acc = term(p + 1, acc);
            acc = term(p, acc);
          }
        }
        const auto at = static_cast<std::size_t>(i * c.ldc() + j);
        const float want = c.beta == 0 ? c.alpha * acc : std::fma(c.beta, d.c0[at], c.alpha * acc);
        ASSERT_EQ(to_bits(got[at]), to_bits(want)) << describe(c) << " at " << i << "," << j;
      }
  }
}

// The packing rounds like round_to_bf16, bit for bit (k = 1 and a unit B make C the rounded A
// itself), on ties, denormals, huge values and random bit patterns: AMX and VDPBF16PS through
// VCVTNEPS2BF16, the FMA backend through its integer rounding.
TEST_P(Bf16Hardware, RoundsLikeRoundToBf16) {
  const k::Bf16Backend backend = GetParam();
  std::vector<float> a = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f, 1e30f, -7.25f, 0.0f,
                          std::numeric_limits<float>::min(), from_bits(0x3f808000u), from_bits(0x3f818000u)};
  Rng rng(11);
  while (a.size() < 1000) {
    const float f = from_bits(static_cast<std::uint32_t>(rng.next_u64()));
    // Finite, and products with 1 stay normal (AMX flushes denormal results; so does the reference).
    if (std::isfinite(f) && std::abs(f) > 1e-30f && std::abs(f) < 1e30f) a.push_back(f);
  }
  const auto m = static_cast<std::int64_t>(a.size());
  for (bool ta : {false, true}) {
    const float one = 1.0f;
    std::vector<float> c(a.size());
    k::gemm_bf16(ta, false, m, 1, 1, 1.0f, a.data(), ta ? m : 1, &one, 1, 0.0f, c.data(), 1, backend);
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(to_bits(c[i]), to_bits(k::round_to_bf16(a[i]))) << "a = " << a[i] << " trans_a=" << ta;
    // The same through B (n = size, the B packing paths).
    std::vector<float> row(a.size());
    k::gemm_bf16(false, ta, 1, m, 1, 1.0f, &one, 1, a.data(), ta ? 1 : m, 0.0f, row.data(), m, backend);
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(to_bits(row[i]), to_bits(k::round_to_bf16(a[i]))) << "b = " << a[i] << " trans_b=" << ta;
  }
}

// The FMA backend's integer rounding on the special values too (inf, NaN, denormals, overflow),
// which the products above must avoid: with k = 1 and B = 1 the FMA is exact, so C is the rounded
// A added to the zero the sum starts from (-0 becomes +0; a NaN only needs to stay a NaN).
TEST(Bf16, FmaBackendRoundsSpecialValues) {
  if (!k::bf16_backend_available(k::Bf16Backend::avx512_fma)) GTEST_SKIP() << "no AVX-512 on this machine";
  std::vector<float> a = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                          from_bits(0x00000001u), from_bits(0x807fffffu), -0.0f,
                          std::numeric_limits<float>::quiet_NaN(), from_bits(0x7f800001u), from_bits(0xff800001u)};
  Rng rng(12);
  while (a.size() < 2000) a.push_back(from_bits(static_cast<std::uint32_t>(rng.next_u64())));
  const auto m = static_cast<std::int64_t>(a.size());
  const float one = 1.0f;
  std::vector<float> c(a.size());
  k::gemm_bf16(false, false, m, 1, 1, 1.0f, a.data(), 1, &one, 1, 0.0f, c.data(), 1, k::Bf16Backend::avx512_fma);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float want = k::round_to_bf16(a[i]) + 0.0f;
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(c[i])) << to_bits(a[i]);
    else ASSERT_EQ(to_bits(c[i]), to_bits(want)) << "bits " << to_bits(a[i]);
  }
}

TEST(Bf16, KZeroScalesC) {
  for (auto backend : {k::Bf16Backend::fallback, k::Bf16Backend::automatic, k::Bf16Backend::avx512_fma,
                       k::Bf16Backend::avx512_bf16, k::Bf16Backend::amx}) {
    if (!k::bf16_backend_available(backend)) continue;
    std::vector<float> c = {1, 2, 3, 4};
    const float dummy = 0;
    k::gemm_bf16(false, false, 2, 2, 0, 1.0f, &dummy, 1, &dummy, 2, 0.5f, c.data(), 2, backend);
    EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
    k::gemm_bf16(false, false, 2, 2, 0, 1.0f, &dummy, 1, &dummy, 2, 0.0f, c.data(), 2, backend);
    EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
  }
}

// Each output element is summed by one thread in a fixed order: bit-identical for any thread count.
TEST_P(Bf16Hardware, DeterministicAcrossThreadCounts) {
  const int saved = num_threads();
  for (int t = 0; t < 4; ++t) {
    const Case c{(t & 1) != 0, (t & 2) != 0, 515, 300, t < 2 ? 600 : 2048, 1, 1, 1};
    const Data d = make_data(c, 40 + t);
    set_num_threads(1);
    const std::vector<float> one = run(c, d, GetParam());
    for (int threads : {2, 3, 5}) {
      set_num_threads(threads);
      const std::vector<float> many = run(c, d, GetParam());
      ASSERT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
          << threads << " threads, " << describe(c);
    }
  }
  set_num_threads(saved);
}

// A B packed once (Bf16PackedB) gives what gemm_bf16 gives, bit for bit, on every backend.
TEST(Bf16, PackedBMatchesUnpacked) {
  std::uint64_t seed = 900;
  for (auto backend : {k::Bf16Backend::fallback, k::Bf16Backend::amx, k::Bf16Backend::avx512_fma,
                       k::Bf16Backend::avx512_bf16}) {
    if (!k::bf16_backend_available(backend)) continue;
    for (const Case& c : cases()) {
      const Data d = make_data(c, seed += 3);
      k::Bf16PackedB packed;
      packed.pack(c.tb, c.n, c.k, d.b.data(), c.ldb(), backend);
      std::vector<float> got = d.c0, want = d.c0;
      k::gemm_bf16_packed(c.ta, c.m, c.alpha, d.a.data(), c.lda(), packed, c.beta, got.data(), c.ldc());
      k::gemm_bf16(c.ta, c.tb, c.m, c.n, c.k, c.alpha, d.a.data(), c.lda(), d.b.data(), c.ldb(), c.beta, want.data(),
                   c.ldc(), backend);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << k::to_string(backend) << " " << describe(c);
    }
  }
}

// The LM head's cross-entropy with bf16 GEMMs (weight packed once per call, fp32 softmax): loss
// and gradients close to fp32's, across two chunks of rows and a vocabulary that is not a
// multiple of 16.
TEST(Bf16, CrossEntropyCloseToFp32) {
  const int n = 300, d = 64, V = 1003;
  auto x = random_vector<float>(n * d, 1), w = random_vector<float>(V * d, 2, 0.2);
  std::vector<std::int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[i] = (i * 37 + 11) % V;
  std::vector<float> logits(256 * V);
  std::vector<double> row_loss(256);
  const k::CrossEntropyScratch<float> scratch{logits.data(), row_loss.data(), 256};
  auto run_ce = [&](k::MatmulPrecision p, std::vector<float>& dx, std::vector<float>& dw) {
    dx.assign(n * d, 0.0f);
    dw.assign(V * d, 0.0f);
    return k::lm_head_cross_entropy<float>(x.data(), w.data(), targets.data(), n, d, V, scratch, 1.0f / n, dx.data(),
                                           dw.data(), p) / n;
  };
  std::vector<float> dx32, dw32, dx16, dw16;
  const double l32 = run_ce(k::MatmulPrecision::fp32, dx32, dw32), l16 = run_ce(k::MatmulPrecision::bf16, dx16, dw16);
  EXPECT_NEAR(l16, l32, 1e-2 * l32);
  EXPECT_NE(l16, l32);
  EXPECT_LT(max_rel_error(dx16, dx32), 2e-2);
  EXPECT_LT(max_rel_error(dw16, dw32), 2e-2);
  EXPECT_GT(max_rel_error(dx16, dx32), 1e-5);  // the bf16 path did run
  // Forward only (no gradient) gives the same loss.
  const double forward = k::lm_head_cross_entropy<float>(x.data(), w.data(), targets.data(), n, d, V, scratch, 0.0f,
                                                         nullptr, nullptr, k::MatmulPrecision::bf16) / n;
  EXPECT_EQ(forward, l16);
}

TEST(Bf16, BackendChoice) {
  const k::Bf16Backend chosen = k::bf16_backend();
  EXPECT_NE(chosen, k::Bf16Backend::automatic);
  EXPECT_TRUE(k::bf16_backend_available(chosen));
  // AMX when present; without it an AVX-512 machine must not land on the slow fallback.
  const char* forced = std::getenv("ATTNRES_BF16_BACKEND");
  if (forced != nullptr && forced[0] != '\0' && k::parse_bf16_backend(forced) != k::Bf16Backend::automatic) {
    EXPECT_EQ(chosen, k::parse_bf16_backend(forced));
  } else if (k::amx_bf16_available()) {
    EXPECT_EQ(chosen, k::Bf16Backend::amx);
  } else if (k::bf16_backend_available(k::Bf16Backend::avx512_fma)) {
    EXPECT_NE(chosen, k::Bf16Backend::fallback);
  }
  for (auto b : {k::Bf16Backend::automatic, k::Bf16Backend::amx, k::Bf16Backend::avx512_fma,
                 k::Bf16Backend::avx512_bf16, k::Bf16Backend::fallback})
    EXPECT_EQ(k::parse_bf16_backend(k::to_string(b)), b);
  EXPECT_THROW(k::parse_bf16_backend("avx2"), Error);
  for (auto b : {k::Bf16Backend::amx, k::Bf16Backend::avx512_fma, k::Bf16Backend::avx512_bf16}) {
    if (k::bf16_backend_available(b)) continue;
    float x = 1, y = 0;
    EXPECT_THROW(k::gemm_bf16(false, false, 1, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &y, 1, b), Error) << k::to_string(b);
  }
}

TEST(Bf16, LinearPrecisionSwitch) {
  const int n = 37, in = 45, out = 29;
  auto x = random_vector<float>(n * in, 1), w = random_vector<float>(out * in, 2), dy = random_vector<float>(n * out, 3);
  std::vector<float> y32(n * out), y16(n * out), dx32(n * in), dx16(n * in), dw32(out * in, 0.0f), dw16(out * in, 0.0f);
  k::linear_forward(y32.data(), x.data(), w.data(), n, in, out);
  k::linear_forward(y16.data(), x.data(), w.data(), n, in, out, false, k::MatmulPrecision::bf16);
  k::linear_backward_input(dx32.data(), dy.data(), w.data(), n, in, out);
  k::linear_backward_input(dx16.data(), dy.data(), w.data(), n, in, out, false, k::MatmulPrecision::bf16);
  k::linear_backward_weight(dw32.data(), dy.data(), x.data(), n, in, out);
  k::linear_backward_weight(dw16.data(), dy.data(), x.data(), n, in, out, k::MatmulPrecision::bf16);
  // bf16 operands: about 2^-8 relative per operand; clearly not fp32 any more, but close.
  for (auto [a, b] : {std::pair{&y16, &y32}, std::pair{&dx16, &dx32}, std::pair{&dw16, &dw32}}) {
    const double err = max_rel_error(*a, *b);
    EXPECT_LT(err, 2e-2);
    EXPECT_GT(err, 1e-6);
  }
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), yd(n * out);
  EXPECT_THROW(k::linear_forward(yd.data(), xd.data(), wd.data(), n, in, out, false, k::MatmulPrecision::bf16), Error);
  EXPECT_EQ(k::parse_matmul_precision("bf16"), k::MatmulPrecision::bf16);
  EXPECT_EQ(k::parse_matmul_precision("fp32"), k::MatmulPrecision::fp32);
  EXPECT_STREQ(k::to_string(k::MatmulPrecision::bf16), "bf16");
  EXPECT_THROW(k::parse_matmul_precision("fp16"), Error);
}

// A tiny model trained on one batch: bf16 Linear GEMMs lower the loss like fp32 and stay close.
// (rd, and mudd, whose DA modules stay in fp32: only the GEMMs of the sublayers and the head change.)
TEST(Bf16, ModelTrainsCloseToFp32) {
  for (ResidualMode mode : {ResidualMode::rd, ResidualMode::mudd}) {
    SCOPED_TRACE(to_string(mode));
    ModelConfig config = tiny_config(mode);
    config.vocab_size = 50;
    config.d_model = 32;
    config.mlp_hidden = 80;
    config.n_heads = 2;
    config.max_seq_len = 16;
    const int batch = 4, seq = 16;
    Model<float> m32(config, batch, seq, true), m16(config, batch, seq, true);
    init_params<float>(m32.layout(), 3, m32.params());
    init_params<float>(m16.layout(), 3, m16.params());
    m16.set_matmul_precision(k::MatmulPrecision::bf16);
    EXPECT_EQ(m16.matmul_precision(), k::MatmulPrecision::bf16);
    AdamW<float> o32(m32.layout(), AdamWConfig{}), o16(m16.layout(), AdamWConfig{});
    const auto tokens = random_tokens(batch, seq, config.vocab_size, 9);
    double first = 0, last32 = 0, last16 = 0;
    for (int step = 0; step < 8; ++step) {
      last32 = m32.forward_backward(tokens, batch, seq);
      last16 = m16.forward_backward(tokens, batch, seq);
      if (step == 0) first = last16;
      EXPECT_NEAR(last16, last32, 1e-2) << "step " << step;
      o32.step(m32.params(), m32.grads(), 1e-2);
      o16.step(m16.params(), m16.grads(), 1e-2);
    }
    EXPECT_LT(last16, first - 0.1);
    EXPECT_NE(last16, last32);  // the switch did change the arithmetic
  }
  // Double models refuse bf16.
  Model<double> md(tiny_config(ResidualMode::rd), 1, 8, false);
  EXPECT_THROW(md.set_matmul_precision(k::MatmulPrecision::bf16), Error);
  EXPECT_NO_THROW(md.set_matmul_precision(k::MatmulPrecision::fp32));
}

TEST(Bf16, TrainConfigKey) {
  TrainConfig c = preset("tiny");
  EXPECT_EQ(c.precision, k::MatmulPrecision::fp32);
  // Every key is written, the default too; a config from before the key existed (no
  // precision line) reads as fp32 (tests/train/test_config.cpp: old-format configs).
  EXPECT_NE(to_toml(c).find("precision = \"fp32\""), std::string::npos);
  apply_setting(c, "train.precision=bf16", "--set");
  EXPECT_EQ(c.precision, k::MatmulPrecision::bf16);
  EXPECT_NE(to_toml(c).find("precision = \"bf16\""), std::string::npos);
  TrainConfig back = preset("tiny");
  const auto file = std::filesystem::temp_directory_path() / ("attnres_precision_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(file) << to_toml(c);
  apply_toml_file(back, file.string());
  std::filesystem::remove(file);
  EXPECT_EQ(back.precision, k::MatmulPrecision::bf16);
  EXPECT_EQ(to_toml(back), to_toml(c));
  try {
    apply_setting(c, "train.precision=fp16", "--set");
    ADD_FAILURE() << "fp16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.precision"), std::string::npos) << e.what();
  }
  EXPECT_THROW(apply_setting(c, "train.precision=1", "--set"), Error);  // not a string
}
