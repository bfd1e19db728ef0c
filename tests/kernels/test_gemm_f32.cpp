// The fp32 GEMM backends (kernels/gemm_f32.hpp): the own kernel's exact summation order (an fma
// chain per element and pass of 256 k, added to C), with its AVX2 tiles and its AVX-512 tiles each
// (whichever the CPU has), against a scalar reproduction, bit for bit, over
// every transpose combination, odd sizes, padded leading dimensions and k longer than a pass; its
// independence of the thread count and of the call's shape; its error against float64 beside
// OpenBLAS' (the new order is as accurate); products with blocks of a packed op(B), and attention's
// products (K and V packed per head, the backward in key tiles) in the order of one product per
// query block; and the backend switch of the Linear GEMMs.
#include <gtest/gtest.h>
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/fast_math.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_f32.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

using namespace attnres;
namespace k = attnres::kernels;

namespace {

struct Case {
  bool ta = false, tb = false;
  std::int64_t m = 1, n = 1, k = 1, pad = 0;
  bool accumulate = false;
  float alpha = 1.0f;

  std::int64_t lda() const { return (ta ? m : k) + pad; }
  std::int64_t ldb() const { return (tb ? k : n) + pad; }
  std::int64_t ldc() const { return n + pad; }
  float a_at(const std::vector<float>& a, std::int64_t i, std::int64_t p) const {
    return ta ? a[static_cast<std::size_t>(p * lda() + i)] : a[static_cast<std::size_t>(i * lda() + p)];
  }
  float b_at(const std::vector<float>& b, std::int64_t p, std::int64_t j) const {
    return tb ? b[static_cast<std::size_t>(j * ldb() + p)] : b[static_cast<std::size_t>(p * ldb() + j)];
  }
};

struct Operands {
  std::vector<float> a, b, c;
};

Operands make(const Case& cs, std::uint64_t seed) {
  Rng rng(seed, "gemm_f32 test");
  Operands o;
  o.a.resize(static_cast<std::size_t>((cs.ta ? cs.k : cs.m) * cs.lda()));
  o.b.resize(static_cast<std::size_t>((cs.tb ? cs.n : cs.k) * cs.ldb()));
  o.c.resize(static_cast<std::size_t>(cs.m * cs.ldc()));
  for (auto& x : o.a) x = static_cast<float>(rng.uniform() * 2 - 1);
  for (auto& x : o.b) x = static_cast<float>(rng.uniform() * 2 - 1);
  for (auto& x : o.c) x = static_cast<float>(rng.uniform() * 2 - 1);
  return o;
}

void run_own(const Case& cs, const Operands& o, std::vector<float>& c) {
  c = o.c;
  if (cs.alpha == 1.0f)
    k::gemm_f32(cs.ta, cs.tb, cs.m, cs.n, cs.k, o.a.data(), cs.lda(), o.b.data(), cs.ldb(), cs.accumulate, c.data(),
                cs.ldc());
  else
    k::gemm_f32(cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), cs.lda(), o.b.data(), cs.ldb(), cs.accumulate,
                c.data(), cs.ldc());
}

