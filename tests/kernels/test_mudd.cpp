// MUDDFormer's DA module (baselines-spec §2): the spec's vectors B1-B4, finite differences of
// every input and parameter in every variant, float against double, thread-count bit identity,
// the init invariants and the hidden-width rule.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/mudd.hpp"
#include "kernels/rmsnorm.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

// One DA over S sources stored [S, T, d]; parameters in the kernel's layout (W1 [K, d],
// W2 [C*S, K]). With prepost the sources given are the normalised ones and x is separate;
// otherwise x is the last source.
template <class Real>
struct MuddCase {
  int S = 3, C = 4, d = 4, K = 6;
  std::int64_t T = 2;
  bool dynamic = true, prepost = false, weighted_gen = false;
  k::Gelu gelu = k::Gelu::erf;
  std::vector<Real> X, x, W1, W2, a, gen, post;
  std::vector<Real> up;  // [C, T, d]

  k::MuddDa<Real> op(std::vector<const Real*>& src) const {
    src.clear();
    for (int s = 0; s < S; ++s) src.push_back(X.data() + s * T * d);
    k::MuddDa<Real> da;
    da.sources = src.data();
    da.n_sources = S;
    da.n_ways = C;
    da.n_tok = T;
    da.d = d;
    da.eps = Real(1e-6);
    da.x = prepost ? x.data() : src[S - 1];
    da.a = a.data();
    if (dynamic) {
      da.hidden = K;
      da.w1 = W1.data();
      da.w2 = W2.data();
      da.gelu = gelu;
      if (weighted_gen) da.gen_norm = gen.data();
    }
    if (prepost) da.post_norm = post.data();
    return da;
  }
};

template <class Real>
struct MuddResult {
  std::vector<Real> streams, dw, hidden, rms;                   // forward ([C, T, d] streams)
  std::vector<Real> dX, dx, dW1, dW2, da, dgen, dpost;           // backward
};

template <class Real>
MuddResult<Real> run(const MuddCase<Real>& c) {
  const std::int64_t Td = c.T * c.d;
  MuddResult<Real> r;
  r.streams.assign(c.C * Td, Real(0));
  r.dw.assign(c.T * c.C * c.S, Real(0));
  r.hidden.assign(c.T * c.K, Real(0));
  r.rms.assign(c.T, Real(0));
  std::vector<Real> scratch(k::mudd_scratch_size(c.T, c.d, c.C, c.S, c.K));
  std::vector<const Real*> src;
  const k::MuddDa<Real> da = c.op(src);
  std::vector<Real*> out;
  for (int w = 0; w < c.C; ++w) out.push_back(r.streams.data() + w * Td);
  k::mudd_forward(da, out.data(), r.dw.data(), r.hidden.data(), r.rms.data(), scratch.data());
  r.dX.assign(c.S * Td, Real(0));
  r.dx.assign(Td, Real(0));
  r.dW1.assign(c.K * c.d, Real(0));
  r.dW2.assign(c.C * c.S * c.K, Real(0));
  r.da.assign(c.C * c.S, Real(0));
  r.dgen.assign(c.d, Real(0));
  r.dpost.assign(c.d, Real(0));
  std::vector<const Real*> dout;
  std::vector<Real*> dsrc;
  for (int w = 0; w < c.C; ++w) dout.push_back(c.up.data() + w * Td);
  for (int s = 0; s < c.S; ++s) dsrc.push_back(r.dX.data() + s * Td);
  k::MuddGrads<Real> gr;
  gr.dout = dout.data();
  gr.dsources = dsrc.data();
  gr.dx = c.prepost ? r.dx.data() : dsrc[c.S - 1];
  gr.dw1 = r.dW1.data();
  gr.dw2 = r.dW2.data();
  gr.da = r.da.data();
  gr.dgen_norm = r.dgen.data();
  gr.dpost_norm = r.dpost.data();
  k::mudd_backward(da, r.dw.data(), r.hidden.data(), r.rms.data(), gr, scratch.data());
  return r;
}

// The spec's part-B inputs (S = 3, T = 2, d = 4, K = 6). With prepost, the raw sources are
// normalised here by their own norms (rmsnorm_forward), as the model does once per source.
struct SpecB {
  MuddCase<double> c;
  std::vector<double> raw, gsrc, rstd;  // raw sources, their norm weights [S, d], rstd [S, T]
};

