// The single-stream trunk: prenorm, full, block, rd and denseformer keep one residual stream per
// token. Sublayers read it as the running sum (prenorm), through softmax depth reads over earlier
// block outputs (AttnRes: full, block, rd), or after the DWAs that follow blocks (DenseFormer);
// the wiring of each is Topology's (topology.hpp), the sublayer bodies are sublayers.cpp's.
#include "kernels/depth_read.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/arms.hpp"
#include "model/model.hpp"

namespace attnres {

namespace k = kernels;

// Per source of each read: its RMS (2 d), a logit dot (2 d) for each route with a query, a mix
// (2 d) for each output; x3 for forward and backward. DenseFormer's DWAs are not counted.
double single_stream_residual_flops(const ModelConfig& c) {
  const double d = c.d_model;
  double flops = 0;
  for (const ReadPlan& p : make_read_plans(c)) {
    const int with_query = p.n_routes - (p.uniform_value ? 1 : 0);
    const int outputs = p.average ? 1 : p.n_routes;
    flops += 6 * double(p.sources.size()) * d * (1 + with_query + outputs);
  }
  return flops;
}

template <class Real>
k::DepthRead<Real> Model<Real>::depth_read(int j, const ModelWeights<Real>& w, const Real** sources) const {
  const ReadPlan& plan = topo_.read(j);
  const ReadParams<Real> p = read_params(w, topo_, j);
  for (std::size_t s = 0; s < plan.sources.size(); ++s) sources[s] = residual(plan.sources[s]);
  k::DepthRead<Real> rd;
  rd.sources = sources;
  rd.n_sources = static_cast<int>(plan.sources.size());
  rd.n_tok = n_tok_;
  rd.d = config_.d_model;
  rd.eps = static_cast<Real>(config_.norm_eps);
  rd.gamma = p.key_norm;
  rd.n_routes = plan.n_routes;
  rd.queries[0] = p.query;
  rd.queries[1] = p.value_query;
  rd.average = plan.average;
  rd.out_norm[1] = p.value_norm;
  return rd;
}

template <class Real>
void Model<Real>::run_read(int j, Real* out, Real* xv, Real* rms, Real* logits) {
  const Real* sources[k::kMaxSources];
  const k::DepthRead<Real> rd = depth_read(j, w_, sources);
  Real* outs[k::kMaxRoutes] = {out, xv};
  k::depth_read_forward(rd, outs, rms, logits);
}

template <class Real>
void Model<Real>::run_read_backward(int j, const Real* dout, const Real* dxv, const Real* rms, const Real* logits,
                                    Real* xv) {
  const ReadPlan& plan = topo_.read(j);
  const Real* sources[k::kMaxSources];
  const k::DepthRead<Real> rd = depth_read(j, w_, sources);
  const ReadParams<Real> pg = read_params(g_, topo_, j);
  Real* dsources[k::kMaxSources];
  for (std::size_t s = 0; s < plan.sources.size(); ++s) dsources[s] = dresidual(plan.sources[s]);
  k::DepthReadGrads<Real> gr;
  gr.dout[0] = dout;
  gr.dout[1] = dxv;
  gr.dsources = dsources;
  gr.dqueries[0] = pg.query;
  gr.dqueries[1] = pg.value_query;
  gr.dgamma = pg.key_norm;
  gr.dout_norm[1] = pg.value_norm;
  gr.out[1] = xv;
  k::depth_read_backward(rd, rms, logits, gr, buf_.reduce);
}

template <class Real>
k::Dwa<Real> Model<Real>::dwa(const DwaPlan& plan, const Real** sources) const {
  for (std::size_t s = 0; s < plan.sources.size(); ++s) sources[s] = residual(plan.sources[s]);
  const auto index = static_cast<std::size_t>(&plan - topo_.dwas().data());
  k::Dwa<Real> dwa;
  dwa.sources = sources;
  dwa.n_sources = static_cast<int>(plan.sources.size());
  dwa.n_tok = n_tok_;
  dwa.d = config_.d_model;
  dwa.alpha = w_.dwa_alpha[index];
  return dwa;
}

template <class Real>
const Real* Model<Real>::forward_single_stream(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  const Real eps = static_cast<Real>(config_.norm_eps);
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  for (int j = 0; j < L; ++j) {
    Sublayer& s = buf_.sub[static_cast<std::size_t>(j)];
    SublayerActivations<Real>& a = bodies_.at(j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (reads) run_read(j, s.h, separate ? buf_.xv : nullptr, s.rms, s.read_logits);
    const Real* h = reads ? s.h : residual(topo_.input(j));
    k::rmsnorm_forward(a.x, a.rstd, h, input_norm(w_, L, j), n, d, eps);
    const Real* base = residual(topo_.write_base(j));
    if (base != nullptr) k::copy(s.out, base, n * d);
    if (is_attention(j)) {
      bodies_.attention_forward(j, a.x, a.x, separate ? buf_.xv : a.x, s.out, base != nullptr, pass);
    } else {
      bodies_.mlp_forward(j, a.x, s.out, base != nullptr, pass);
      if (const DwaPlan* plan = topo_.dwa_ending_at(j)) {
        const Real* sources[k::kMaxSources];
        k::dwa_forward(dwa(*plan, sources), buf_.dwa_out[static_cast<std::size_t>(plan->block)]);
      }
    }
  }
  if (!reads) return residual(topo_.input(L));
  run_read(topo_.final_read(), buf_.h_final, nullptr, buf_.rms_final, buf_.logits_final);
  return buf_.h_final;
}

template <class Real>
void Model<Real>::backward_single_stream(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = config_.d_model;
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  Buffers& b = buf_;

  // b.dh holds the final norm's input gradient. (grads_ and the activation gradients were zeroed
  // by the caller.)
  if (reads) {
    run_read_backward(topo_.final_read(), b.dh, nullptr, b.rms_final, b.logits_final, nullptr);
  } else {
    k::add_into(dresidual(topo_.input(L)), b.dh, n * d);
  }

  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = b.sub[static_cast<std::size_t>(j)];
    const SublayerActivations<Real>& a = bodies_.at(j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (const DwaPlan* plan = topo_.dwa_ending_at(j)) {
      // The DWA's output gradient is complete (its readers lie in later blocks); scattering it
      // completes s.dout, the gradient of this block's output, as every DWA reading it is later.
      const Real* sources[k::kMaxSources];
      Real* dsources[k::kMaxSources];
      for (std::size_t i = 0; i < plan->sources.size(); ++i) dsources[i] = dresidual(plan->sources[i]);
      const auto index = static_cast<std::size_t>(plan - topo_.dwas().data());
      k::dwa_backward(dwa(*plan, sources), dresidual(plan->output), dsources, g_.dwa_alpha[index], b.reduce);
    }
    // s.dout is complete: every later user of this partial sum has been visited.
    if (Real* dbase = dresidual(topo_.write_base(j))) k::add_into(dbase, s.dout, n * d);
    if (is_attention(j)) {
      // RD's value route: Wv's gradient waits for its input, recomputed by the read's backward.
      bodies_.attention_backward(j, s.dout, a.x, a.x, separate ? nullptr : a.x, b.dx, b.dx, separate ? b.dxv : b.dx,
                                 pass);
    } else {
      bodies_.mlp_backward(j, s.dout, a.x, b.dx, pass);
    }
    const Real* h = reads ? s.h : residual(topo_.input(j));
    k::rmsnorm_backward(b.dh, input_norm(g_, L, j), b.dx, h, input_norm(w_, L, j), a.rstd, n, d, b.reduce);
    if (reads) {
      // RD's value route: the read's backward takes dxv through the fused norm and recomputes
      // the normalised input xv on the way (bit for bit) into dxv's buffer, row by row as dxv
      // is consumed (no separate buffer to fetch), which Wv's gradient then reads.
      run_read_backward(j, b.dh, separate ? b.dxv : nullptr, s.rms, s.read_logits, separate ? b.dxv : nullptr);
      if (separate) bodies_.attention_value_weight_backward(j, b.dxv, pass);
    } else {
      k::add_into(dresidual(topo_.input(j)), b.dh, n * d);
    }
  }
}

#define ATTNRES_SINGLE_STREAM_INSTANTIATIONS(Real)                                                              \
  template k::DepthRead<Real> Model<Real>::depth_read(int, const ModelWeights<Real>&, const Real**) const;      \
  template void Model<Real>::run_read(int, Real*, Real*, Real*, Real*);                                         \
  template void Model<Real>::run_read_backward(int, const Real*, const Real*, const Real*, const Real*, Real*); \
  template k::Dwa<Real> Model<Real>::dwa(const DwaPlan&, const Real**) const;                                   \
  template const Real* Model<Real>::forward_single_stream(const Pass<Real>&);                                    \
  template void Model<Real>::backward_single_stream(const Pass<Real>&);
ATTNRES_SINGLE_STREAM_INSTANTIATIONS(float)
ATTNRES_SINGLE_STREAM_INSTANTIATIONS(double)
#undef ATTNRES_SINGLE_STREAM_INSTANTIATIONS

}  // namespace attnres
