// The single-stream trunk: prenorm, full, block, rd and denseformer keep one residual stream per
// token. Sublayers read it as the running sum (prenorm), through softmax depth reads over earlier
// block outputs (AttnRes: full, block, rd), or after the DWAs that follow blocks (DenseFormer);
// the wiring of each is Topology's (topology.hpp), the sublayer bodies are sublayers.cpp's.
//
// Kept for the backward, per sublayer: its output (the partial sum after its write-back) and, with
// depth reads, the read's output, RMS factors and logits; DenseFormer's DWA outputs. RD's value
// route emits its normalised input directly (the norm is fused into the read) and the backward
// recomputes it, so RD keeps no more than Block.
#include <algorithm>
#include <memory>

#include "kernels/depth_read.hpp"
#include "kernels/dwa.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/family.hpp"
#include "model/model.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"

namespace attnres {

namespace k = kernels;

namespace {

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

// The depth reads' queries and key norms (spec §2: zeros and ones, so every read starts as the mean
// of its sources) and DenseFormer's DWA weights (the identity: prenorm's function at init).
void add_single_stream_params(ParamLayout& layout, const ModelConfig& c, ParamPlace place, int layer) {
  const std::int64_t d = c.d_model;
  const bool reads = c.uses_depth_reads();
  if (place == ParamPlace::layer_end && reads) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    layout.add(p + "attn_res.query", {d}, ParamKind::query);
    layout.add(p + "attn_res.key_norm.weight", {d}, ParamKind::norm_weight);
    if (c.has_value_query()) layout.add(p + "attn_res.value_query", {d}, ParamKind::query);
    layout.add(p + "mlp_res.query", {d}, ParamKind::query);
    layout.add(p + "mlp_res.key_norm.weight", {d}, ParamKind::norm_weight);
  }
  if (place != ParamPlace::after_layers) return;
  if (c.residual == ResidualMode::denseformer) {
    for (int i = 1; i <= c.n_layers; ++i) {
      const auto n = k::dwa_sources(i, c.dwa_dilation, c.dwa_period).size();
      if (n == 0) continue;
      std::vector<double> identity(n, 0.0);  // the block's own output, last: plain pre-norm at init
      identity.back() = 1.0;
      layout.add_fixed("dwa." + std::to_string(i) + ".alpha", std::move(identity), c.dwa_weight_decay);
    }
  }
  if (reads) {
    layout.add("final_res.query", {d}, ParamKind::query);
    layout.add("final_res.key_norm.weight", {d}, ParamKind::norm_weight);
  }
}

// DenseFormer's: each DWA's weights, its sources the block outputs it reads (0: the embedding).
std::vector<Connections> single_stream_static_connections(const ModelConfig& c, const ParamLayout& layout,
                                                          std::span<const double> params) {
  if (c.residual != ResidualMode::denseformer) return {};
  Connections dwa;
  dwa.name = "dwa";
  for (int block = 1; block <= c.n_layers; ++block) {
    const std::vector<int> sources = k::dwa_sources(block, c.dwa_dilation, c.dwa_period);
    if (sources.empty()) continue;
    const ParamInfo& alpha = layout.at("dwa." + std::to_string(block) + ".alpha");
    const auto* first = params.data() + alpha.offset;
    dwa.rows.push_back({block, sources, std::vector<double>(first, first + alpha.numel)});
  }
  return {std::move(dwa)};
}

template <class Real>
class SingleStreamTrunk final : public Trunk<Real> {
 public:
  explicit SingleStreamTrunk(const ModelParts<Real>& parts)
      : p_(parts), topo_(parts.topology), sub_(static_cast<std::size_t>(parts.config.n_sublayers())) {
    for (const DwaPlan& plan : topo_.dwas()) {
      const std::string name = "dwa." + std::to_string(plan.block) + ".alpha";
      dwa_alpha_.push_back(param_view(p_.layout, p_.params, name));
      dwa_dalpha_.push_back(param_view(p_.layout, p_.grads, name));
    }
  }