SpecB spec_b(int C, bool prepost, k::Gelu gelu) {
  SpecB b;
  MuddCase<double>& c = b.c;
  c.C = C;
  c.prepost = prepost;
  c.weighted_gen = prepost;
  c.gelu = gelu;
  b.raw = fill(30, {3, 2, 4});
  c.W1 = transposed(fill(31, {4, 6}, 0.5), 4, 6);
  c.W2 = transposed(fill(32, {6, C * 3}, 0.5), 6, C * 3);
  c.a = fill(33, {C, 3}, 0.5);
  c.up = fill(37, {C, 2, 4});
  c.gen = one_plus_fill(35, {4}, 0.25);
  c.post = fill(36, {4}, 0.5);
  b.gsrc = one_plus_fill(34, {3, 4}, 0.25);
  b.rstd.assign(3 * 2, 0.0);
  if (prepost) {
    c.X.assign(b.raw.size(), 0.0);
    for (int s = 0; s < 3; ++s)
      k::rmsnorm_forward(c.X.data() + s * 8, b.rstd.data() + s * 2, b.raw.data() + s * 8, b.gsrc.data() + s * 4,
                         2, 4, 1e-6);
    c.x.assign(b.raw.begin() + 16, b.raw.end());
  } else {
    c.X = b.raw;
  }
  return b;
}

// The raw sources' gradients (through their norms with prepost, plus x's) and the norm weights'.
void raw_gradients(const SpecB& b, const MuddResult<double>& r, std::vector<double>& gX, std::vector<double>& ggsrc) {
  gX = r.dX;
  ggsrc.assign(3 * 4, 0.0);
  if (!b.c.prepost) return;
  std::vector<double> scratch(k::rmsnorm_scratch_size(2, 4));
  for (int s = 0; s < 3; ++s)
    k::rmsnorm_backward(gX.data() + s * 8, ggsrc.data() + s * 4, r.dX.data() + s * 8, b.raw.data() + s * 8,
                        b.gsrc.data() + s * 4, b.rstd.data() + s * 2, 2, 4, scratch.data());
  for (int e = 0; e < 8; ++e) gX[16 + e] += r.dx[e];
}

std::vector<double> slice(const std::vector<double>& v, std::size_t from, std::size_t n) {
  return std::vector<double>(v.begin() + from, v.begin() + from + n);
}

}  // namespace

TEST(Mudd, SpecVectorB1ErfGelu) {
  const SpecB b = spec_b(4, false, k::Gelu::erf);
  const auto r = run(b.c);
  std::vector<double> gX, ggsrc;
  raw_gradients(b, r, gX, ggsrc);
  expect_spec("B1 dw[token0]", slice(r.dw, 0, 12),
              {0.04611576531, 0.4320815975, -0.3301237787, 0.2659575151, -0.4988286486, 0.2862434209, -0.1990744185,
               -0.2728904059, -0.2012033515, -0.2233888879, 0.2581028403, -0.1995679896});
  expect_spec("B1 x_Q[token0]", slice(r.streams, 0, 4), {-0.1107535798, -0.1286595611, -0.03488493387, 0.04429676261});
  expect_spec("B1 x_R[token1]", slice(r.streams, 3 * 8 + 4, 4),
              {-0.1511996958, -0.05533539114, 0.08249340455, -0.0355371662});
  expect_spec("B1 checksum(streams)", checksum(r.streams), 1.029644165);
  expect_spec("B1 g_a", r.da,
              {-1.578125, -0.71875, 0.875, 1.265625, -1.828125, -1.96875, 1.8125, -0.890625, -1.609375, -0.453125,
               -0.09375, 0.984375});
  expect_spec("B1 g_X0", slice(gX, 0, 8),
              {-0.1128686547, -0.1445454156, -0.1830495511, 0.1096623837, -0.07329790138, -0.1198019196,
               -0.1254508895, 0.168196474});
  expect_spec("B1 g_X2", slice(gX, 16, 8),
              {-0.4976619409, -0.4291454129, -0.4802677857, 0.393430469, -0.4238307422, 0.02315639351,
               -0.4978907911, -0.1371500562});
  expect_spec("B1 checksum(gW1)", checksum(transposed(r.dW1, 6, 4)), -0.4133694575);
  expect_spec("B1 checksum(gW2)", checksum(transposed(r.dW2, 12, 6)), -1.316734764);
}