// The documented order: per pass of 256 k values a chain t = fma(a(i, p), b(p, j), t) from 0, added
// to C as c = fma(alpha, t, c) (the first pass stores alpha * t unless accumulating).
std::vector<float> reference_order(const Case& cs, const Operands& o) {
  std::vector<float> c = o.c;
  for (std::int64_t i = 0; i < cs.m; ++i)
    for (std::int64_t j = 0; j < cs.n; ++j) {
      float s = o.c[static_cast<std::size_t>(i * cs.ldc() + j)];
      for (std::int64_t p0 = 0; p0 < cs.k; p0 += 256) {
        float t = 0.0f;
        for (std::int64_t p = p0; p < std::min(cs.k, p0 + 256); ++p)
          t = std::fma(cs.a_at(o.a, i, p), cs.b_at(o.b, p, j), t);
        s = p0 == 0 && !cs.accumulate ? cs.alpha * t : std::fma(cs.alpha, t, s);
      }
      c[static_cast<std::size_t>(i * cs.ldc() + j)] = s;
    }
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& [m, n, kk] : {std::array<std::int64_t, 3>{1, 1, 1}, {5, 7, 3}, {6, 16, 8}, {7, 17, 33},
                                     {13, 31, 64}, {97, 64, 80}, {64, 97, 160}, {200, 40, 300}, {30, 300, 257},
                                     {101, 50, 600}})
        for (std::int64_t pad : {0, 3})
          for (bool acc : {false, true})
            for (float alpha : {1.0f, 0.125f, -1.7f})
              out.push_back(
                  {.ta = ta, .tb = tb, .m = m, .n = n, .k = kk, .pad = pad, .accumulate = acc, .alpha = alpha});
  // A k-major A with rows 512 floats or more apart is copied block by block (the LM head's weight
  // gradient): with B packed whole (m > 384) and per task (m <= 384, a wide padding).
  for (const auto& [m, n, kk, pad] : {std::array<std::int64_t, 4>{520, 33, 270, 0}, {100, 40, 300, 500}})
    for (bool acc : {false, true})
      out.push_back({.ta = true, .m = m, .n = n, .k = kk, .pad = pad, .accumulate = acc});
  return out;
}

std::string describe(const Case& c) {
  return std::string(c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " " + std::to_string(c.m) + "x" + std::to_string(c.n) +
         "x" + std::to_string(c.k) + " pad " + std::to_string(c.pad) + (c.accumulate ? " accumulate" : "") +
         (c.alpha != 1.0f ? " alpha " + std::to_string(c.alpha) : "");
}

// The own kernel's tile sets this CPU has (avx2, avx512); each test runs under each in turn.
std::vector<k::Fp32Gemm> own_backends() {
  std::vector<k::Fp32Gemm> out;
  for (const k::Fp32Gemm b : {k::Fp32Gemm::avx2, k::Fp32Gemm::avx512})
    if (k::fp32_gemm_available(b)) out.push_back(b);
  return out;
}

// The backend for one scope, back to automatic after it.
struct UseBackend {
  explicit UseBackend(k::Fp32Gemm b) { k::set_fp32_gemm_backend(b); }
  ~UseBackend() { k::set_fp32_gemm_backend(k::Fp32Gemm::automatic); }
  UseBackend(const UseBackend&) = delete;
  UseBackend& operator=(const UseBackend&) = delete;
};

bool have_avx2() { return k::fp32_gemm_available(k::Fp32Gemm::avx2); }

}  // namespace

TEST(GemmF32, ExactSummationOrder) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  for (const k::Fp32Gemm backend : own_backends()) {
    const UseBackend use(backend);
    std::uint64_t seed = 1;
    for (const Case& cs : cases()) {
      const Operands o = make(cs, seed++);
      std::vector<float> got;
      run_own(cs, o, got);
      const std::vector<float> want = reference_order(cs, o);
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << k::to_string(backend) << ": " << describe(cs);
    }
  }
}

TEST(GemmF32, LeavesPaddingAlone) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  Case cs;
  cs.m = 13;
  cs.n = 21;
  cs.k = 9;
  cs.pad = 5;
  Operands o = make(cs, 3);
  for (const k::Fp32Gemm backend : own_backends()) {
    const UseBackend use(backend);
    std::vector<float> got;
    run_own(cs, o, got);
    for (std::int64_t i = 0; i < cs.m; ++i)
      for (std::int64_t j = cs.n; j < cs.ldc(); ++j)
        EXPECT_EQ(got[static_cast<std::size_t>(i * cs.ldc() + j)], o.c[static_cast<std::size_t>(i * cs.ldc() + j)])
            << k::to_string(backend);
  }
}

