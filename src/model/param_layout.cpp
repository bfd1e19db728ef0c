#include "model/param_layout.hpp"

#include <cmath>

#include "model/family.hpp"
#include "model/trunk.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace attnres {

ParamLayout::ParamLayout(const ModelConfig& c) {
  c.validate();
  const std::int64_t d = c.d_model, h = c.mlp_hidden, V = c.vocab_size;
  const double std_matrix = 0.02;
  const double std_out = 0.02 / std::sqrt(2.0 * c.n_layers);  // residual-writing projections
  const bool norms = has_model_norms(c);  // gr's reads replace the pre-norms and the final norm
  add("tok_emb.weight", {V, d}, ParamKind::matrix, std_matrix);
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    if (norms) add(p + "attn_norm.weight", {d}, ParamKind::norm_weight);  // MUDD qkvr: Q's
    add_trunk_params(*this, c, ParamPlace::attention_norm, i);
    add(p + "attn.wq.weight", {d, d}, ParamKind::matrix, std_matrix);
    add(p + "attn.wk.weight", {d, d}, ParamKind::matrix, std_matrix);
    add(p + "attn.wv.weight", {d, d}, ParamKind::matrix, std_matrix);
    add(p + "attn.wo.weight", {d, d}, ParamKind::matrix, std_out);
    if (i >= 1 && c.vres_parameters() > 0) {  // the first attention layer keeps its own values
      std::vector<double> lambdas = {c.vres_lambda1, c.vres_lambda2};
      lambdas.resize(static_cast<std::size_t>(c.vres_parameters()));
      add_fixed(p + "attn.vres_lambda", std::move(lambdas), false);
    }
    if (norms) add(p + "mlp_norm.weight", {d}, ParamKind::norm_weight);
    add(p + "mlp.w_gate.weight", {h, d}, ParamKind::matrix, std_matrix);
    add(p + "mlp.w_up.weight", {h, d}, ParamKind::matrix, std_matrix);
    add(p + "mlp.w_down.weight", {d, h}, ParamKind::matrix, std_out);
    add_trunk_params(*this, c, ParamPlace::layer_end, i);
  }
  add_trunk_params(*this, c, ParamPlace::after_layers, -1);
  if (norms) add("final_norm.weight", {d}, ParamKind::norm_weight);
  if (!c.tie_embeddings) add("lm_head.weight", {V, d}, ParamKind::matrix, std_matrix);
}

ParamInfo& ParamLayout::add(std::string name, std::vector<std::int64_t> shape, ParamKind kind, double init_std) {
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
  return params_.back();
}

ParamInfo& ParamLayout::add_fixed(std::string name, std::vector<double> values, bool decay,
                                  std::vector<std::int64_t> shape) {
  if (shape.empty()) shape = {static_cast<std::int64_t>(values.size())};
  add(std::move(name), std::move(shape), ParamKind::fixed);
  require(params_.back().numel == static_cast<std::int64_t>(values.size()), "add_fixed: shape mismatch");
  params_.back().init_values = std::move(values);
  params_.back().decay = decay;
  return params_.back();
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
