// The Delta AttnRes trunk (delta, delta_block; docs/delta-gated-spec.md §1): pre-norm's residual
// stream x_{j+1} = x_j + f_j stays, and sublayer j normalises h_j = x_j + g ⊙ sum_s alpha_s v_s, an
// additive softmax read (kernels/delta_read) over the deltas that topology.hpp's
// delta_read_sources lists, after the learned null source when there is one. No final read: the
// final norm reads x_L.
//
// A family of its own rather than a mode of the single-stream trunk: there a read replaces the
// stream, so one buffer per sublayer is both the stream and a source; here the read is added to the
// stream, so the stream and the sources are kept apart, the backward carries the stream's gradient
// past every read, and the reads have a gate and, on the V route, a key norm of their own.
//
// Kept per sublayer: the stream after it (x_{j+1}), its source (f_j, or the block's partial sum
// after it), and with a read its h, RMS factors, logits and weights, the mix c (with a gate) and the vector
// gate's values; with the V route also h_V, c_V and V's normalised input with its RMS factors.
#include <algorithm>
#include <memory>

#include "kernels/delta_read.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/family.hpp"
#include "model/model.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"

namespace attnres {

namespace k = kernels;

namespace {

bool delta_value_route(const ModelConfig& c, int j) {
  return is_attention(j) && c.delta_value_route == DeltaValueRoute::decoupled;
}

// Sources of sublayer j's read, the null source included.
int delta_sources(const ModelConfig& c, int j) {
  return static_cast<int>(delta_read_sources(c, j).size()) + (c.delta_null_source ? 1 : 0);
}

}  // namespace

// The spec's cost model (§1.6), per token: a read over n sources costs 4 d n (logits and mix) and
// 2 d (the add and w ⊙ gamma), the V route the same again, the vector gate 2 d² (its matmul); each
// source tensor read (the embedding, a sublayer's source, a read's null source) one RMS factor, 2 d.
// x3 for forward and backward, as the other families. (The spec's table also counts 2 d for
// sublayer 0, which has no read without the null source.)
double delta_residual_flops(const ModelConfig& c) {
  const double d = c.d_model;
  double flops = 0;
  std::vector<bool> read(static_cast<std::size_t>(c.n_sublayers()) + 1, false);  // [0]: the embedding
  for (int j = 0; j < c.n_sublayers(); ++j) {
    const int n = delta_sources(c, j);
    if (n == 0) continue;
    flops += (delta_value_route(c, j) ? 2 : 1) * (4 * d * n + 2 * d);
    if (c.delta_gate == k::DeltaGate::sigmoid_vector) flops += 2 * d * d;
    if (c.delta_null_source) flops += 2 * d;
    for (int index : delta_read_sources(c, j)) read[static_cast<std::size_t>(index + 1)] = true;
  }
  for (bool r : read) flops += r ? 2 * d : 0;
  return 3 * flops;
}

// Per read (attn_res, mlp_res of every layer; docs/delta-gated-spec.md §1.7): query (0) and key
// norm (1), the attention reads' V route (value_query 0, value_key_norm 1), the null source (0),
// the gate (logit -2, alpha 0, or W = 0 and b = -2). No RNG draws; no final read.
void add_delta_params(ParamLayout& layout, const ModelConfig& c, ParamPlace place, int layer) {
  if (place != ParamPlace::layer_end) return;
  const std::int64_t d = c.d_model;
  const bool decay = c.delta_decay_all;
  for (const int j : {2 * layer, 2 * layer + 1}) {
    const std::string p = delta_read_prefix(j);
    layout.add(p + "query", {d}, ParamKind::query).decay = decay;
    layout.add(p + "key_norm.weight", {d}, ParamKind::norm_weight).decay = decay;
    if (is_attention(j) && c.delta_value_route == DeltaValueRoute::decoupled) {
      layout.add(p + "value_query", {d}, ParamKind::query).decay = decay;
      layout.add(p + "value_key_norm.weight", {d}, ParamKind::norm_weight).decay = decay;
    }
    if (c.delta_null_source) layout.add(p + "null_source", {d}, ParamKind::query).decay = decay;
    switch (c.delta_gate) {
      case k::DeltaGate::none: break;
      case k::DeltaGate::sigmoid_scalar: layout.add_fixed(p + delta_gate_tensor(c.delta_gate), {-2.0}, decay); break;
      case k::DeltaGate::learnable_alpha: layout.add_fixed(p + delta_gate_tensor(c.delta_gate), {0.0}, decay); break;
      case k::DeltaGate::sigmoid_vector:
        layout.add(p + delta_gate_tensor(c.delta_gate), {d, d}, ParamKind::matrix, 0.0);  // zeros, no draws; always decayed
        layout.add_fixed(p + "gate.bias", std::vector<double>(static_cast<std::size_t>(d), -2.0), decay);
        break;
    }
  }
}

namespace {

// One read's tensors (in the parameters or in their gradients; null where absent).
template <class Real>
struct DeltaReadWeights {
  Real *query = nullptr, *key_norm = nullptr, *value_query = nullptr, *value_key_norm = nullptr;
  Real *null_source = nullptr, *gate = nullptr, *gate_bias = nullptr;
};

template <class Real>
class DeltaTrunk final : public Trunk<Real> {
 public:
  explicit DeltaTrunk(const ModelParts<Real>& parts)
      : p_(parts), c_(parts.config), S_(parts.config.sublayers_per_block()),
        sub_(static_cast<std::size_t>(parts.config.n_sublayers())) {
    for (int j = 0; j < c_.n_sublayers(); ++j) {
      Sublayer& s = sub_[static_cast<std::size_t>(j)];
      s.sources = delta_read_sources(c_, j);
      s.n_src = delta_sources(c_, j);
      s.value_route = delta_value_route(c_, j) && s.n_src > 0;
      const std::string p = delta_read_prefix(j);
      s.w = bind(p, p_.params);
      s.gw = bind(p, p_.grads);
    }
  }