TEST(GemmF32, KZero) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  std::vector<float> c(12, 3.0f);
  k::gemm_f32(false, true, 3, 4, 0, nullptr, 1, nullptr, 1, true, c.data(), 4);
  for (float x : c) EXPECT_EQ(x, 3.0f);
  k::gemm_f32(false, true, 3, 4, 0, nullptr, 1, nullptr, 1, false, c.data(), 4);
  for (float x : c) EXPECT_EQ(x, 0.0f);
}

TEST(GemmF32, DeterministicAcrossThreadCounts) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  const int saved = num_threads();
  for (const auto& [ta, tb, m, n, kk] :
       {std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t>{false, true, 1000, 300, 70},
        {false, false, 777, 64, 530},
        {true, false, 320, 64, 2048},
        {true, false, 1100, 40, 100}}) {
    Case cs;
    cs.ta = ta;
    cs.tb = tb;
    cs.m = m;
    cs.n = n;
    cs.k = kk;
    const Operands o = make(cs, 11);
    std::vector<float> first;
    for (const k::Fp32Gemm backend : own_backends())
    for (int threads : {1, 2, 3, 5}) {
      const UseBackend use(backend);
      set_num_threads(threads);
      std::vector<float> got;
      run_own(cs, o, got);
      if (first.empty()) first = got;
      EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float))) << describe(cs) << ", "
                                                                                        << threads << " threads, "
                                                                                        << k::to_string(backend);
    }
  }
  set_num_threads(saved);
}

// A row computed alone equals the same row computed within a larger call (the KV-cache decode of a
// single token against the batch forward).
TEST(GemmF32, RowIndependentOfTheCallShape) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  Case cs;
  cs.tb = true;
  cs.m = 50;
  cs.n = 90;
  cs.k = 300;
  const Operands o = make(cs, 5);
  for (const k::Fp32Gemm backend : own_backends()) {
  const UseBackend use(backend);
  std::vector<float> all;
  run_own(cs, o, all);
  for (std::int64_t row : {0, 7, 49}) {
    std::vector<float> one(static_cast<std::size_t>(cs.n));
    k::gemm_f32(false, true, 1, cs.n, cs.k, o.a.data() + row * cs.lda(), cs.lda(), o.b.data(), cs.ldb(), false,
                one.data(), cs.n);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + row * cs.ldc(), one.size() * sizeof(float)))
        << "row " << row << ", " << k::to_string(backend);
  }
  }
}

// The new order against float64, beside OpenBLAS' order on the same operands: both within the
// classic bound k * eps * sum |a||b| per element, and the AVX2 kernel's typical error no larger.
TEST(GemmF32, AsAccurateAsOpenBlas) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  const int saved = num_threads();
  set_num_threads(1);
  for (const auto& [ta, tb, m, n, kk] :
       {std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t>{false, true, 256, 64, 64},
        {false, false, 256, 64, 320},
        {true, false, 64, 64, 2048},
        {false, false, 64, 64, 8192},
        {true, false, 512, 64, 256}}) {
    Case cs;
    cs.ta = ta;
    cs.tb = tb;
    cs.m = m;
    cs.n = n;
    cs.k = kk;
    const Operands o = make(cs, 21);
    std::vector<float> mine;
    run_own(cs, o, mine);
    std::vector<float> blas = o.c;
    k::gemm<float>(ta, tb, m, n, kk, 1.0f, o.a.data(), cs.lda(), o.b.data(), cs.ldb(), 0.0f, blas.data(), cs.ldc());
    double err_mine = 0, err_blas = 0, worst_ratio = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double exact = 0, mag = 0;
        for (std::int64_t p = 0; p < kk; ++p) {
          const double t = double(cs.a_at(o.a, i, p)) * double(cs.b_at(o.b, p, j));
          exact += t;
          mag += std::fabs(t);
        }
        const std::size_t at = static_cast<std::size_t>(i * cs.ldc() + j);
        const double e1 = std::fabs(double(mine[at]) - exact), e2 = std::fabs(double(blas[at]) - exact);
        err_mine += e1 * e1;
        err_blas += e2 * e2;
        worst_ratio = std::max(worst_ratio, e1 / (double(kk) * 0x1p-24 * mag));
      }
    EXPECT_LE(worst_ratio, 1.0) << describe(cs);
    // RMS error: chains of 256 added to C against OpenBLAS' chains of <= 320 (a single chain over
    // all k was 2.6x (k = 2048) and 5x (k = 8192) worse, hence the passes). OpenBLAS' SSE3 kernels
    // (core Prescott: its choice on CPUs it does not know, e.g. Sapphire Rapids in 0.3.21) sum in
    // shorter chains and came out 1.34-1.39x more accurate on these cases there, so against them
    // the allowance is 1.5x; against its AVX2 and AVX-512 kernels, 1.25x.
    const double allowance = std::string(openblas_get_corename()) == "Prescott" ? 1.5 : 1.25;
    EXPECT_LE(std::sqrt(err_mine), allowance * std::sqrt(err_blas) + 1e-30)
        << describe(cs) << " (OpenBLAS core " << openblas_get_corename() << ")";
    RecordProperty(describe(cs) + " rms error ratio", std::to_string(std::sqrt(err_mine / err_blas)));
  }
  set_num_threads(saved);
}

