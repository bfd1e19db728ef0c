#include "bench/flops.hpp"

#include "model/model.hpp"

namespace attnres::bench {

FlopCount training_flops_per_token(const ModelConfig& c, int seq) {
  FlopCount f;
  const double d = c.d_model, F = c.mlp_hidden, L = c.n_layers, V = c.vocab_size;
  f.dense = 6 * L * (4 * d * d + 3 * d * F);
  f.lm_head = 6 * V * d;
  f.attention = 6 * L * d * (double(seq) + 1);
  for (const ReadPlan& p : make_read_plans(c)) {
    const int with_query = p.n_routes - (p.uniform_value ? 1 : 0);
    const int outputs = p.average ? 1 : p.n_routes;
    f.depth_reads += 6 * double(p.sources.size()) * d * (1 + with_query + outputs);
  }
  if (c.residual == ResidualMode::mudd)
    for (int i = 0; i < c.n_layers; ++i) {  // baselines-spec §2.4: generator, then the mix
      const double cs = double(c.mudd_da_ways(i)) * c.mudd_da_sources(i);
      const double K = c.mudd_dynamic ? c.mudd_da_hidden(i) : 0;
      f.depth_reads += 6 * (d * K + K * cs + cs * d);
    }
  if (c.uses_streams()) {
    // baselines-spec §3.3 and §4.3: the forward FLOPs of one stream module, in every sublayer, and
    // the exit's sum of the n streams; x3 for forward and backward.
    const double n = c.n_streams();
    double module = 0;
    if (c.residual == ResidualMode::hc)
      module = c.hc_dynamic ? 4 * n * d * (n + 3) : 2 * n * d * (n + 2);
    else
      module = 2 * n * d * (n * n + 2 * n) + 2 * n * n * d + 7 * n * d + 4 * n * n * c.mhc_sinkhorn_iters;
    f.depth_reads += 3 * (c.n_sublayers() * module + 2 * (n - 1) * d);
  }
  return f;
}

}  // namespace attnres::bench