  void carve(ArenaCarver<Real>& arena, std::int64_t bt) override {
    const std::int64_t d = p_.config.d_model;
    const bool reads = topo_.has_reads(), with_grad = !p_.grads.empty();
    for (int j = 0; j < topo_.n_sublayers(); ++j) {
      Sublayer& s = sub_[static_cast<std::size_t>(j)];
      if (reads) {
        const auto n_src = static_cast<std::int64_t>(topo_.read(j).sources.size());
        s.h = arena.take(bt * d);
        s.rms = arena.take(bt * n_src);
        s.read_logits = arena.take(topo_.read(j).n_routes * bt * n_src);
        s.read_alpha = arena.take(topo_.read(j).n_routes * bt * n_src);
      }
      s.out = arena.take(bt * d);
      if (with_grad) s.dout = arena.take(bt * d);
    }
    if (reads) {
      const auto n_src = static_cast<std::int64_t>(topo_.read(topo_.final_read()).sources.size());
      h_final_ = arena.take(bt * d);
      rms_final_ = arena.take(bt * n_src);
      logits_final_ = arena.take(bt * n_src);
      alpha_final_ = arena.take(bt * n_src);
    }
    if (topo_.any_separate_value()) {
      xv_ = arena.take(bt * d);
      if (with_grad) dxv_ = arena.take(bt * d);
    }
    dwa_out_.assign(static_cast<std::size_t>(p_.config.n_layers + 1), nullptr);
    ddwa_out_.assign(dwa_out_.size(), nullptr);
    for (const DwaPlan& plan : topo_.dwas()) {
      dwa_out_[static_cast<std::size_t>(plan.block)] = arena.take(bt * d);
      if (with_grad) ddwa_out_[static_cast<std::size_t>(plan.block)] = arena.take(bt * d);
    }
  }

  std::int64_t reduce_scratch(std::int64_t bt) const override {
    std::int64_t n = k::rmsnorm_scratch_size(bt, p_.config.d_model);
    if (topo_.has_reads()) n = std::max(n, k::depth_read_scratch_size(bt, p_.config.d_model));
    for (const DwaPlan& plan : topo_.dwas())
      n = std::max(n, k::dwa_scratch_size(bt, static_cast<int>(plan.sources.size())));
    return n;
  }

  const Real* forward(const Pass<Real>& pass) override;
  void backward(const Pass<Real>& pass) override;

  // The depth view: every attention sublayer's read, with its routes (RD: Q/K and V), and
  // DenseFormer's DWA weights.
  std::vector<RoutedInput> routed_inputs() const override {
    std::vector<RoutedInput> out;
    for (int l = 0; l < p_.config.n_layers && topo_.has_reads(); ++l) {
      const ReadPlan& plan = topo_.read(2 * l);
      out.push_back({l, static_cast<int>(plan.sources.size()), plan.n_routes});
    }
    return out;
  }
  void route_distributions(int index, std::int64_t token, std::span<double> p) const override {
    const auto n = topo_.read(2 * index).sources.size();
    Real alpha[k::kMaxSources];
    for (int route = 0; route < topo_.read(2 * index).n_routes; ++route) {
      read_weights(2 * index, route, token, std::span<Real>(alpha, n));
      std::copy(alpha, alpha + n, p.begin() + static_cast<std::ptrdiff_t>(route * n));
    }
  }
  std::unique_ptr<MixingSum> mixing_sum() const override {
    if (topo_.dwas().empty()) return nullptr;
    const std::vector<double> params(p_.params.begin(), p_.params.end());
    return std::make_unique<StaticMixing>(single_stream_static_connections(p_.config, p_.layout, params));
  }
  std::int64_t tokens() const override { return n_tok_; }

  // Model::read_weights.
  void read_weights(int read, int route, std::int64_t token, std::span<Real> alpha) const;

 private:
  // What sublayer j keeps besides its body's activations.
  struct Sublayer {
    Real* h = nullptr;  // the read's output (null without depth reads: the input is a stream)
    Real* rms = nullptr;
    Real* read_logits = nullptr;
    Real* read_alpha = nullptr;  // the read's weights per route, [n_routes, n_tok, n_sources]
    Real* out = nullptr;   // the partial sum after this sublayer's write-back
    Real* dout = nullptr;  // its gradient
  };