TEST(GemmF32, PackedBMatchesUnpacked) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  for (bool tb : {false, true})
    for (bool acc : {false, true}) {
      Case cs;
      cs.tb = tb;
      cs.m = 300;
      cs.n = 97;
      cs.k = 270;
      cs.pad = 2;
      cs.accumulate = acc;
      const Operands o = make(cs, 17);
      for (const k::Fp32Gemm backend : own_backends()) {
      const UseBackend use(backend);
      std::vector<float> want;
      run_own(cs, o, want);
      k::Fp32PackedB packed;
      packed.pack(tb, cs.n, cs.k, o.b.data(), cs.ldb());
      std::vector<float> got = o.c;
      k::gemm_f32_packed(cs.m, 1.0f, o.a.data(), cs.lda(), packed, acc, got.data(), cs.ldc());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << describe(cs) << ", " << k::to_string(backend);
      }
    }
}

// Attention multiplies by blocks of a head's packed K^T, V^T, K or V (the keys a query block sees,
// a key block): the bits of gemm_f32 on that block of op(B), and of the documented order.
TEST(GemmF32, PackedBlockMatchesUnpacked) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  const std::int64_t big_k = 600, big_n = 150;
  for (bool tb : {false, true}) {
    const Case big{.tb = tb, .m = 1, .n = big_n, .k = big_k, .pad = 3};
    const std::vector<float> b = make(big, 23).b;
    k::Fp32PackedB packed;
    packed.pack(tb, big_n, big_k, b.data(), big.ldb());
    const k::Fp32Block blocks[] = {{.k = big_k, .n = big_n}, {.k = 270, .n = 97},        {.k = 64, .n = 150},
                                   {.k0 = 256, .k = 257, .n0 = 32, .n = 16},             {.k0 = 512, .k = 88, .n0 = 144, .n = 6},
                                   {.k = 1, .n = 1},         {.k0 = 256, .k = 0, .n0 = 16, .n = 5}};
    for (const k::Fp32Block& blk : blocks)
      for (bool acc : {false, true}) {
        // The block's case: its own A and C; B at the block's first element, with big's leading dimension.
        Case cs{.tb = tb, .m = 70, .n = blk.n, .k = blk.k, .accumulate = acc, .alpha = 0.125f};
        cs.pad = big.ldb() - (tb ? cs.k : cs.n);
        Operands o = make(cs, 29);
        const std::int64_t first = tb ? blk.n0 * big.ldb() + blk.k0 : blk.k0 * big.ldb() + blk.n0;
        o.b.assign(b.begin() + first, b.end());
        const std::vector<float> order = reference_order(cs, o);
        for (const k::Fp32Gemm backend : own_backends()) {
          const UseBackend use(backend);
          std::vector<float> want;
          run_own(cs, o, want);
          std::vector<float> got = o.c;
          k::gemm_f32_packed(cs.m, cs.alpha, o.a.data(), cs.lda(), packed, blk, acc, got.data(), cs.ldc());
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
              << describe(cs) << " at row " << blk.k0 << ", column " << blk.n0 << ", " << k::to_string(backend);
          if (cs.k > 0) {  // (k = 0 clears C; the reproduction covers k > 0)
            EXPECT_EQ(0, std::memcmp(got.data(), order.data(), got.size() * sizeof(float)))
                << describe(cs) << " at row " << blk.k0 << ", column " << blk.n0 << ", " << k::to_string(backend);
          }
        }
      }
    // Outside op(B), or not at a pass and a panel: an error.
    std::vector<float> c(static_cast<std::size_t>(big_n + 1));
    for (const k::Fp32Block& bad : {k::Fp32Block{.k = big_k, .n = big_n + 1}, k::Fp32Block{.k0 = 512, .k = 89, .n = 1},
                                    k::Fp32Block{.k0 = 100, .k = 1, .n = 1}, k::Fp32Block{.k = 1, .n0 = 8, .n = 1}})
      EXPECT_THROW(k::gemm_f32_packed(1, 1.0f, b.data(), big_k, packed, bad, false, c.data(), big_n + 1), Error);
  }
}

