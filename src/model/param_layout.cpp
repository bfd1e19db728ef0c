#include "model/param_layout.hpp"

#include <cmath>

#include "model/trunk.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace attnres {

ParamLayout::ParamLayout(const ModelConfig& c) {
  c.validate();
  const std::int64_t d = c.d_model, h = c.mlp_hidden, V = c.vocab_size;
  const double std_matrix = 0.02;
  const double std_out = 0.02 / std::sqrt(2.0 * c.n_layers);  // residual-writing projections
  add("tok_emb.weight", {V, d}, ParamKind::matrix, std_matrix);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "attn_norm.weight", {d}, ParamKind::norm_weight);  // MUDD qkvr: Q's
    add_trunk_params(*this, c, ParamPlace::attention_norm, i);
    if (c.mudd_multiway() && c.mudd_sep_qkv_norm) {
      add(p + "attn_norm_k.weight", {d}, ParamKind::norm_weight);
      add(p + "attn_norm_v.weight", {d}, ParamKind::norm_weight);
    }
    add(p + "attn.wq.weight", {d, d}, ParamKind::matrix, std_matrix);
    add(p + "attn.wk.weight", {d, d}, ParamKind::matrix, std_matrix);
    add(p + "attn.wv.weight", {d, d}, ParamKind::matrix, std_matrix);
    add(p + "attn.wo.weight", {d, d}, ParamKind::matrix, std_out);
    if (i >= 1 && c.vres_parameters() > 0) {  // the first attention layer keeps its own values
      std::vector<double> lambdas = {c.vres_lambda1, c.vres_lambda2};
      lambdas.resize(static_cast<std::size_t>(c.vres_parameters()));
      add_fixed(p + "attn.vres_lambda", std::move(lambdas), false);
    }
    add(p + "mlp_norm.weight", {d}, ParamKind::norm_weight);
    add(p + "mlp.w_gate.weight", {h, d}, ParamKind::matrix, std_matrix);
    add(p + "mlp.w_up.weight", {h, d}, ParamKind::matrix, std_matrix);
    add(p + "mlp.w_down.weight", {d, h}, ParamKind::matrix, std_out);
    add_trunk_params(*this, c, ParamPlace::layer_end, i);
  }
  add_trunk_params(*this, c, ParamPlace::after_layers, -1);
  if (c.residual == ResidualMode::mudd) add_mudd(c);
  add("final_norm.weight", {d}, ParamKind::norm_weight);
  if (!c.tie_embeddings) add("lm_head.weight", {V, d}, ParamKind::matrix, std_matrix);
}

// MUDD's DA modules (baselines-spec §2.1-2.2, names §6.6): at initialisation every stream is the
// block output, so the model computes prenorm's function bit for bit. Only W1 draws from the RNG
// (its own stream, by name); W2, a and the norms are fixed values.
void ParamLayout::add_mudd(const ModelConfig& c) {
  const std::int64_t d = c.d_model;
  const bool decay = c.mudd_decay_all;
  auto set_decay = [&](bool on) { params_.back().decay = on; };
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "mudd." + std::to_string(i) + ".";
    const int C = c.mudd_da_ways(i), S = c.mudd_da_sources(i), K = c.mudd_da_hidden(i);
    if (c.mudd_dynamic) {
      add(p + "w1", {K, d}, ParamKind::matrix, 1.0 / std::sqrt(static_cast<double>(d)));  // N(0, 1/d)
      add_fixed(p + "w2", std::vector<double>(static_cast<std::size_t>(C * S * K), 0.0), true, {C * S, K});
    }
    // a: the block output (the last source) in every way (base); zero with PrePostDANorm, whose
    // streams are x + the mix.
    std::vector<double> a(static_cast<std::size_t>(C * S), 0.0);
    if (!c.mudd_prepost_norm)
      for (int w = 0; w < C; ++w) a[static_cast<std::size_t>(w * S + S - 1)] = 1.0;
    add_fixed(p + "a", std::move(a), decay, {C, S});
    if (c.mudd_prepost_norm) {
      if (c.mudd_dynamic) {
        add(p + "gen_norm.weight", {d}, ParamKind::norm_weight);
        set_decay(decay);
      }
      add_fixed(p + "post_norm.weight", std::vector<double>(static_cast<std::size_t>(d), 1e-3), decay);
    }
  }
  if (c.mudd_prepost_norm)
    for (int s = 0; s <= c.n_layers; ++s) {
      add("mudd.src_norm." + std::to_string(s) + ".weight", {d}, ParamKind::norm_weight);
      set_decay(decay);
    }
}

void ParamLayout::add(std::string name, std::vector<std::int64_t> shape, ParamKind kind, double init_std) {
  ParamInfo info;
  info.name = std::move(name);
  info.numel = 1;
  for (auto s : shape) info.numel *= s;
  info.shape = std::move(shape);
  info.offset = total_;
  info.kind = kind;
  info.init_std = init_std;
  info.decay = kind == ParamKind::matrix;
  total_ += info.numel;
  params_.push_back(std::move(info));
}

void ParamLayout::add_fixed(std::string name, std::vector<double> values, bool decay,
                            std::vector<std::int64_t> shape) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
  add(std::move(name), std::move(shape), ParamKind::fixed);
  require(params_.back().numel == static_cast<std::int64_t>(values.size()), "add_fixed: shape mismatch");
  params_.back().init_values = std::move(values);
  params_.back().decay = decay;
}

const ParamInfo* ParamLayout::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParamLayout::at(const std::string& name) const {
  const ParamInfo* p = find(name);
  if (p == nullptr) fail("model has no parameter '", name, "'");
  return *p;
}

template <class Real>
void init_params(const ParamLayout& layout, std::uint64_t seed, std::span<Real> params, double perturbation) {
  require(static_cast<std::int64_t>(params.size()) == layout.total(), "init_params: buffer size mismatch");
  for (const auto& p : layout.params()) {
    Real* out = params.data() + p.offset;
    switch (p.kind) {
      case ParamKind::matrix: {
        if (p.init_std == 0) {  // (mHC's phi = 0) exact zeros, no draws
          for (std::int64_t i = 0; i < p.numel; ++i) out[i] = Real(0);
          break;
        }
        Rng rng(seed, p.name);
        for (std::int64_t i = 0; i < p.numel; ++i) out[i] = static_cast<Real>(rng.normal() * p.init_std);
        break;
      }
      case ParamKind::norm_weight:
        for (std::int64_t i = 0; i < p.numel; ++i) out[i] = Real(1);
        break;
      case ParamKind::query:
        for (std::int64_t i = 0; i < p.numel; ++i) out[i] = Real(0);
        break;
      case ParamKind::fixed:
        for (std::int64_t i = 0; i < p.numel; ++i) out[i] = static_cast<Real>(p.init_values[static_cast<std::size_t>(i)]);
        break;
    }
    if (perturbation > 0) {
      Rng twin(seed, "twin:" + p.name);
      for (std::int64_t i = 0; i < p.numel; ++i)
        out[i] = static_cast<Real>(static_cast<double>(out[i]) * (1.0 + perturbation * twin.normal()));
    }
  }
}

template void init_params<float>(const ParamLayout&, std::uint64_t, std::span<float>, double);
template void init_params<double>(const ParamLayout&, std::uint64_t, std::span<double>, double);

}  // namespace attnres