  // The buffer of a residual-stream index of the topology (kNoStream: null), and its gradient.
  const Real* residual(int index) const {
    if (index == kNoStream) return nullptr;
    if (topo_.is_dwa_stream(index)) return dwa_out_[static_cast<std::size_t>(index - topo_.n_sublayers() + 1)];
    return index == kEmbedding ? p_.buffers.emb : sub_[static_cast<std::size_t>(index)].out;
  }
  Real* dresidual(int index) {
    if (index == kNoStream) return nullptr;
    if (topo_.is_dwa_stream(index)) return ddwa_out_[static_cast<std::size_t>(index - topo_.n_sublayers() + 1)];
    return index == kEmbedding ? p_.buffers.demb : sub_[static_cast<std::size_t>(index)].dout;
  }
  // One planned read's view for the kernels: the read of sublayer j (j == n_sublayers: the final
  // read) with its weights from w; `sources` receives the source pointers.
  k::DepthRead<Real> depth_read(int j, const ModelWeights<Real>& w, const Real** sources) const;
  // out: the read's output (the QK route); xv: RD's normalised value-route input.
  void run_read(int j, Real* out, Real* xv, Real* rms, Real* logits, Real* alpha);
  // Accumulates the read's gradients from dout (and dxv for RD's value route); xv receives the
  // value-route input again (for Wv's gradient).
  void run_read_backward(int j, const Real* dout, const Real* dxv, const Real* rms, const Real* logits,
                         const Real* alpha, Real* xv);
  k::Dwa<Real> dwa(const DwaPlan& plan, const Real** sources) const;