// Attention on the own fp32 kernel (float models): K and V packed once per head, the backward in
// tiles of 64 queries x 256 keys. Its outputs must be, bit for bit, those of one gemm_f32 product
// per query block over all the keys the block sees (the kernel's order before the tiles, and the
// documented order of kernels/gemm_f32.hpp): a reproduction with those products, for sequences of
// one to three key blocks. D = dO . O is exact here (O and dO on a grid of 1/8: any summation
// order), so the reproduction does not depend on the kernel's dot product.
TEST(GemmF32, AttentionKeepsTheOrderOfOneProductPerQueryBlock) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  const int B = 2, H = 2, hd = 32, d = H * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const int T : {70, 300, 530}) {
    Rng rng(static_cast<std::uint64_t>(T), "attention order test");
    const auto uniform = [&](std::size_t n) {
      std::vector<float> x(n);
      for (auto& e : x) e = static_cast<float>(rng.uniform() * 2 - 1);
      return x;
    };
    const auto grid = [&](std::size_t n) {  // multiples of 1/8 in [-1, 1]
      std::vector<float> x(n);
      for (auto& e : x) e = static_cast<float>(std::floor(rng.uniform() * 17) - 8) / 8.0f;
      return x;
    };
    const std::size_t n = static_cast<std::size_t>(B) * T * d;
    const std::vector<float> q = uniform(n), kk = uniform(n), v = uniform(n), dout = grid(n), out = grid(n);
    std::vector<float> lse(static_cast<std::size_t>(B) * H * T);
    for (auto& e : lse) e = static_cast<float>(2 + 3 * rng.uniform());
    const k::AttentionShape shape{B, T, T, H, hd, 0};
    for (const k::Fp32Gemm backend : own_backends()) {
      const UseBackend use(backend);
      // The reproduction: per (batch, head) and query block, whole rows of scores.
      std::vector<float> want_out(n), want_dq(n), want_dk(n, 0.0f), want_dv(n, 0.0f);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h) {
          const std::int64_t base = static_cast<std::int64_t>(b) * T * d + h * hd;
          for (int i0 = 0; i0 < T; i0 += 64) {
            const int qn = std::min(64, T - i0), nk = i0 + qn;
            const std::int64_t qrow = base + static_cast<std::int64_t>(i0) * d;
            std::vector<float> p(static_cast<std::size_t>(qn) * nk), ds(p.size());
            k::gemm_f32(false, true, qn, nk, hd, scale, q.data() + qrow, d, kk.data() + base, d, false, p.data(), nk);
            for (int r = 0; r < qn; ++r) {  // the forward's softmax
              float* row = p.data() + static_cast<std::size_t>(r) * nk;
              const int keys = i0 + r + 1;
              const float l = k::exp_shifted(row, keys, k::row_max(row, keys), k::fp32_wide_lanes());
              const float inv = 1.0f / l;
              for (int j = 0; j < nk; ++j) row[j] = j < keys ? row[j] * inv : 0.0f;
            }
            k::gemm_f32(false, false, qn, hd, nk, 1.0f, p.data(), nk, v.data() + base, d, false, want_out.data() + qrow, d);
            k::gemm_f32(false, true, qn, nk, hd, scale, q.data() + qrow, d, kk.data() + base, d, false, p.data(), nk);
            k::gemm_f32(false, true, qn, nk, hd, 1.0f, dout.data() + qrow, d, v.data() + base, d, false, ds.data(), nk);
            for (int r = 0; r < qn; ++r) {
              float* prow = p.data() + static_cast<std::size_t>(r) * nk;
              float* srow = ds.data() + static_cast<std::size_t>(r) * nk;
              const int keys = i0 + r + 1;
              const std::int64_t row = qrow + static_cast<std::int64_t>(r) * d;
              const float row_lse = lse[static_cast<std::size_t>((b * H + h) * T + i0 + r)];
              k::exp_shifted(prow, keys, row_lse, k::fp32_wide_lanes());
              double D = 0;
              for (int e = 0; e < hd; ++e) D += double(dout[static_cast<std::size_t>(row + e)]) * out[static_cast<std::size_t>(row + e)];
              for (int j = 0; j < nk; ++j) {
                srow[j] = j < keys ? prow[j] * (srow[j] - static_cast<float>(D)) : 0.0f;
                if (j >= keys) prow[j] = 0.0f;
              }
            }
            k::gemm_f32(false, false, qn, hd, nk, scale, ds.data(), nk, kk.data() + base, d, false, want_dq.data() + qrow, d);
            k::gemm_f32(true, false, nk, hd, qn, scale, ds.data(), nk, q.data() + qrow, d, true, want_dk.data() + base, d);
            k::gemm_f32(true, false, nk, hd, qn, 1.0f, p.data(), nk, dout.data() + qrow, d, true, want_dv.data() + base, d);
          }
        }
      std::vector<float> got_out(n), got_lse(lse.size()), dq(n), dk(n), dv(n);
      k::attention_forward(got_out.data(), got_lse.data(), q.data(), kk.data(), v.data(), shape);
      k::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), kk.data(), v.data(), out.data(),
                            lse.data(), shape);
      const std::string what = "T = " + std::to_string(T) + ", " + k::to_string(backend);
      EXPECT_EQ(0, std::memcmp(got_out.data(), want_out.data(), n * sizeof(float))) << "out, " << what;
      EXPECT_EQ(0, std::memcmp(dq.data(), want_dq.data(), n * sizeof(float))) << "dq, " << what;
      EXPECT_EQ(0, std::memcmp(dk.data(), want_dk.data(), n * sizeof(float))) << "dk, " << what;
      EXPECT_EQ(0, std::memcmp(dv.data(), want_dv.data(), n * sizeof(float))) << "dv, " << what;
    }
  }
}

