// DenseFormer's depth-weighted average (baselines-spec §1): after block i (1-based), when it has
// one, Y_i = sum_j alpha_{i,j} X_j over earlier block outputs (X_0 = the embedding), with plain
// learned scalars (no softmax, any sign). Nothing is saved: the backward reads the sources,
// which the model keeps anyway, and alpha.
#pragma once

#include <cstdint>
#include <vector>

namespace attnres::kernels {

template <class Real>
struct Dwa {
  const Real* const* sources = nullptr;  // n_sources pointers, each [n_tok, d], in alpha's order
  int n_sources = 0;
  std::int64_t n_tok = 0;
  int d = 0;
  const Real* alpha = nullptr;  // [n_sources]
};

// out [n_tok, d] = sum_j alpha_j sources[j], summed in source order (out must not alias a source).
template <class Real>
void dwa_forward(const Dwa<Real>& dwa, Real* out);

// dsources[j] += alpha_j dout; dalpha[j] += sum over tokens of <dout, sources[j]> (in fixed chunk
// order). scratch: dwa_scratch_size.
template <class Real>
void dwa_backward(const Dwa<Real>& dwa, const Real* dout, Real* const* dsources, Real* dalpha, Real* scratch);

std::int64_t dwa_scratch_size(std::int64_t n_tok, int n_sources);

// The k x p schedule (spec §1.1, following the DenseFormer package): block i has a DWA iff
// i % period == 0; it reads X_j for 0 <= j <= i with j = i (mod dilation), increasing j, so
// floor(i / dilation) + 1 sources, the block's own output last. Blocks without one pass X_i on.
bool dwa_after_block(int block, int period);
std::vector<int> dwa_sources(int block, int dilation, int period);  // empty without a DWA

// Parameters of all DWAs of an n_blocks model: sum over DWA blocks of |S_i| (L(L+3)/2 for 1 x 1).
std::int64_t dwa_parameter_count(int n_blocks, int dilation, int period);

}  // namespace attnres::kernels