  const ModelParts<Real> p_;
  const Topology& topo_;
  std::vector<Real*> dwa_alpha_, dwa_dalpha_;  // DenseFormer's weights and gradients, by Topology::dwas()
  std::vector<Sublayer> sub_;
  // The final read's.
  Real *h_final_ = nullptr, *rms_final_ = nullptr, *logits_final_ = nullptr, *alpha_final_ = nullptr;
  // RD's value route (decoupled, frozen): the read emits its normalised input directly, and the
  // backward recomputes it into dxv_ (so it is not kept per layer).
  Real *xv_ = nullptr, *dxv_ = nullptr;
  // DenseFormer: each DWA's output Y_i and its gradient, by block (null where none).
  std::vector<Real*> dwa_out_, ddwa_out_;
  std::int64_t n_tok_ = 0;  // of the last forward pass
};

template <class Real>
k::DepthRead<Real> SingleStreamTrunk<Real>::depth_read(int j, const ModelWeights<Real>& w, const Real** sources) const {
  const ReadPlan& plan = topo_.read(j);
  const ReadParams<Real> p = read_params(w, topo_, j);
  for (std::size_t s = 0; s < plan.sources.size(); ++s) sources[s] = residual(plan.sources[s]);
  k::DepthRead<Real> rd;
  rd.sources = sources;
  rd.n_sources = static_cast<int>(plan.sources.size());
  rd.n_tok = n_tok_;
  rd.d = p_.config.d_model;
  rd.eps = static_cast<Real>(p_.config.norm_eps);
  rd.gamma = p.key_norm;
  rd.n_routes = plan.n_routes;
  rd.queries[0] = p.query;
  rd.queries[1] = p.value_query;
  rd.average = plan.average;
  rd.out_norm[1] = p.value_norm;
  return rd;
}

template <class Real>
void SingleStreamTrunk<Real>::run_read(int j, Real* out, Real* xv, Real* rms, Real* logits, Real* alpha) {
  const Real* sources[k::kMaxSources];
  const k::DepthRead<Real> rd = depth_read(j, p_.w, sources);
  Real* outs[k::kMaxRoutes] = {out, xv};
  k::depth_read_forward(rd, outs, rms, logits, alpha);
}

template <class Real>
void SingleStreamTrunk<Real>::run_read_backward(int j, const Real* dout, const Real* dxv, const Real* rms,
                                                const Real* logits, const Real* alpha, Real* xv) {
  const ReadPlan& plan = topo_.read(j);
  const Real* sources[k::kMaxSources];
  const k::DepthRead<Real> rd = depth_read(j, p_.w, sources);
  const ReadParams<Real> pg = read_params(p_.g, topo_, j);
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
  k::depth_read_backward(rd, rms, logits, alpha, gr, p_.buffers.reduce);
}

template <class Real>
k::Dwa<Real> SingleStreamTrunk<Real>::dwa(const DwaPlan& plan, const Real** sources) const {
  for (std::size_t s = 0; s < plan.sources.size(); ++s) sources[s] = residual(plan.sources[s]);
  const auto index = static_cast<std::size_t>(&plan - topo_.dwas().data());
  k::Dwa<Real> dwa;
  dwa.sources = sources;
  dwa.n_sources = static_cast<int>(plan.sources.size());
  dwa.n_tok = n_tok_;
  dwa.d = p_.config.d_model;
  dwa.alpha = dwa_alpha_[index];
  return dwa;
}

template <class Real>
const Real* SingleStreamTrunk<Real>::forward(const Pass<Real>& pass) {
  n_tok_ = pass.n_tok();
  const std::int64_t n = n_tok_;
  const int d = p_.config.d_model;
  const Real eps = static_cast<Real>(p_.config.norm_eps);
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  for (int j = 0; j < L; ++j) {
    Sublayer& s = sub_[static_cast<std::size_t>(j)];
    SublayerActivations<Real>& a = p_.bodies.at(j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (reads) run_read(j, s.h, separate ? xv_ : nullptr, s.rms, s.read_logits, s.read_alpha);
    const Real* h = reads ? s.h : residual(topo_.input(j));
    k::rmsnorm_forward(a.x, a.rstd, h, input_norm(p_.w, L, j), n, d, eps);
    const Real* base = residual(topo_.write_base(j));
    if (base != nullptr) k::copy(s.out, base, n * d);
    if (is_attention(j)) {
      p_.bodies.attention_forward(j, a.x, a.x, separate ? xv_ : a.x, s.out, base != nullptr, pass);
    } else {
      p_.bodies.mlp_forward(j, a.x, s.out, base != nullptr, pass);
      if (const DwaPlan* plan = topo_.dwa_ending_at(j)) {
        const Real* sources[k::kMaxSources];
        k::dwa_forward(dwa(*plan, sources), dwa_out_[static_cast<std::size_t>(plan->block)]);
      }
    }
  }
  if (!reads) return residual(topo_.input(L));
  run_read(topo_.final_read(), h_final_, nullptr, rms_final_, logits_final_, alpha_final_);
  return h_final_;
}

template <class Real>
void SingleStreamTrunk<Real>::backward(const Pass<Real>& pass) {
  const std::int64_t n = n_tok_;
  const int d = p_.config.d_model;
  const int L = topo_.n_sublayers();
  const bool reads = topo_.has_reads();
  const TrunkBuffers<Real>& b = p_.buffers;
  for (Sublayer& s : sub_)
    if (s.dout != nullptr) k::zero(s.dout, n * d);
  for (Real* g : ddwa_out_)
    if (g != nullptr) k::zero(g, n * d);

  // b.dh holds the final norm's input gradient.
  if (reads) {
    run_read_backward(topo_.final_read(), b.dh, nullptr, rms_final_, logits_final_, alpha_final_, nullptr);
  } else {
    k::add_into(dresidual(topo_.input(L)), b.dh, n * d);
  }

  for (int j = L - 1; j >= 0; --j) {
    Sublayer& s = sub_[static_cast<std::size_t>(j)];
    const SublayerActivations<Real>& a = p_.bodies.at(j);
    const bool separate = reads && topo_.read(j).separate_value;
    if (const DwaPlan* plan = topo_.dwa_ending_at(j)) {
      // The DWA's output gradient is complete (its readers lie in later blocks); scattering it
      // completes s.dout, the gradient of this block's output, as every DWA reading it is later.
      const Real* sources[k::kMaxSources];
      Real* dsources[k::kMaxSources];
      for (std::size_t i = 0; i < plan->sources.size(); ++i) dsources[i] = dresidual(plan->sources[i]);
      const auto index = static_cast<std::size_t>(plan - topo_.dwas().data());
      k::dwa_backward(dwa(*plan, sources), dresidual(plan->output), dsources, dwa_dalpha_[index], b.reduce);
    }
    // s.dout is complete: every later user of this partial sum has been visited.
    if (Real* dbase = dresidual(topo_.write_base(j))) k::add_into(dbase, s.dout, n * d);
    if (is_attention(j)) {
      // RD's value route: Wv's gradient waits for its input, recomputed by the read's backward.
      p_.bodies.attention_backward(j, s.dout, a.x, a.x, separate ? nullptr : a.x, b.dx, b.dx, separate ? dxv_ : b.dx,
                                   pass);
    } else {
      p_.bodies.mlp_backward(j, s.dout, a.x, b.dx, pass);
    }
    const Real* h = reads ? s.h : residual(topo_.input(j));
    k::rmsnorm_backward(b.dh, input_norm(p_.g, L, j), b.dx, h, input_norm(p_.w, L, j), a.rstd, n, d, b.reduce);
    if (reads) {
      // RD's value route: the read's backward takes dxv through the fused norm and recomputes
      // the normalised input xv on the way (bit for bit) into dxv's buffer, row by row as dxv
      // is consumed (no separate buffer to fetch), which Wv's gradient then reads.
      run_read_backward(j, b.dh, separate ? dxv_ : nullptr, s.rms, s.read_logits, s.read_alpha,
                        separate ? dxv_ : nullptr);
      if (separate) p_.bodies.attention_value_weight_backward(j, dxv_, pass);
    } else {
      k::add_into(dresidual(topo_.input(j)), b.dh, n * d);
    }
  }
}

template <class Real>
void SingleStreamTrunk<Real>::read_weights(int read, int route, std::int64_t token, std::span<Real> alpha) const {
  require(read >= 0 && read <= topo_.final_read() && topo_.has_reads(), "the model has no depth read ", read);
  const ReadPlan& plan = topo_.read(read);
  const int n = static_cast<int>(plan.sources.size());
  require(route >= 0 && route < plan.n_routes, "read ", read, " has no route ", route);
  require(token >= 0 && token < n_tok_, "token index out of range");
  require(static_cast<int>(alpha.size()) == n, "alpha buffer has the wrong size");
  const Real* weights = read == topo_.final_read() ? alpha_final_ : sub_[static_cast<std::size_t>(read)].read_alpha;
  const Real* row = weights + (route * n_tok_ + token) * n;
  std::copy(row, row + n, alpha.begin());
}

}  // namespace

template <class Real>
std::unique_ptr<Trunk<Real>> make_single_stream_trunk(const ModelParts<Real>& parts) {
  return std::make_unique<SingleStreamTrunk<Real>>(parts);
}

template <class Real>
void Model<Real>::read_weights(int read, int route, std::int64_t token, std::span<Real> alpha) const {
  const auto* trunk = dynamic_cast<const SingleStreamTrunk<Real>*>(trunk_.get());
  require(trunk != nullptr, "the model has no depth read ", read);
  trunk->read_weights(read, route, token, alpha);
}

template void Model<float>::read_weights(int, int, std::int64_t, std::span<float>) const;
template void Model<double>::read_weights(int, int, std::int64_t, std::span<double>) const;

const ResidualFamily& single_stream_family() {
  using M = ModelConfig;
  using R = ResidualMode;
  static const ResidualFamily family = {
      .name = "single-stream",
      .modes = {{R::prenorm, "prenorm", true, {}},
                {R::full, "full", true, {.routing = true}},
                {R::block, "block", true, {.routing = true}},
                {R::rd, "rd", true, {.routing = true}},
                // DenseFormer's connections are its DWA weights.
                {R::denseformer, "denseformer", true, {.connections = true}}},
      .trunk_float = make_single_stream_trunk<float>,
      .trunk_double = make_single_stream_trunk<double>,
      .add_params = add_single_stream_params,
      .static_connections = single_stream_static_connections,
      .residual_flops = single_stream_residual_flops,
      .connections = {{"dwa",
                       ConnectionAxis::source,
                       {"DenseFormer: row i is the DWA after block i, Y_i = sum_j alpha_j X_j over the block outputs it "
                        "reads (emb = X_0); identity initialisation puts 1 on X_i. Weights are signed."}}},
      .arms = {{"prenorm", [](M& m) { m.residual = R::prenorm; }},
               {"full", [](M& m) { m.residual = R::full; }},
               {"block", [](M& m) { m.residual = R::block; }},
               {"rd", [](M& m) { m.residual = R::rd, m.value_route = ValueRoute::decoupled; }},
               {"rd-tied", [](M& m) { m.residual = R::rd, m.value_route = ValueRoute::tied; }},
               {"rd-average", [](M& m) { m.residual = R::rd, m.value_route = ValueRoute::average; }},
               {"rd-frozen", [](M& m) { m.residual = R::rd, m.value_route = ValueRoute::frozen; }},
               {"denseformer", [](M& m) { m.residual = R::denseformer, m.dwa_dilation = 1, m.dwa_period = 1; }},
               {"denseformer-4x5",
                [](M& m) { m.residual = R::denseformer, m.dwa_dilation = 4, m.dwa_period = 5; }}},
  };
  return family;
}

}  // namespace attnres