  void carve(ArenaCarver<Real>& arena, std::int64_t bt) override {
    const std::int64_t d = c_.d_model;
    const bool with_grad = !p_.grads.empty(), gated = c_.delta_gate != k::DeltaGate::none;
    for (Sublayer& s : sub_) {
      s.x_out = arena.take(bt * d);
      s.src = arena.take(bt * d);
      if (with_grad) s.dsrc = arena.take(bt * d);
      if (s.n_src == 0) continue;
      s.h = arena.take(bt * d);
      s.c = gated ? arena.take(bt * d) : nullptr;
      s.rms = arena.take(bt * s.n_src);
      s.logits = arena.take(bt * s.n_src);
      s.alpha = arena.take(bt * s.n_src);
      if (c_.delta_gate == k::DeltaGate::sigmoid_vector) s.g = arena.take(bt * d);
      if (s.value_route) {
        s.hv = arena.take(bt * d);
        s.cv = gated ? arena.take(bt * d) : nullptr;
        s.logits_v = arena.take(bt * s.n_src);
        s.alpha_v = arena.take(bt * s.n_src);
        s.xv = arena.take(bt * d);
        s.rstd_v = arena.take(bt);
      }
    }
    f_ = arena.take(bt * d);  // a delta_block sublayer's output, before it joins the partial sum
    c_scratch_[0] = arena.take(bt * d);  // the mixes when no gate needs them kept
    c_scratch_[1] = arena.take(bt * d);
    if (c_.delta_null_source) null_ = arena.take(bt * d);
    if (with_grad) {
      dstream_ = arena.take(bt * d);
      work_[0] = arena.take(bt * d);
      work_[1] = arena.take(bt * d);
      dhv_ = arena.take(bt * d);
      dxv_ = arena.take(bt * d);
      if (c_.delta_null_source) dnull_ = arena.take(bt * d);
    }
  }

  std::int64_t reduce_scratch(std::int64_t bt) const override {
    return std::max(k::rmsnorm_scratch_size(bt, c_.d_model), k::delta_read_scratch_size(bt, c_.d_model));
  }

  const Real* forward(const Pass<Real>& pass) override;
  void backward(const Pass<Real>& pass) override;