TEST(GemmF32, BackendChoice) {
  const k::Fp32Gemm chosen = k::fp32_gemm_backend();
  EXPECT_NE(chosen, k::Fp32Gemm::automatic);
  EXPECT_TRUE(k::fp32_gemm_available(chosen));
  const char* forced = std::getenv("ATTNRES_FP32_GEMM");
  if (forced != nullptr && forced[0] != '\0' && k::parse_fp32_gemm(forced) != k::Fp32Gemm::automatic) {
    EXPECT_EQ(chosen, k::parse_fp32_gemm(forced));
  }
  // The AVX-512 tiles wherever the CPU has them (as fast as OpenBLAS' AVX-512 kernels in a
  // training step, with the AVX2 tiles' bits); else OpenBLAS' core decides: an AVX2 core (forced
  // or found) gets the avx2 tiles where the CPU has them; an AVX-512 core keeps OpenBLAS.
  const std::string core = openblas_get_corename();
  if (core == "Haswell" || core == "Zen" || core == "Prescott") {
    EXPECT_FALSE(k::openblas_runs_avx512()) << core;
  }
  if (core == "SkylakeX" || core == "Cooperlake") {
    EXPECT_TRUE(k::openblas_runs_avx512()) << core;
  }
  if (forced == nullptr || forced[0] == '\0' || k::parse_fp32_gemm(forced) == k::Fp32Gemm::automatic) {
    const k::Fp32Gemm want = k::fp32_gemm_available(k::Fp32Gemm::avx512) ? k::Fp32Gemm::avx512
                             : k::fp32_gemm_available(k::Fp32Gemm::avx2) && !k::openblas_runs_avx512()
                                 ? k::Fp32Gemm::avx2
                                 : k::Fp32Gemm::openblas;
    EXPECT_EQ(chosen, want) << "OpenBLAS core " << core;
  }
  EXPECT_EQ(k::parse_fp32_gemm("avx2"), k::Fp32Gemm::avx2);
  EXPECT_EQ(k::parse_fp32_gemm("avx512"), k::Fp32Gemm::avx512);
  EXPECT_EQ(k::parse_fp32_gemm("openblas"), k::Fp32Gemm::openblas);
  EXPECT_THROW(k::parse_fp32_gemm("mkl"), Error);
}

