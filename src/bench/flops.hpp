// The model FLOPs of one training step, per token: the one count that `attnres bench`, the GPU
// check (tests/gpu/check_main.cpp) and reports use for model FLOP utilisation. It needs only the
// model configuration (library attnres_flops; no kernels). docs/performance.md explains the terms.
#pragma once

#include "model/config.hpp"

namespace attnres::bench {

// Convention (forward + backward = 3 x forward, every multiply-add = 2 FLOPs):
//   dense       6 * n_layers * (4 d^2 + 3 d F)       Q, K, V, O and the SwiGLU matrices
//   lm_head     6 * V * d                            logits and both of their gradients
//   attention   6 * n_layers * d * (T + 1)           causal: query t meets t+1 keys, mean (T+1)/2;
//                                                    QK^T and PV each 2 d per key, x3 for training
//   depth_reads 6 * sum over reads of n_s * d * (1 + Z + M)  per source: its RMS (2 d), a logit dot
//                                                    (2 d) for each of the Z routes with a query, a
//                                                    mix (2 d) for each of the M outputs; x3
//               mudd: 6 * sum over DA modules of (d K + K C S + C S d)  generator (W1, W2; none when
//                                                    static) and the C-way mix of S sources
//               hc, mhc: 3 * (2 L m + 2 (n-1) d)     one module per sublayer (baselines-spec §3.3,
//                                                    §4.3), m forward FLOPs each, and the exit's
//                                                    sum of the n streams; with n streams:
//                 static HC   m = 2 n d (n+2)        the read and the write (width 2n(n+1)d, depth 2nd)
//                 dynamic HC  m = 4 n d (n+3)        adds the projections 2nd(n+2) and row norms 4nd
//                 mHC         m = 2nd(n²+2n) + 2n²d + 7nd + 4n² t_max   the projection phi, the
//                                                    H_res mix, read, H_post write and norm, Sinkhorn
//               gr: 3 * (2L (4ndr + 2n²d + 8nd) + 4ndr + 6nd)   per sublayer module W_down and W_up
//                                                    (4ndr), W_inject (2n²d), branch norms, gated mean and
//                                                    write (8nd); the final mixer without the write
//                                                    (docs/delta-gated-spec.md §2.6; r the gate's rank)
// Not counted: embedding lookup, norms (except dynamic HC's row norms and mHC's flattened one, part
// of the spec's module counts), RoPE, SwiGLU's pointwise part, softmaxes, AdamW.
struct FlopCount {
  double dense = 0, lm_head = 0, attention = 0, depth_reads = 0;
  double total() const { return dense + lm_head + attention + depth_reads; }
};

FlopCount training_flops_per_token(const ModelConfig& config, int seq);

}  // namespace attnres::bench
