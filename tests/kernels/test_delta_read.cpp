// Delta AttnRes's read (docs/delta-gated-spec.md §1.2-1.4, kernels/delta_read): the spec's part F
// vectors (F1-F4), finite differences for every gate with one and two routes and a broadcast (null)
// source, and learnable_alpha = 0 as the identity on the stream.
#include <gtest/gtest.h>

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "common/spec_vectors.hpp"
#include "common/test_util.hpp"
#include "kernels/delta_read.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace k = attnres::kernels;

namespace {

// One read's inputs, all in double: n sources [T, d] (source 0 broadcast from `null` when set).
struct Case {
  int n = 3, d = 4, routes = 1;
  std::int64_t T = 2;
  bool null = false;
  k::DeltaGate gate = k::DeltaGate::none;
  std::vector<double> V, null_src, x, w[2], gamma[2], gate_param, gate_bias;
  std::vector<double> up[2];  // dL/dh per route
};

struct Result {
  std::vector<double> h[2], alpha, dV, dnull, dx, dw[2], dgamma[2], dgate, dbias;
};

Result run(Case& c) {
  const std::int64_t T = c.T;
  const int d = c.d, n = c.n;
  if (c.null)
    for (std::int64_t t = 0; t < T; ++t) std::copy(c.null_src.begin(), c.null_src.end(), c.V.begin() + t * d);
  std::vector<const double*> src(n);
  for (int s = 0; s < n; ++s) src[s] = c.V.data() + s * T * d;
  k::DeltaRead<double> rd;
  rd.n_routes = c.routes;
  for (int r = 0; r < c.routes; ++r) {
    k::DepthRead<double>& dr = rd.routes[r];
    dr.sources = src.data();
    dr.n_sources = n;
    dr.n_tok = T;
    dr.d = d;
    dr.eps = 1e-6;
    dr.gamma = c.gamma[r].data();
    dr.queries[0] = c.w[r].data();
  }
  rd.x = c.x.data();
  rd.gate = c.gate;
  rd.gate_param = c.gate_param.data();
  rd.gate_bias = c.gate_bias.data();
  std::vector<double> cbuf[2], logits[2], alpha[2], rms(T * n), g(T * d);
  k::DeltaReadState<double> st;
  Result out;
  double* h[2];
  for (int r = 0; r < c.routes; ++r) {
    cbuf[r].assign(T * d, 0.0);
    logits[r].assign(T * n, 0.0);
    alpha[r].assign(T * n, 0.0);
    out.h[r].assign(T * d, 0.0);
    st.c[r] = cbuf[r].data();
    st.logits[r] = logits[r].data();
    st.alpha[r] = alpha[r].data();
    h[r] = out.h[r].data();
  }
  st.rms = rms.data();
  st.g = g.data();
  k::delta_read_forward(rd, st, h);
  out.alpha.assign(n * T, 0.0);  // source-major, as the spec prints it
  for (std::int64_t t = 0; t < T; ++t) {
    for (int s = 0; s < n; ++s) out.alpha[s * T + t] = alpha[0][t * n + s];
  }
  out.dV.assign(c.V.size(), 0.0);
  out.dx.assign(T * d, 0.0);
  out.dgate.assign(c.gate_param.size(), 0.0);
  out.dbias.assign(c.gate_bias.size(), 0.0);
  std::vector<double*> dsrc(n);
  for (int s = 0; s < n; ++s) dsrc[s] = out.dV.data() + s * T * d;
  k::DeltaReadGrads<double> gr;
  gr.dsources = dsrc.data();
  for (int r = 0; r < c.routes; ++r) {
    out.dw[r].assign(d, 0.0);
    out.dgamma[r].assign(d, 0.0);
    gr.dh[r] = c.up[r].data();
    gr.dqueries[r] = out.dw[r].data();
    gr.dgamma[r] = out.dgamma[r].data();
  }
  gr.dx = out.dx.data();
  gr.dgate_param = out.dgate.data();
  gr.dgate_bias = out.dbias.data();
  std::vector<double> w0(T * d), w1(T * d), scratch(k::delta_read_scratch_size(T, d));
  k::delta_read_backward(rd, st, gr, w0.data(), w1.data(), scratch.data());
  if (c.null) {  // one parameter for every token: its gradient sums over them
    out.dnull.assign(d, 0.0);
    for (std::int64_t t = 0; t < T; ++t)
      for (int kk = 0; kk < d; ++kk) out.dnull[kk] += out.dV[t * d + kk];
    out.dV.erase(out.dV.begin(), out.dV.begin() + T * d);
  }
  return out;
}

// Spec §3 part F's inputs for a gate (null: source 0 is null = fill(95, (4,), 0.5)).
Case part_f(k::DeltaGate gate, bool null, double scalar = 0) {
  Case c;
  c.gate = gate;
  c.null = null;
  c.V = fill(90, {3, 2, 4});
  c.null_src = fill(95, {4}, 0.5);
  c.x = fill(91, {2, 4});
  c.w[0] = fill(92, {4}, 0.5);
  c.gamma[0] = one_plus_fill(93, {4}, 0.25);
  c.up[0] = fill(94, {2, 4});
  if (gate == k::DeltaGate::sigmoid_vector) {
    c.gate_param = fill(96, {4, 4}, 0.5);
    c.gate_bias = fill(97, {4}, 0.5);
    for (double& b : c.gate_bias) b -= 2;
  } else if (gate != k::DeltaGate::none) {
    c.gate_param = {scalar};
  }
  return c;
}

std::vector<double> head(const std::vector<double>& v, std::size_t n) { return {v.begin(), v.begin() + n}; }

}  // namespace

