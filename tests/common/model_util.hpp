// Tiny model configurations and random weights for model-level tests.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "model/arms.hpp"
#include "model/config.hpp"
#include "model/model.hpp"
#include "util/rng.hpp"

namespace attnres::testing {

struct Variant {
  std::string name;
  ResidualMode residual;
  ValueRoute route = ValueRoute::decoupled;
  int dwa_dilation = 1, dwa_period = 1;  // denseformer
  bool value_residual = false;
  kernels::VresMode vres_mode = kernels::VresMode::fixed;
  // hc, mhc: the streams, HC's dynamic part and tanh, mHC's Sinkhorn order, the readout.
  int n_streams = 2;
  bool hc_dynamic = true, hc_tanh = true;
  kernels::SinkhornOrder sinkhorn_order = kernels::SinkhornOrder::col_row;
  StreamReadout readout = StreamReadout::sum;
  // mudd
  MuddWays mudd_ways = MuddWays::qkvr;
  bool mudd_dynamic = true;
  kernels::Gelu mudd_gelu = kernels::Gelu::erf;
  bool mudd_prepost_norm = false;
  bool mudd_sep_qkv_norm = true;
  // delta, delta_block (docs/delta-gated-spec.md §1)
  kernels::DeltaGate delta_gate = kernels::DeltaGate::none;
  bool delta_null_source = false;
  DeltaValueRoute delta_value_route = DeltaValueRoute::none;
  bool delta_block_partial = true;
  // gr: n_streams branches, the read gate's rank (0: d_model / 8)
  int gr_rank = 0;
  bool gr_decay_norm = false;

