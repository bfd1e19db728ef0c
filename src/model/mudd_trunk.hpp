// The MUDDFormer trunk class, shared by its two files: model/mudd_trunk.cpp (parameters, buffers,
// forward and backward) and model/mudd_diagnostics.cpp (the depth view: per-token DA weights, the
// source norms, the routes and the connections). Only those two include it, and cuda_model_mudd.cpp
// for the bindings; everything else sees the trunk through model/trunk.hpp.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/mudd.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/model.hpp"
#include "model/trunk.hpp"

namespace attnres::mudd {

namespace k = kernels;


// One DA module's tensors (baselines-spec §2), in the parameters or in their gradients; null where
// the variant has none.
template <class Real>
struct DaWeights {
  Real* w1 = nullptr;         // [K, d]; null: static
  Real* w2 = nullptr;         // [C*S, K]
  Real* a = nullptr;          // [C, S]
  Real* gen_norm = nullptr;   // PrePostDANorm (dynamic)
  Real* post_norm = nullptr;  // PrePostDANorm
};

template <class Real>
std::vector<DaWeights<Real>> bind_da_modules(const ModelConfig& c, const ParamLayout& layout, std::span<Real> flat) {
  std::vector<DaWeights<Real>> out;
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "mudd." + std::to_string(i) + ".";
    out.push_back({param_view(layout, flat, p + "w1"), param_view(layout, flat, p + "w2"),
                   param_view(layout, flat, p + "a"), param_view(layout, flat, p + "gen_norm.weight"),
                   param_view(layout, flat, p + "post_norm.weight")});
  }
  return out;
}

// The tensors named prefix{i}suffix for i in [0, n) (null where absent).
template <class Real>
std::vector<Real*> bind_each(const ParamLayout& layout, std::span<Real> flat, const std::string& prefix, int n,
                             const std::string& suffix) {
  std::vector<Real*> out;
  for (int i = 0; i < n; ++i) out.push_back(param_view(layout, flat, prefix + std::to_string(i) + suffix));
  return out;
}

// The three attention input norms of block i (one weight for all with mudd_sep_qkv_norm = false).
template <class Real>
std::array<Real*, 3> attention_norms(int i, const ModelWeights<Real>& w, const std::vector<Real*>& k_norm,
                                     const std::vector<Real*>& v_norm) {
  const auto b = static_cast<std::size_t>(i);
  Real* q = w.layers[b].attn_norm;
  return {q, k_norm[b] != nullptr ? k_norm[b] : q, v_norm[b] != nullptr ? v_norm[b] : q};
}

template <class Real>
class MuddTrunk final : public Trunk<Real> {
 public:
  explicit MuddTrunk(const ModelParts<Real>& parts)
      : p_(parts),
        da_w_(bind_da_modules(parts.config, parts.layout, parts.params)),
        da_g_(bind_da_modules(parts.config, parts.layout, parts.grads)),
        src_norm_w_(bind_each(parts.layout, parts.params, "mudd.src_norm.", parts.config.n_layers + 1, ".weight")),
        src_norm_g_(bind_each(parts.layout, parts.grads, "mudd.src_norm.", parts.config.n_layers + 1, ".weight")),
        k_norm_w_(bind_each(parts.layout, parts.params, "layers.", parts.config.n_layers, ".attn_norm_k.weight")),
        k_norm_g_(bind_each(parts.layout, parts.grads, "layers.", parts.config.n_layers, ".attn_norm_k.weight")),
        v_norm_w_(bind_each(parts.layout, parts.params, "layers.", parts.config.n_layers, ".attn_norm_v.weight")),
        v_norm_g_(bind_each(parts.layout, parts.grads, "layers.", parts.config.n_layers, ".attn_norm_v.weight")),
        sub_(static_cast<std::size_t>(parts.config.n_sublayers())),
        blocks_(static_cast<std::size_t>(parts.config.n_layers)) {}

  void carve(ArenaCarver<Real>& arena, std::int64_t bt) override;
  std::int64_t reduce_scratch(std::int64_t bt) const override {
    return k::rmsnorm_scratch_size(bt, p_.config.d_model);
  }
  const Real* forward(const Pass<Real>& pass) override;
  void backward(const Pass<Real>& pass) override;