TEST(Mudd, SpecVectorB2TanhGelu) {
  const SpecB b = spec_b(4, false, k::Gelu::tanh);
  const auto r = run(b.c);
  expect_spec("B2 dw[token0][0:2]", slice(r.dw, 0, 2), {0.0460904828, 0.4321515878});
  expect_spec("B2 checksum(streams)", checksum(r.streams), 1.029955380);
  expect_spec("B2 g_X2[0:2]", slice(r.dX, 16, 2), {-0.4976706612, -0.4294943196});
  expect_spec("B2 checksum(gW1)", checksum(transposed(r.dW1, 6, 4)), -0.4127722351);
  expect_spec("B2 checksum(gW2)", checksum(transposed(r.dW2, 12, 6)), -1.316604203);
}

TEST(Mudd, SpecVectorB3PrePostDaNorm) {
  const SpecB b = spec_b(4, true, k::Gelu::erf);
  const auto r = run(b.c);
  std::vector<double> gX, ggsrc;
  raw_gradients(b, r, gX, ggsrc);
  expect_spec("B3 x_Q[token0]", slice(r.streams, 0, 4), {-0.7225062748, -0.2759235819, 1.065066892, -0.5473528742});
  expect_spec("B3 x_R[token1]", slice(r.streams, 3 * 8 + 4, 4),
              {0.2986210649, -0.3946941714, -0.05082501335, -0.5465769694});
  expect_spec("B3 checksum(streams)", checksum(r.streams), 0.3105287989);
  expect_spec("B3 g_X0", slice(gX, 0, 8),
              {0.2276143396, 0.06756940431, 0.06258855504, 0.01008868138, -0.144909855, 0.08516866961, 0.9090367143,
               -0.8853509343});
  expect_spec("B3 g_X2[0:4]", slice(gX, 16, 4), {2.448539524, 1.535561621, 0.7889528117, 0.3213836932});
  expect_spec("B3 g_gamma_gen", r.dgen, {-0.1069005332, -0.2471860726, -0.7481348679, 0.004008295717});
  expect_spec("B3 g_gamma_post", r.dpost, {-1.36706748, -0.7617552488, 1.385518729, -0.3724244126});
  expect_spec("B3 checksum(g_gamma_src)", checksum(ggsrc), 0.3703132639);
  expect_spec("B3 checksum(gW1)", checksum(transposed(r.dW1, 6, 4)), -2.091464055);
  expect_spec("B3 checksum(gW2)", checksum(transposed(r.dW2, 12, 6)), -3.709317405);
}

TEST(Mudd, SpecVectorB4LastDaPrePost) {
  const SpecB b = spec_b(1, true, k::Gelu::erf);
  const auto r = run(b.c);
  std::vector<double> gX, ggsrc;
  raw_gradients(b, r, gX, ggsrc);
  expect_spec("B4 dw[token0]", slice(r.dw, 0, 3), {-0.07727307837, 0.3361693135, -0.2097980334});
  expect_spec("B4 x_R[token0]", slice(r.streams, 0, 4), {-0.3363032605, -0.6342301094, 0.4843379462, -0.6166419379});
  expect_spec("B4 g_a", r.da, {1.551555173, 0.4563029713, -0.1517209515});
  expect_spec("B4 g_X2[0:4]", slice(gX, 16, 4), {0.7394268512, 0.1646986805, 0.3862580519, -1.006468309});
}