  // The depth view: every attention sublayer's read that has sources, with its V route.
  std::vector<RoutedInput> routed_inputs() const override {
    std::vector<RoutedInput> out;
    for (int l = 0; l < c_.n_layers; ++l) {
      const Sublayer& s = sub_[static_cast<std::size_t>(2 * l)];
      if (s.n_src > 0) out.push_back({l, s.n_src, s.value_route ? 2 : 1});
    }
    return out;
  }
  void route_distributions(int index, std::int64_t token, std::span<double> p) const override {
    const Sublayer& s = *routed(index);
    const auto n = static_cast<std::size_t>(s.n_src);
    for (int route = 0; route < (s.value_route ? 2 : 1); ++route) {
      const Real* alpha = (route == 0 ? s.alpha : s.alpha_v) + token * s.n_src;
      std::copy(alpha, alpha + n, p.begin() + static_cast<std::ptrdiff_t>(route * n));
    }
  }
  // Every read with more than one source, attention and MLP (routing_max_weight).
  std::vector<int> max_weight_reads() const override {
    std::vector<int> out;
    for (int j = 0; j < c_.n_sublayers(); ++j)
      if (sub_[static_cast<std::size_t>(j)].n_src > 1) out.push_back(j);
    return out;
  }
  double max_weight(int read, std::int64_t token) const override {
    const Sublayer& s = sub_[static_cast<std::size_t>(read)];
    const Real* alpha = s.alpha + token * s.n_src;
    return static_cast<double>(*std::max_element(alpha, alpha + s.n_src));
  }
  std::int64_t tokens() const override { return n_tok_; }

 private:
  struct Sublayer {
    std::vector<int> sources;  // stream indices (kEmbedding or a sublayer's source buffer)
    int n_src = 0;             // with the null source; 0: no read
    bool value_route = false;
    DeltaReadWeights<Real> w, gw;
    Real *x_out = nullptr, *src = nullptr, *dsrc = nullptr;
    Real *h = nullptr, *c = nullptr, *rms = nullptr, *logits = nullptr, *alpha = nullptr, *g = nullptr;
    Real *hv = nullptr, *cv = nullptr, *logits_v = nullptr, *alpha_v = nullptr, *xv = nullptr, *rstd_v = nullptr;
  };

  DeltaReadWeights<Real> bind(const std::string& p, std::span<Real> flat) const {
    const ParamLayout& l = p_.layout;
    return {param_view(l, flat, p + "query"),       param_view(l, flat, p + "key_norm.weight"),
            param_view(l, flat, p + "value_query"), param_view(l, flat, p + "value_key_norm.weight"),
            param_view(l, flat, p + "null_source"),
            c_.delta_gate == k::DeltaGate::none ? nullptr : param_view(l, flat, p + delta_gate_tensor(c_.delta_gate)),
            param_view(l, flat, p + "gate.bias")};
  }
  const Sublayer* routed(int index) const {
    int seen = 0;
    for (int l = 0; l < c_.n_layers; ++l) {
      const Sublayer& s = sub_[static_cast<std::size_t>(2 * l)];
      if (s.n_src > 0 && seen++ == index) return &s;
    }
    fail("the model has no routed input ", index);
  }
  bool block_start(int j) const { return j % S_ == 0; }
  const Real* stream(int j) const { return j == 0 ? p_.buffers.emb : sub_[static_cast<std::size_t>(j - 1)].x_out; }
  const Real* source(int index) const {
    return index == kEmbedding ? p_.buffers.emb : sub_[static_cast<std::size_t>(index)].src;
  }
  Real* dsource(int index) {
    return index == kEmbedding ? p_.buffers.demb : sub_[static_cast<std::size_t>(index)].dsrc;
  }
  // The read of sublayer j (with sources): its kernel view over `sources` (filled here, the null
  // source first, broadcast into null_), and what its forward keeps.
  k::DeltaRead<Real> delta_read(int j, const Real** sources);
  k::DeltaReadState<Real> state(const Sublayer& s) const {
    k::DeltaReadState<Real> st;
    st.c[0] = s.c != nullptr ? s.c : c_scratch_[0];
    st.c[1] = s.cv != nullptr ? s.cv : c_scratch_[1];
    st.logits[0] = s.logits;
    st.logits[1] = s.logits_v;
    st.alpha[0] = s.alpha;
    st.alpha[1] = s.alpha_v;
    st.rms = s.rms;
    st.g = s.g;
    return st;
  }