  // The variant's settings on a base configuration.
  ModelConfig apply(ModelConfig c) const {
    if (residual == ResidualMode::hc) {
      c.hc_n = n_streams;
      c.hc_dynamic = hc_dynamic;
      c.hc_tanh = hc_tanh;
      c.hc_reduce = readout;
    }
    if (residual == ResidualMode::mhc) {
      c.mhc_n = n_streams;
      c.mhc_sinkhorn_order = sinkhorn_order;
      c.mhc_reduce = readout;
    }
    if (residual == ResidualMode::gr) {
      c.gr_n = n_streams;
      c.gr_rank = gr_rank;
      c.gr_decay_norm = gr_decay_norm;
    }
    c.residual = residual;
    c.value_route = route;
    c.dwa_dilation = dwa_dilation;
    c.dwa_period = dwa_period;
    c.value_residual = value_residual;
    c.vres_mode = vres_mode;
    c.mudd_ways = mudd_ways;
    c.mudd_dynamic = mudd_dynamic;
    c.mudd_gelu = mudd_gelu;
    c.mudd_prepost_norm = mudd_prepost_norm;
    c.mudd_sep_qkv_norm = mudd_sep_qkv_norm;
    if (residual == ResidualMode::delta || residual == ResidualMode::delta_block) {
      c.delta_gate = delta_gate;
      c.delta_null_source = delta_null_source;
      c.delta_value_route = delta_value_route;
    }
    if (residual == ResidualMode::delta_block) c.delta_block_partial = delta_block_partial;
    return c;
  }
  // The CUDA backend implements the modes whose family record says so (model/family.hpp), with the
  // value residual, and without the options the record's cuda_lacks names.
  bool on_cuda() const { return cuda_refusal(apply(ModelConfig{})).empty(); }
  bool config_uses_streams() const { return residual == ResidualMode::hc || residual == ResidualMode::mhc; }
};

// How GoogleTest shows a Variant (test output, `--gtest_list_tests`, and so the CTest names
// gtest_discover_tests makes): its name, not "88-byte object <80-40 09-AB ...>" (which, holding a
// heap pointer, also changed from one build to the next).
inline void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

inline std::vector<Variant> all_variants() {
  using kernels::VresMode;
  return {{"prenorm", ResidualMode::prenorm},
          {"full", ResidualMode::full},
          {"block", ResidualMode::block},
          {"rd", ResidualMode::rd, ValueRoute::decoupled},
          {"rd_tied", ResidualMode::rd, ValueRoute::tied},
          {"rd_average", ResidualMode::rd, ValueRoute::average},
          {"rd_frozen", ResidualMode::rd, ValueRoute::frozen},
          {"denseformer", ResidualMode::denseformer},
          {"denseformer_2x2", ResidualMode::denseformer, ValueRoute::decoupled, 2, 2},
          {"prenorm_vres", ResidualMode::prenorm, ValueRoute::decoupled, 1, 1, true, VresMode::fixed},
          {"rd_vres_convex", ResidualMode::rd, ValueRoute::decoupled, 1, 1, true, VresMode::learned_convex},
          {"denseformer_vres_pair", ResidualMode::denseformer, ValueRoute::decoupled, 1, 1, true,
           VresMode::learned_pair},
          // Hyper-connections and mHC with few streams (n = 2, 3) to keep the checks fast.
          {.name = "hc", .residual = ResidualMode::hc, .n_streams = 3},
          {.name = "hc_static", .residual = ResidualMode::hc, .n_streams = 2, .hc_dynamic = false},
          {.name = "hc_no_tanh", .residual = ResidualMode::hc, .n_streams = 3, .hc_tanh = false},
          {.name = "hc_vres_pair", .residual = ResidualMode::hc, .value_residual = true,
           .vres_mode = VresMode::learned_pair, .n_streams = 2},
          {.name = "mhc", .residual = ResidualMode::mhc, .n_streams = 3},
          {.name = "mhc_row_col_mean", .residual = ResidualMode::mhc, .n_streams = 2,
           .sinkhorn_order = kernels::SinkhornOrder::row_col, .readout = StreamReadout::mean},
          // MUDD (the official defaults unless said otherwise).
          {.name = "mudd", .residual = ResidualMode::mudd},
          {.name = "mudd_tanh", .residual = ResidualMode::mudd, .mudd_gelu = kernels::Gelu::tanh},
          {.name = "mudd_static", .residual = ResidualMode::mudd, .mudd_dynamic = false},
          {.name = "mudd_r", .residual = ResidualMode::mudd, .mudd_ways = MuddWays::r},
          {.name = "mudd_prepost", .residual = ResidualMode::mudd, .mudd_prepost_norm = true},
          {.name = "mudd_prepost_static", .residual = ResidualMode::mudd, .mudd_dynamic = false,
           .mudd_prepost_norm = true},
          {.name = "mudd_vres", .residual = ResidualMode::mudd, .value_residual = true},
          {.name = "mudd_one_norm", .residual = ResidualMode::mudd, .mudd_sep_qkv_norm = false},
          // Delta AttnRes: each gate, the null source, the V route, both delta_block schedules.
          {.name = "delta", .residual = ResidualMode::delta},
          {.name = "delta_scalar_null", .residual = ResidualMode::delta,
           .delta_gate = kernels::DeltaGate::sigmoid_scalar, .delta_null_source = true},
          {.name = "delta_vector_vroute", .residual = ResidualMode::delta,
           .delta_gate = kernels::DeltaGate::sigmoid_vector, .delta_value_route = DeltaValueRoute::decoupled},
          {.name = "delta_alpha", .residual = ResidualMode::delta, .delta_gate = kernels::DeltaGate::learnable_alpha},
          {.name = "delta_vroute_vres", .residual = ResidualMode::delta, .value_residual = true,
           .vres_mode = VresMode::learned_pair, .delta_value_route = DeltaValueRoute::decoupled},
          {.name = "delta_block", .residual = ResidualMode::delta_block},
          {.name = "delta_block_vroute_null", .residual = ResidualMode::delta_block,
           .delta_gate = kernels::DeltaGate::sigmoid_scalar, .delta_null_source = true,
           .delta_value_route = DeltaValueRoute::decoupled},
          {.name = "delta_block_released_vector", .residual = ResidualMode::delta_block,
           .delta_gate = kernels::DeltaGate::sigmoid_vector, .delta_block_partial = false},
          {.name = "delta_block_released_alpha_null", .residual = ResidualMode::delta_block,
           .delta_gate = kernels::DeltaGate::learnable_alpha, .delta_null_source = true,
           .delta_value_route = DeltaValueRoute::decoupled, .delta_block_partial = false},
          // The Gated Residual: the default rank (d / 8 = 1 here) and a wider one, with the value residual.
          {.name = "gr", .residual = ResidualMode::gr, .n_streams = 3},
          {.name = "gr_rank3_vres", .residual = ResidualMode::gr, .value_residual = true, .n_streams = 2,
           .gr_rank = 3},
          {.name = "gr_decay_norm", .residual = ResidualMode::gr, .n_streams = 4, .gr_decay_norm = true}};
}

// The variants the CUDA backend runs.
inline std::vector<Variant> cuda_variants() {
  std::vector<Variant> v;
  for (const Variant& x : all_variants())
    if (x.on_cuda()) v.push_back(x);
  return v;
}

inline ModelConfig tiny_config(ResidualMode residual, ValueRoute route = ValueRoute::decoupled, int n_layers = 2,
                               int n_blocks = 2) {
  ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = n_layers;
  c.n_heads = 2;
  c.mlp_hidden = 12;
  c.residual = residual;
  c.n_blocks = n_blocks;
  c.value_route = route;
  c.max_seq_len = 8;
  return c;
}

inline ModelConfig tiny_config(const Variant& v, int n_layers = 2, int n_blocks = 2) {
  return v.apply(tiny_config(v.residual, v.route, n_layers, n_blocks));
}

// Initialises by seed, then perturbs every parameter so no gradient is trivially zero:
// queries and value queries random, norm weights around 1, matrices larger than at init.
struct WeightScales {
  double matrix = 0.3;  // std of matrices
  double norm = 0.2;    // std of norm weights around 1
  double query = 0.5;   // std of pseudo-queries (and of the other fixed-init tensors around their init)
  // std of MUDD's fixed-init tensors (W2, a, the post norm) around their init: W2 feeds K products
  // into every mixing weight, so a large one makes the streams random mixes of the sources and
  // the loss badly conditioned (an AdamW trajectory then amplifies rounding about 1e7-fold).
  double mudd = 0.5;
};

template <class Real>
void randomize_weights(Model<Real>& model, std::uint64_t seed, WeightScales scales = {}) {
  init_params<Real>(model.layout(), seed, model.params());
  for (const auto& p : model.layout().params()) {
    Rng rng(seed + 1, p.name);
    Real* x = model.params().data() + p.offset;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const double z = rng.normal();
      switch (p.kind) {
        case ParamKind::matrix: x[i] = static_cast<Real>(scales.matrix * z); break;
        case ParamKind::norm_weight: x[i] = static_cast<Real>(1.0 + scales.norm * z); break;
        case ParamKind::query: x[i] = static_cast<Real>(scales.query * z); break;
        case ParamKind::fixed:  // DWA weights, value-residual lambdas, MUDD's: around their init
          x[i] = static_cast<Real>(p.init_values[static_cast<std::size_t>(i)] +
                                   (p.name.rfind("mudd.", 0) == 0 ? scales.mudd : scales.query) * z);
          break;
      }
    }
  }
}

inline std::vector<std::int32_t> random_tokens(int batch, int seq, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(batch * (seq + 1)));
  for (auto& x : t) x = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
  return t;
}

}  // namespace attnres::testing