TEST(Mudd, HiddenWidthRule) {
  // (floor(C S e / 64) + 1) * 64: strictly larger, so 64 -> 128; none: C S e.
  EXPECT_EQ(k::mudd_hidden_width(4, 2, 1, 64), 64);
  EXPECT_EQ(k::mudd_hidden_width(4, 16, 1, 64), 128);
  EXPECT_EQ(k::mudd_hidden_width(4, 15, 1, 64), 64);
  EXPECT_EQ(k::mudd_hidden_width(1, 17, 4, 64), 128);  // the last DA of a 16-block model: 68 -> 128
  EXPECT_EQ(k::mudd_hidden_width(1, 16, 4, 64), 128);  // 64 -> 128
  EXPECT_EQ(k::mudd_hidden_width(4, 3, 1, 0), 12);
  EXPECT_EQ(k::mudd_hidden_width(1, 3, 4, 0), 12);
  // Spec §6.3: MUDD adds 723,373 parameters at the S preset (d = 576, L = 16, official rounding,
  // three Q/K/V norms: 2d more per block than pre-norm's one attention norm).
  const int d = 576, L = 16;
  std::int64_t params = 0;
  for (int i = 0; i < L; ++i) {
    const bool last = i == L - 1;
    const int C = last ? 1 : 4, S = i + 2, K = k::mudd_hidden_width(C, S, last ? 4 : 1, 64);
    params += static_cast<std::int64_t>(d) * K + static_cast<std::int64_t>(K) * C * S + C * S;
  }
  params += 2LL * d * L;
  EXPECT_EQ(params, 723373);
}

namespace {

MuddCase<double> random_case(int C, bool dynamic, bool prepost, k::Gelu gelu, bool weighted_gen) {
  MuddCase<double> c;
  c.S = 4;
  c.C = C;
  c.d = 6;
  c.K = 5;
  c.T = 70;  // more than one reduction chunk
  c.dynamic = dynamic;
  c.prepost = prepost;
  c.gelu = gelu;
  c.weighted_gen = weighted_gen;
  c.X = random_vector<double>(c.S * c.T * c.d, 1);
  c.x = random_vector<double>(c.T * c.d, 2);
  c.W1 = random_vector<double>(c.K * c.d, 3, 0.7);
  c.W2 = random_vector<double>(C * c.S * c.K, 4, 0.5);
  c.a = random_vector<double>(C * c.S, 5, 0.5);
  c.gen = one_plus_fill(6, {6}, 0.25);
  c.post = random_vector<double>(c.d, 7, 0.5);
  c.up = random_vector<double>(C * c.T * c.d, 8);
  return c;
}

void check_fd(MuddCase<double> c, const char* name) {
  const auto r = run(c);
  auto loss = [&] {
    std::vector<const double*> src;
    const auto da = c.op(src);
    std::vector<double> streams(c.C * c.T * c.d), dw(c.T * c.C * c.S), hidden(c.T * c.K), rms(c.T);
    std::vector<double> scratch(k::mudd_scratch_size(c.T, c.d, c.C, c.S, c.K));
    std::vector<double*> out;
    for (int w = 0; w < c.C; ++w) out.push_back(streams.data() + w * c.T * c.d);
    k::mudd_forward(da, out.data(), dw.data(), hidden.data(), rms.data(), scratch.data());
    return weighted_sum(streams, c.up);
  };
  double worst = 0;
  auto expect = [&](const std::vector<double>& g, std::vector<double>& x, const char* what) {
    const double e = max_rel_error(g, numeric_gradient(loss, x));
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-7) << name << ": " << what;
  };
  expect(r.dX, c.X, "sources");
  expect(r.da, c.a, "a");
  if (c.prepost) {
    expect(r.dx, c.x, "x");
    expect(r.dpost, c.post, "post norm");
  }
  if (c.dynamic) {
    expect(r.dW1, c.W1, "W1");
    expect(r.dW2, c.W2, "W2");
    if (c.weighted_gen) expect(r.dgen, c.gen, "generator norm");
  }
  std::printf("[fd] MUDD %-28s max rel err %.2e\n", name, worst);
}

}  // namespace

TEST(Mudd, GradientsMatchFiniteDifferences) {
  // C in {4, 1} x GELU {erf, tanh} x PrePostDANorm {off, on} (spec §6.4), the generator norm
  // with and without weight, and the static variant.
  for (int C : {4, 1})
    for (k::Gelu g : {k::Gelu::erf, k::Gelu::tanh})
      for (bool prepost : {false, true}) {
        const std::string name = "C=" + std::to_string(C) + (g == k::Gelu::erf ? " erf" : " tanh") +
                                 (prepost ? " prepost" : " base");
        check_fd(random_case(C, true, prepost, g, prepost), name.c_str());
      }
  check_fd(random_case(4, true, false, k::Gelu::erf, true), "C=4 base, weighted gen norm");
  check_fd(random_case(4, false, false, k::Gelu::erf, false), "C=4 static base");
  check_fd(random_case(4, false, true, k::Gelu::erf, false), "C=4 static prepost");
}