  const ModelParts<Real> p_;
  const ModelConfig& c_;
  const int S_;  // sublayers per block (1 for delta)
  std::vector<Sublayer> sub_;
  Real* f_ = nullptr;
  Real* c_scratch_[2] = {};
  Real *null_ = nullptr, *dnull_ = nullptr;
  Real *dstream_ = nullptr, *dhv_ = nullptr, *dxv_ = nullptr;
  Real* work_[2] = {};
  std::int64_t n_tok_ = 0;
};

template <class Real>
k::DeltaRead<Real> DeltaTrunk<Real>::delta_read(int j, const Real** sources) {
  const Sublayer& s = sub_[static_cast<std::size_t>(j)];
  const int d = c_.d_model;
  int n = 0;
  if (c_.delta_null_source) {
    for (std::int64_t t = 0; t < n_tok_; ++t) std::copy(s.w.null_source, s.w.null_source + d, null_ + t * d);
    sources[n++] = null_;
  }
  for (int index : s.sources) sources[n++] = source(index);
  k::DeltaRead<Real> rd;
  rd.n_routes = s.value_route ? 2 : 1;
  for (int r = 0; r < rd.n_routes; ++r) {
    k::DepthRead<Real>& dr = rd.routes[r];
    dr.sources = sources;
    dr.n_sources = n;
    dr.n_tok = n_tok_;
    dr.d = d;
    dr.eps = static_cast<Real>(c_.norm_eps);
    dr.gamma = r == 0 ? s.w.key_norm : s.w.value_key_norm;
    dr.queries[0] = r == 0 ? s.w.query : s.w.value_query;
  }
  rd.x = stream(j);
  rd.gate = c_.delta_gate;
  rd.gate_param = s.w.gate;
  rd.gate_bias = s.w.gate_bias;
  return rd;
}

template <class Real>
const Real* DeltaTrunk<Real>::forward(const Pass<Real>& pass) {
  n_tok_ = pass.n_tok();
  const std::int64_t n = n_tok_;
  const int d = c_.d_model, L = c_.n_sublayers();
  const Real eps = static_cast<Real>(c_.norm_eps);
  for (int j = 0; j < L; ++j) {
    Sublayer& s = sub_[static_cast<std::size_t>(j)];
    SublayerActivations<Real>& a = p_.bodies.at(j);
    const Real* h = stream(j);  // no sources: h = x
    if (s.n_src > 0) {
      const Real* sources[k::kMaxSources];
      Real* hs[k::kMaxRoutes] = {s.h, s.hv};
      k::delta_read_forward(delta_read(j, sources), state(s), hs);
      h = s.h;
    }
    k::rmsnorm_forward(a.x, a.rstd, h, input_norm(p_.w, L, j), n, d, eps);
    if (s.value_route) k::rmsnorm_forward(s.xv, s.rstd_v, s.hv, input_norm(p_.w, L, j), n, d, eps);
    // f_j goes straight into its source at a block start; inside a block the source is the partial
    // sum P_{j-1} + f_j.
    Real* f = block_start(j) ? s.src : f_;
    if (is_attention(j)) p_.bodies.attention_forward(j, a.x, a.x, s.value_route ? s.xv : a.x, f, false, pass);
    else p_.bodies.mlp_forward(j, a.x, f, false, pass);
    if (!block_start(j)) {
      k::copy(s.src, sub_[static_cast<std::size_t>(j - 1)].src, n * d);
      k::add_into(s.src, f_, n * d);
    }
    k::copy(s.x_out, stream(j), n * d);
    k::add_into(s.x_out, f, n * d);
  }
  return sub_.back().x_out;
}

template <class Real>
void DeltaTrunk<Real>::backward(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = c_.d_model, L = c_.n_sublayers();
  const TrunkBuffers<Real>& b = p_.buffers;
  for (Sublayer& s : sub_) k::zero(s.dsrc, n * d);
  k::copy(dstream_, b.dh, n * d);  // dL/dx_L; then dL/dx_j on the way down
  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = sub_[static_cast<std::size_t>(j)];
    const SublayerActivations<Real>& a = p_.bodies.at(j);
    // s.dsrc is complete (its readers are later sublayers); inside a block it is also the
    // previous partial sum's. Then f_j's gradient: the source's plus the stream's.
    if (!block_start(j)) k::add_into(sub_[static_cast<std::size_t>(j - 1)].dsrc, s.dsrc, n * d);
    k::add_into(s.dsrc, dstream_, n * d);
    if (is_attention(j)) {
      p_.bodies.attention_backward(j, s.dsrc, a.x, a.x, s.value_route ? s.xv : a.x, b.dx, b.dx,
                                   s.value_route ? dxv_ : b.dx, pass);
    } else {
      p_.bodies.mlp_backward(j, s.dsrc, a.x, b.dx, pass);
    }
    const Real* h = s.n_src > 0 ? s.h : stream(j);
    k::rmsnorm_backward(b.dh, input_norm(p_.g, L, j), b.dx, h, input_norm(p_.w, L, j), a.rstd, n, d, b.reduce);
    if (s.value_route)
      k::rmsnorm_backward(dhv_, input_norm(p_.g, L, j), dxv_, s.hv, input_norm(p_.w, L, j), s.rstd_v, n, d,
                          b.reduce);
    if (s.n_src == 0) {
      k::add_into(dstream_, b.dh, n * d);
      continue;
    }
    const Real* sources[k::kMaxSources];
    const k::DeltaRead<Real> rd = delta_read(j, sources);
    Real* dsources[k::kMaxSources];
    int m = 0;
    if (c_.delta_null_source) {
      k::zero(dnull_, n * d);
      dsources[m++] = dnull_;
    }
    for (int index : s.sources) dsources[m++] = dsource(index);
    k::DeltaReadGrads<Real> gr;
    gr.dh[0] = b.dh;
    gr.dh[1] = dhv_;
    gr.dsources = dsources;
    gr.dqueries[0] = s.gw.query;
    gr.dqueries[1] = s.gw.value_query;
    gr.dgamma[0] = s.gw.key_norm;
    gr.dgamma[1] = s.gw.value_key_norm;
    gr.dx = dstream_;
    gr.dgate_param = s.gw.gate;
    gr.dgate_bias = s.gw.gate_bias;
    k::delta_read_backward(rd, state(s), gr, work_[0], work_[1], b.reduce);
    if (c_.delta_null_source)  // one vector for every token: its gradient sums over them, in token order
      for (std::int64_t t = 0; t < n; ++t)
        for (int kk = 0; kk < d; ++kk) s.gw.null_source[kk] += dnull_[t * d + kk];
  }
  k::add_into(b.demb, dstream_, n * d);
}

}  // namespace

