// The depth diagnostics of the n-stream modes (hc, mhc; baselines-spec §6.5) from their mixing
// coefficients, one token at a time. A token's coefficients are those of every sublayer in turn,
// each in the layout the model saves them (kernels/streams.hpp): alpha [n, n+1] row-major, then
// beta [n], n(n+2) values, where
//   alpha[i, 0]    stream i's weight in the sublayer's read      HC: A_m      mHC: H_pre
//   alpha[i, k+1]  stream i's weight in the new stream k          HC: A_r      mHC: H_res^T
//   beta[k]        the sublayer output's weight in new stream k   HC: B        mHC: H_post
// (the spec's correspondence H_pre ≅ A_m^T, H_post ≅ B, H_res ≅ A_r^T). The write maps the streams
// by R with R[k, i] = alpha[i, k+1]: new stream k = sum_i R[k, i] H_i + beta_k y. R is mHC's H_res
// and HC's A_r^T, the matrix whose products the Amax gain measures.
//
// Both sums below allocate when made and not per token, so the evaluation loop does not.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/diagnostics.hpp"

namespace attnres {

// A matrix's gains (MHC-P §3.1): forward = the largest absolute row sum max_i |sum_j M_ij|,
// backward = the largest absolute column sum max_j |sum_i M_ij|.
struct Gain {
  double forward = 0, backward = 0;
};
Gain amax_gain(std::span<const double> matrix, int n);  // row-major n x n

// The unfolded dense connections (HC-P §4.5 eq. 27) averaged over tokens: how much of each
// earlier output reaches each sublayer's input, per token c_kj = B_j (R_{k-1} ... R_{j+1}) A_m^k
// with that token's coefficients in every sublayer (j: the source, k: the target). Rows as
// result.json records them (Connections): targets the sublayers 0 .. n_sublayers - 1
// and the exit n_sublayers; source 0 is the embedding (every stream's copy enters with weight 1),
// source s > 0 the output of sublayer s - 1.
class UnfoldedConnections {
 public:
  // readout_scale: the exit's weight per stream (1: the sum, 1/n: the mean).
  UnfoldedConnections(int n, int n_sublayers, double readout_scale);
  void add(std::span<const double> coefficients);  // one token: n_sublayers x n(n+2) values
  Connections mean(const std::string& name) const;  // over the tokens added (at least one)

 private:
  int n_, sublayers_;
  double readout_scale_;
  std::vector<double> sum_;      // row k (target k) holds sources 0..k, from k(k+1)/2 on
  std::vector<double> carried_;  // [n_sublayers + 1][n]: each source's weight in the current streams
  std::vector<double> next_;     // [n]
  std::int64_t tokens_ = 0;
};

// The Amax gains over tokens (AmaxGain): per token the composite P = R_{L-1} ... R_0
// over all L sublayers and its gains, and each single R_j's.
class AmaxGainSum {
 public:
  AmaxGainSum(int n, int n_sublayers);
  void add(std::span<const double> coefficients);  // one token, as UnfoldedConnections::add
  AmaxGain result() const;                // over the tokens added (at least one)

 private:
  int n_, sublayers_;
  std::vector<double> r_, product_, next_;  // [n, n] each
  AmaxGain g_;                     // means as sums until result()
  std::int64_t tokens_ = 0;
};

}  // namespace attnres