// The Linear GEMMs follow the backend: avx2 and avx512 in the documented order, openblas exactly
// cblas_sgemm.
TEST(GemmF32, LinearFollowsTheBackend) {
  if (!have_avx2()) GTEST_SKIP() << "no AVX2/FMA on this machine";
  const std::int64_t n = 37, in = 70, out = 45;
  Rng rng(9, "linear backend");
  std::vector<float> x(static_cast<std::size_t>(n * in)), w(static_cast<std::size_t>(out * in));
  for (auto& v : x) v = static_cast<float>(rng.uniform() - 0.5);
  for (auto& v : w) v = static_cast<float>(rng.uniform() - 0.5);
  std::vector<float> y_avx2(static_cast<std::size_t>(n * out)), y_blas = y_avx2, want = y_avx2, want_blas = y_avx2;
  k::set_fp32_gemm_backend(k::Fp32Gemm::avx2);
  k::linear_forward(y_avx2.data(), x.data(), w.data(), n, in, out);
  k::set_fp32_gemm_backend(k::Fp32Gemm::openblas);
  k::linear_forward(y_blas.data(), x.data(), w.data(), n, in, out);
  k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
  k::gemm_f32(false, true, n, out, in, x.data(), in, w.data(), in, false, want.data(), out);
  k::gemm<float>(false, true, n, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, want_blas.data(), out);
  EXPECT_EQ(0, std::memcmp(y_avx2.data(), want.data(), want.size() * sizeof(float)));
  if (k::fp32_gemm_available(k::Fp32Gemm::avx512)) {  // the AVX-512 tiles: the same sums
    std::vector<float> y_avx512(want.size());
    k::set_fp32_gemm_backend(k::Fp32Gemm::avx512);
    k::linear_forward(y_avx512.data(), x.data(), w.data(), n, in, out);
    k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
    EXPECT_EQ(0, std::memcmp(y_avx512.data(), want.data(), want.size() * sizeof(float)));
  }
  EXPECT_EQ(0, std::memcmp(y_blas.data(), want_blas.data(), want.size() * sizeof(float)));
  // double models keep BLAS whatever the backend
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), yd(static_cast<std::size_t>(n * out));
  k::set_fp32_gemm_backend(k::Fp32Gemm::avx2);
  k::linear_forward(yd.data(), xd.data(), wd.data(), n, in, out);
  k::set_fp32_gemm_backend(k::Fp32Gemm::automatic);
  EXPECT_NEAR(yd[0], double(want[0]), 1e-5);
}