template <class Real>
std::unique_ptr<Trunk<Real>> make_delta_trunk(const ModelParts<Real>& parts) {
  return std::make_unique<DeltaTrunk<Real>>(parts);
}

template std::unique_ptr<Trunk<float>> make_delta_trunk(const ModelParts<float>&);
template std::unique_ptr<Trunk<double>> make_delta_trunk(const ModelParts<double>&);

const ResidualFamily& delta_family() {
  using M = ModelConfig;
  using R = ResidualMode;
  static const std::vector<R> both = {R::delta, R::delta_block};
  static const ResidualFamily family = {
      .name = "Delta AttnRes",
      // Delta AttnRes's routing: its attention reads (Q/K and, decoupled, V); also routing_max_weight.
      .modes = {{R::delta, "delta", true, {.routing = true}}, {R::delta_block, "delta_block", true, {.routing = true}}},
      .trunk_float = make_delta_trunk<float>,
      .trunk_double = make_delta_trunk<double>,
      // CUDA (src/cuda, issue #48): every option (each gate, the null source, the V route), both
      // delta_block schedules, either decay policy.
      .cuda_lacks = {},
      .add_params = add_delta_params,
      .static_connections = nullptr,  // per token only
      .residual_flops = delta_residual_flops,
      .keys = {{"delta_null_source", both},
               {"delta_gate", both},
               {"delta_value_route", both},
               {"delta_block_partial", {R::delta_block}},
               {"delta_decay_all", both}},
      .arms = {{"delta", [](M& m) { m.residual = R::delta; }},  // the delta_* keys from the config
               {"delta-block", [](M& m) { m.residual = R::delta_block; }}},  // and n_blocks
  };
  return family;
}

}  // namespace attnres
