// Named views into a flat buffer laid out by ParamLayout (parameters or their gradients): the
// model's own tensors and the depth reads' (which the CUDA backend shares); the other families bind
// theirs in their trunks (model/trunk.hpp). Tensors a mode does not have are null.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/param_layout.hpp"

namespace attnres {

template <class Real>
struct LayerWeights {
  Real* attn_norm = nullptr;  // MUDD qkvr: the Q input's norm (the K and V inputs': mudd_trunk.cpp)
  Real* wq = nullptr;
  Real* wk = nullptr;
  Real* wv = nullptr;
  Real* wo = nullptr;
  Real* mlp_norm = nullptr;
  Real* w_gate = nullptr;
  Real* w_up = nullptr;
  Real* w_down = nullptr;
  Real* attn_query = nullptr;
  Real* attn_key_norm = nullptr;
  Real* attn_value_query = nullptr;
  Real* mlp_query = nullptr;
  Real* mlp_key_norm = nullptr;
  Real* vres_lambda = nullptr;  // value_residual with learned lambdas, layers >= 1
};

template <class Real>
struct ModelWeights {
  Real* tok_emb = nullptr;
  std::vector<LayerWeights<Real>> layers;
  Real* final_query = nullptr;
  Real* final_key_norm = nullptr;
  Real* final_norm = nullptr;
  Real* lm_head = nullptr;  // tok_emb when the embeddings are tied
};

// The tensor `name` in a flat buffer laid out by `layout` (parameters or their gradients); null when
// the layout has no such tensor or the buffer is empty (a model without gradients).
template <class Real>
Real* param_view(const ParamLayout& layout, std::span<Real> flat, const std::string& name) {
  const ParamInfo* p = layout.find(name);
  return p == nullptr || flat.empty() ? nullptr : flat.data() + p->offset;
}

template <class Real>
ModelWeights<Real> bind_weights(const ModelConfig& config, const ParamLayout& layout, std::span<Real> flat) {
  auto get = [&](const std::string& name) -> Real* {
    const ParamInfo* p = layout.find(name);
    return p == nullptr ? nullptr : flat.data() + p->offset;
  };
  ModelWeights<Real> w;
  w.tok_emb = get("tok_emb.weight");
  for (int i = 0; i < config.n_layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights<Real> l;
    l.attn_norm = get(p + "attn_norm.weight");
    l.wq = get(p + "attn.wq.weight");
    l.wk = get(p + "attn.wk.weight");
    l.wv = get(p + "attn.wv.weight");
    l.wo = get(p + "attn.wo.weight");
    l.mlp_norm = get(p + "mlp_norm.weight");
    l.w_gate = get(p + "mlp.w_gate.weight");
    l.w_up = get(p + "mlp.w_up.weight");
    l.w_down = get(p + "mlp.w_down.weight");
    l.attn_query = get(p + "attn_res.query");
    l.attn_key_norm = get(p + "attn_res.key_norm.weight");
    l.attn_value_query = get(p + "attn_res.value_query");
    l.mlp_query = get(p + "mlp_res.query");
    l.mlp_key_norm = get(p + "mlp_res.key_norm.weight");
    l.vres_lambda = get(p + "attn.vres_lambda");
    w.layers.push_back(l);
  }
  w.final_query = get("final_res.query");
  w.final_key_norm = get("final_res.key_norm.weight");
  w.final_norm = get("final_norm.weight");
  w.lm_head = config.tie_embeddings ? w.tok_emb : get("lm_head.weight");
  return w;
}

}  // namespace attnres