  // The depth view: block b's attention reads the Q, K and V ways of DA b-1 (mudd_ways = qkvr; block
  // 0 reads the embedding alone), each token's weights made distributions by
  // mudd_way_distribution; the connections are the ways' weights averaged over tokens.
  std::vector<RoutedInput> routed_inputs() const override {
    std::vector<RoutedInput> out;
    for (int b = 0; b < p_.config.n_layers && p_.config.mudd_multiway(); ++b)
      out.push_back({b, b == 0 ? 1 : p_.config.mudd_da_sources(b - 1), 3});
    return out;
  }
  void route_distributions(int index, std::int64_t token, std::span<double> p) const override;
  std::unique_ptr<MixingSum> mixing_sum() const override;
  std::int64_t tokens() const override { return n_tok_; }

  // Model::mudd_weights and Model::mudd_source_norms.
  void mudd_weights(int da, int way, std::int64_t token, std::span<Real> dw) const;
  void mudd_source_norms(int da, std::int64_t token, std::span<Real> norms) const;

 private:
  // Sublayer j's output: the attention sublayer's is the block's h (the R stream is written
  // straight into it, and attention adds to it), the MLP's the block output X_{b+1}.
  struct Sublayer {
    Real* out = nullptr;
    Real* dout = nullptr;
  };
  // By block b: the raw inputs of its attention's Q, K and V norms (block 0 reads the embedding;
  // mudd_ways = r has one input, in[0]), the normalised K and V inputs (Q's is the attention
  // body's x) and their RMS factors, and what the DA after the block saves: dw, the generator's
  // pre-GELU hidden and its input's RMS factor (dynamic only).
  struct Block {
    Real* in[3] = {nullptr, nullptr, nullptr};
    Real *xk = nullptr, *xv = nullptr, *rstd_k = nullptr, *rstd_v = nullptr;
    Real *dw = nullptr, *hidden = nullptr, *rms = nullptr;
  };

  // The block output X_j (X_0: the embedding) and its gradient.
  const Real* block_output(int j) const {
    return j == 0 ? p_.buffers.emb : sub_[static_cast<std::size_t>(2 * j - 1)].out;
  }
  Real* dblock_output(int j) {
    return j == 0 ? p_.buffers.demb : sub_[static_cast<std::size_t>(2 * j - 1)].dout;
  }
  // DA module i's view for the kernels (`sources` receives its source pointers).
  k::MuddDa<Real> mudd_da(int i, const Real** sources) const;

  const ModelParts<Real> p_;
  std::vector<DaWeights<Real>> da_w_, da_g_;    // by DA module
  std::vector<Real*> src_norm_w_, src_norm_g_;  // PrePostDANorm: X_0..X_{n_layers}'s norms
  std::vector<Real*> k_norm_w_, k_norm_g_, v_norm_w_, v_norm_g_;  // by block (qkvr, mudd_sep_qkv_norm)
  std::vector<Sublayer> sub_;
  std::vector<Block> blocks_;
  // PrePostDANorm: the normalised sources X^_0..X^_L, their RMS factors and their gradients.
  std::vector<Real*> src_, src_rstd_, dsrc_;
  Real* out_ = nullptr;                          // the last DA's R stream: the final norm's input
  Real* scratch_ = nullptr;                      // the DA kernels' (forward and backward)
  Real* din_[3] = {nullptr, nullptr, nullptr};  // gradients of a block's Q, K, V inputs
  Real *dxk_ = nullptr, *dxv_ = nullptr;         // attention's K and V input gradients (qkvr)
  std::int64_t n_tok_ = 0;                       // of the last forward pass
};

template <class Real>
k::MuddDa<Real> MuddTrunk<Real>::mudd_da(int i, const Real** sources) const {
  const DaWeights<Real>& w = da_w_[static_cast<std::size_t>(i)];
  const bool prepost = p_.config.mudd_prepost_norm;
  k::MuddDa<Real> da;
  da.n_sources = p_.config.mudd_da_sources(i);
  for (int j = 0; j < da.n_sources; ++j)
    sources[j] = prepost ? src_[static_cast<std::size_t>(j)] : block_output(j);
  da.sources = sources;
  da.n_ways = p_.config.mudd_da_ways(i);
  da.n_tok = n_tok_;
  da.d = p_.config.d_model;
  da.eps = static_cast<Real>(p_.config.norm_eps);
  da.x = block_output(i + 1);
  da.hidden = p_.config.mudd_dynamic ? p_.config.mudd_da_hidden(i) : 0;
  da.gen_norm = w.gen_norm;
  da.w1 = w.w1;
  da.w2 = w.w2;
  da.gelu = p_.config.mudd_gelu;
  da.a = w.a;
  da.post_norm = w.post_norm;
  return da;
}

}  // namespace attnres::mudd
