#include "kernels/delta_read.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

std::string to_string(DeltaGate gate) {
  switch (gate) {
    case DeltaGate::none: return "none";
    case DeltaGate::sigmoid_scalar: return "sigmoid_scalar";
    case DeltaGate::sigmoid_vector: return "sigmoid_vector";
    case DeltaGate::learnable_alpha: return "learnable_alpha";
  }
  return "?";
}

std::int64_t delta_read_scratch_size(std::int64_t n_tok, int d) {
  return std::max(depth_read_scratch_size(n_tok, d), num_chunks(n_tok) * d);
}

namespace {

template <class Real>
Real sigmoid(Real z) {
  return Real(1) / (Real(1) + std::exp(-z));
}

// The scalar gate's value (1 for none); the vector gate is per token and channel.
template <class Real>
Real scalar_gate(const DeltaRead<Real>& rd) {
  switch (rd.gate) {
    case DeltaGate::sigmoid_scalar: return sigmoid(rd.gate_param[0]);
    case DeltaGate::learnable_alpha: return rd.gate_param[0];
    default: return Real(1);
  }
}

}  // namespace

template <class Real>
void delta_read_forward(const DeltaRead<Real>& rd, const DeltaReadState<Real>& st, Real* const* h) {
  const std::int64_t n = rd.n_tok();
  const int d = rd.d();
  for (int r = 0; r < rd.n_routes; ++r) {
    Real* out[kMaxRoutes] = {st.c[r]};
    depth_read_forward(rd.routes[r], out, st.rms, st.logits[r], st.alpha[r]);  // the routes write the same RMS factors
  }
  if (rd.gate == DeltaGate::sigmoid_vector) {
    // g = sigmoid(x W^T + b), in fixed row blocks: reproducible whatever the thread count.
    linear_forward_fixed(st.g, rd.x, rd.gate_param, n, d, d);
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
    for (std::int64_t t = 0; t < n; ++t)
      for (int k = 0; k < d; ++k) st.g[t * d + k] = sigmoid(st.g[t * d + k] + rd.gate_bias[k]);
  }
  const Real gs = scalar_gate(rd);
  for (int r = 0; r < rd.n_routes; ++r) {
    const Real* c = st.c[r];
    Real* y = h[r];
#pragma omp parallel for simd schedule(static) if (n * d >= kParallelMin)
    for (std::int64_t i = 0; i < n * d; ++i) {
      switch (rd.gate) {
        case DeltaGate::none: y[i] = rd.x[i] + c[i]; break;
        case DeltaGate::sigmoid_vector: y[i] = rd.x[i] + st.g[i] * c[i]; break;
        default: y[i] = rd.x[i] + gs * c[i]; break;
      }
    }
  }
}

template <class Real>
void delta_read_backward(const DeltaRead<Real>& rd, const DeltaReadState<Real>& st, const DeltaReadGrads<Real>& gr,
                         Real* work0, Real* work1, Real* scratch) {
  const std::int64_t n = rd.n_tok();
  const int d = rd.d(), R = rd.n_routes;
  const std::int64_t chunks = num_chunks(n);
  // The stream path: dx += dh of every route.
  for (int r = 0; r < R; ++r) add_into(gr.dx, gr.dh[r], n * d);

  // The gate: dg = sum_r dh_r ⊙ c_r, summed over channels and tokens for a scalar gate (per chunk,
  // then the chunks in order), through the sigmoid per channel for the vector gate.
  if (rd.gate == DeltaGate::sigmoid_scalar || rd.gate == DeltaGate::learnable_alpha) {
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      Real s = 0;
      const std::int64_t t_end = std::min(n, (ch + 1) * kReduceChunk);
      for (std::int64_t i = ch * kReduceChunk * d; i < t_end * d; ++i)
        for (int r = 0; r < R; ++r) s += gr.dh[r][i] * st.c[r][i];
      scratch[ch] = s;
    }
    Real total = 0;
    for (std::int64_t ch = 0; ch < chunks; ++ch) total += scratch[ch];
    const Real g = scalar_gate(rd);
    gr.dgate_param[0] += rd.gate == DeltaGate::sigmoid_scalar ? total * g * (Real(1) - g) : total;
  } else if (rd.gate == DeltaGate::sigmoid_vector) {
    Real* dp = work1;  // the pre-activation's gradient
#pragma omp parallel for schedule(static) if (n * d >= kParallelMin)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      Real* db = scratch + ch * d;
      std::fill(db, db + d, Real(0));
      const std::int64_t t_end = std::min(n, (ch + 1) * kReduceChunk);
      for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t)
        for (int k = 0; k < d; ++k) {
          const std::int64_t i = t * d + k;
          Real dg = 0;
          for (int r = 0; r < R; ++r) dg += gr.dh[r][i] * st.c[r][i];
          dp[i] = dg * st.g[i] * (Real(1) - st.g[i]);
          db[k] += dp[i];
        }
    }
    for (int k = 0; k < d; ++k) {
      Real a = 0;
      for (std::int64_t ch = 0; ch < chunks; ++ch) a += scratch[ch * d + k];
      gr.dgate_bias[k] += a;
    }
    linear_backward_weight_fixed(gr.dgate_param, dp, rd.x, n, d, d);
    linear_backward_input_fixed(work0, dp, rd.gate_param, n, d, d);
    add_into(gr.dx, work0, n * d);
  }

  // The reads: their output gradient is g ⊙ dh.
  const Real gs = scalar_gate(rd);
  for (int r = 0; r < R; ++r) {
    const Real* gc = gr.dh[r];
    if (rd.gate != DeltaGate::none) {
#pragma omp parallel for simd schedule(static) if (n * d >= kParallelMin)
      for (std::int64_t i = 0; i < n * d; ++i)
        work0[i] = (rd.gate == DeltaGate::sigmoid_vector ? st.g[i] : gs) * gr.dh[r][i];
      gc = work0;
    }
    DepthReadGrads<Real> g;
    g.dout[0] = gc;
    g.dsources = gr.dsources;
    g.dqueries[0] = gr.dqueries[r];
    g.dgamma = gr.dgamma[r];
    depth_read_backward(rd.routes[r], st.rms, st.logits[r], st.alpha[r], g, scratch);
  }
}

#define ATTNRES_DELTA_READ(Real)                                                                           \
  template void delta_read_forward<Real>(const DeltaRead<Real>&, const DeltaReadState<Real>&, Real* const*); \
  template void delta_read_backward<Real>(const DeltaRead<Real>&, const DeltaReadState<Real>&,               \
                                          const DeltaReadGrads<Real>&, Real*, Real*, Real*);
ATTNRES_DELTA_READ(float)
ATTNRES_DELTA_READ(double)
#undef ATTNRES_DELTA_READ

}  // namespace attnres::kernels