TEST(DeltaRead, SpecVectorF1NoGate) {
  Case c = part_f(k::DeltaGate::none, false);
  const Result r = run(c);
  expect_spec("F1 alpha", r.alpha, {0.2661313651, 0.2166841099, 0.4281582224, 0.4422872176, 0.3057104124,
                                    0.3410286724});
  expect_spec("F1 h", r.h[0], {0.04627948412, -0.4861615477, 0.4604969761, 0.2733716588, 0.3621455511,
                               -1.422744086, 0.1998295994, 0.5510881446});
  expect_spec("F1 g_x", r.dx, c.up[0]);
  expect_spec("F1 g_w", r.dw[0], {0.6486934022, -0.3447086614, 0.2458898439, 0.670640299});
  expect_spec("F1 g_gamma", r.dgamma[0], {0.04805136312, 0.1340533683, -0.03688347658, 0.095805757});
  expect_spec("F1 g_V[0:4]", head(r.dV, 4), {0.1997904992, -0.07294388342, 0.06199689873, 0.2340197661});
  expect_spec("F1 checksum(g_V)", checksum(r.dV), 0.2060675772);
}

TEST(DeltaRead, SpecVectorF2SigmoidScalarNull) {
  Case c = part_f(k::DeltaGate::sigmoid_scalar, true, -2.0);
  const Result r = run(c);
  expect_spec("F2 alpha", r.alpha, {0.5754257888, 0.4329986447, 0.247707738, 0.3201485569, 0.1768664732,
                                    0.2468527984});
  expect_spec("F2 h", r.h[0], {0.8270248885, -0.1956742683, 0.3821015737, 0.9610584122, 0.392587392,
                               -0.8338549093, 0.4775556632, 0.635870854});
  expect_spec("F2 g_logit", r.dgate, {0.02129541134});
  expect_spec("F2 g_null", r.dnull, {0.06887296994, -0.06230323247, 0.03751304211, 0.08993075406});
  expect_spec("F2 g_w", r.dw[0], {0.06096859323, -0.02309468241, -0.06569209651, 0.07350695534});
  expect_spec("F2 g_gamma", r.dgamma[0], {0.004516192091, 0.008981265381, 0.009853814476, 0.01050099362});
  expect_spec("F2 checksum(g_V)", checksum(r.dV), 0.03092529924);
}

TEST(DeltaRead, SpecVectorF3LearnableAlpha) {
  Case c = part_f(k::DeltaGate::learnable_alpha, false, 0.3);
  const Result r = run(c);
  expect_spec("F3 h", r.h[0], {0.6263838452, -0.2333484643, 0.4006490928, 0.7820114976, 0.3711436653,
                               -0.9518232257, 0.4099488798, 0.6028264434});
  expect_spec("F3 g_alpha", r.dgate, {-0.7097579197});
  expect_spec("F3 g_w", r.dw[0], {0.1946080206, -0.1034125984, 0.07376695316, 0.2011920897});
  expect_spec("F3 checksum(g_V)", checksum(r.dV), 0.06182027315);
}

TEST(DeltaRead, SpecVectorF4SigmoidVectorNull) {
  Case c = part_f(k::DeltaGate::sigmoid_vector, true);
  const Result r = run(c);
  expect_spec("F4 h", r.h[0], {0.8343997941, -0.1895924728, 0.3815357764, 0.9199348522, 0.3934523489,
                               -0.8344336528, 0.4847606859, 0.6480164669});
  expect_spec("F4 g_x", r.dx, {0.7539766775, -0.229761168, 0.2585290758, 0.8591067561, 0.276782295, -0.889297699,
                               0.4067926273, 0.4715474671});
  expect_spec("F4 g_null", r.dnull, {0.06561994294, -0.0611323936, 0.03083025878, 0.185793138});
  expect_spec("F4 g_bg", r.dbias, {-0.02334223507, 0.07940087999, -0.003797519326, -0.04428334354});
  expect_spec("F4 checksum(g_Wg)", checksum(r.dgate), 0.1379665934);
  expect_spec("F4 checksum(g_V)", checksum(r.dV), 0.06298182669);
}