namespace {

template <class Real>
MuddCase<Real> big_case(bool prepost) {
  MuddCase<Real> c;
  c.S = 6;
  c.C = 4;
  c.d = 64;
  c.K = 128;
  c.T = 1000;
  c.prepost = prepost;
  c.weighted_gen = prepost;
  c.X = converted<Real>(random_vector<double>(c.S * c.T * c.d, 1));
  c.x = converted<Real>(random_vector<double>(c.T * c.d, 2));
  c.W1 = converted<Real>(random_vector<double>(c.K * c.d, 3, 0.125));
  c.W2 = converted<Real>(random_vector<double>(c.C * c.S * c.K, 4, 0.1));
  c.a = converted<Real>(random_vector<double>(c.C * c.S, 5, 0.5));
  c.gen = converted<Real>(one_plus_fill(6, {64}, 0.25));
  c.post = converted<Real>(random_vector<double>(c.d, 7, 0.5));
  c.up = converted<Real>(random_vector<double>(c.C * c.T * c.d, 8));
  return c;
}

}  // namespace

TEST(Mudd, FloatMatchesDouble) {
  for (bool prepost : {false, true}) {
    const auto f = run(big_case<float>(prepost));
    const auto g = run(big_case<double>(prepost));
    EXPECT_LT(max_rel_error(f.streams, g.streams), 1e-5) << prepost;
    EXPECT_LT(max_rel_error(f.dX, g.dX), 1e-5) << prepost;
    EXPECT_LT(max_rel_error(f.dx, g.dx), 1e-5) << prepost;
    EXPECT_LT(max_rel_error(f.dW1, g.dW1), 1e-5) << prepost;
    EXPECT_LT(max_rel_error(f.dW2, g.dW2), 1e-5) << prepost;
    EXPECT_LT(max_rel_error(f.da, g.da), 1e-5) << prepost;
    if (prepost) {
      EXPECT_LT(max_rel_error(f.dgen, g.dgen), 1e-5);
      EXPECT_LT(max_rel_error(f.dpost, g.dpost), 1e-5);
    }
  }
}

TEST(Mudd, FloatGradientsAreBitIdenticalAcrossThreadCounts) {
  for (bool prepost : {false, true}) {
    std::vector<MuddResult<float>> r;
    for (int n : {1, 2, 3}) with_threads(n, [&] { r.push_back(run(big_case<float>(prepost))); });
    for (int i = 1; i < 3; ++i) {
      EXPECT_EQ(r[i].streams, r[0].streams) << "threads " << i + 1;
      EXPECT_EQ(r[i].dX, r[0].dX) << "threads " << i + 1;
      EXPECT_EQ(r[i].dx, r[0].dx) << "threads " << i + 1;
      EXPECT_EQ(r[i].dW1, r[0].dW1) << "threads " << i + 1;
      EXPECT_EQ(r[i].dW2, r[0].dW2) << "threads " << i + 1;
      EXPECT_EQ(r[i].da, r[0].da) << "threads " << i + 1;
      EXPECT_EQ(r[i].dgen, r[0].dgen) << "threads " << i + 1;
      EXPECT_EQ(r[i].dpost, r[0].dpost) << "threads " << i + 1;
    }
  }
}

TEST(Mudd, InitStreamsEqualTheBlockOutputBitForBit) {
  // Base: W2 = 0, a = e_last in every way. PrePostDANorm: W2 = 0, a = 0, post-norm weight 1e-3.
  for (bool prepost : {false, true}) {
    MuddCase<float> c = big_case<float>(prepost);
    std::fill(c.W2.begin(), c.W2.end(), 0.0f);
    std::fill(c.a.begin(), c.a.end(), 0.0f);
    if (prepost) std::fill(c.post.begin(), c.post.end(), 1e-3f);
    else
      for (int w = 0; w < c.C; ++w) c.a[w * c.S + c.S - 1] = 1.0f;
    const auto r = run(c);
    const float* x = prepost ? c.x.data() : c.X.data() + (c.S - 1) * c.T * c.d;
    for (int w = 0; w < c.C; ++w)
      EXPECT_EQ(std::memcmp(r.streams.data() + w * c.T * c.d, x, c.T * c.d * sizeof(float)), 0)
          << "way " << w << " prepost " << prepost;
  }
}