// Every gate, with one route and with the V route (own query and key norm, the shared gate), and
// with a null source: the hand backward against central differences.
// The read is per token but for its parameters' gradients, which sum over the tokens in chunks of
// kReduceChunk (64). The per-token inputs (the sources, the stream) are checked by central
// differences at the tokens on either side of the chunk boundary and at both ends: the same code
// computes every other token, and 4 tokens instead of 70 keep the test fast under the sanitizers.
constexpr int kTokens = 70;
constexpr int kCheckedTokens[] = {0, 63, 64, kTokens - 1};

// The indices of a [blocks][kTokens][d] buffer's elements at the checked tokens.
std::vector<std::size_t> checked_elements(std::size_t size, int d) {
  std::vector<std::size_t> idx;
  const std::size_t block = static_cast<std::size_t>(kTokens) * d;
  for (std::size_t base = 0; base < size; base += block)
    for (int t : kCheckedTokens)
      for (int k = 0; k < d; ++k) idx.push_back(base + static_cast<std::size_t>(t * d + k));
  return idx;
}

std::vector<double> at(const std::vector<double>& v, const std::vector<std::size_t>& idx) {
  std::vector<double> out;
  for (std::size_t i : idx) out.push_back(v[i]);
  return out;
}

// numeric_gradient at the elements `idx` of x only.
std::vector<double> numeric_gradient_at(const std::function<double()>& f, std::span<double> x,
                                        const std::vector<std::size_t>& idx) {
  std::vector<double> g;
  for (std::size_t i : idx) {
    std::span<double> one(x.data() + i, 1);
    g.push_back(numeric_gradient(f, one)[0]);
  }
  return g;
}

TEST(DeltaRead, GradientsMatchFiniteDifferences) {
  for (auto gate : k::kDeltaGates)
    for (int routes : {1, 2})
      for (bool null : {false, true}) {
        Case c;
        c.n = 4, c.d = 6, c.T = kTokens, c.routes = routes, c.null = null, c.gate = gate;
        const auto nd = static_cast<std::size_t>(c.T * c.d);
        c.V = random_vector<double>(c.n * nd, 1);
        c.null_src = random_vector<double>(c.d, 2, 0.5);
        c.x = random_vector<double>(nd, 3);
        for (int r = 0; r < 2; ++r) {
          c.w[r] = random_vector<double>(c.d, 4 + r, 0.7);
          c.gamma[r] = random_vector<double>(c.d, 6 + r, 0.3);
          for (double& g : c.gamma[r]) g += 1;
          c.up[r] = random_vector<double>(nd, 8 + r);
        }
        if (gate == k::DeltaGate::sigmoid_vector) {
          c.gate_param = random_vector<double>(c.d * c.d, 10, 0.4);
          c.gate_bias = random_vector<double>(c.d, 11, 0.5);
        } else if (gate != k::DeltaGate::none) {
          c.gate_param = {0.37};
        }
        const Result r = run(c);
        auto loss = [&] {
          const Result o = run(c);
          double l = 0;
          for (int ro = 0; ro < routes; ++ro) l += weighted_sum(o.h[ro], c.up[ro]);
          return l;
        };
        const std::string what = k::to_string(gate) + " routes " + std::to_string(routes) + (null ? " null" : "");
        std::vector<double> dV = r.dV;
        if (null) {
          // A sum over kTokens tokens of a small gradient: the central difference's rounding dominates.
          EXPECT_LT(max_rel_error(r.dnull, numeric_gradient(loss, c.null_src)), 1e-6) << what;
          std::span<double> rest(c.V.data() + nd, c.V.size() - nd);
          const auto idx = checked_elements(rest.size(), c.d);
          EXPECT_LT(max_rel_error(at(dV, idx), numeric_gradient_at(loss, rest, idx)), 1e-7) << what;
        } else {
          const auto idx = checked_elements(c.V.size(), c.d);
          EXPECT_LT(max_rel_error(at(dV, idx), numeric_gradient_at(loss, c.V, idx)), 1e-7) << what;
        }
        const auto idx = checked_elements(c.x.size(), c.d);
        EXPECT_LT(max_rel_error(at(r.dx, idx), numeric_gradient_at(loss, c.x, idx)), 1e-7) << what;
        for (int ro = 0; ro < routes; ++ro) {
          EXPECT_LT(max_rel_error(r.dw[ro], numeric_gradient(loss, c.w[ro])), 1e-7) << what;
          EXPECT_LT(max_rel_error(r.dgamma[ro], numeric_gradient(loss, c.gamma[ro])), 1e-7) << what;
        }
        if (!c.gate_param.empty()) {
          EXPECT_LT(max_rel_error(r.dgate, numeric_gradient(loss, c.gate_param)), 1e-7) << what;
        }
        if (!c.gate_bias.empty()) {
          EXPECT_LT(max_rel_error(r.dbias, numeric_gradient(loss, c.gate_bias)), 1e-7) << what;
        }
      }
}

// learnable_alpha = 0: h is the stream, bit for bit (the model then computes pre-norm's function).
TEST(DeltaRead, LearnableAlphaZeroIsTheStream) {
  Case c = part_f(k::DeltaGate::learnable_alpha, true, 0.0);
  const Result r = run(c);
  EXPECT_EQ(r.h[0], c.x);
}
