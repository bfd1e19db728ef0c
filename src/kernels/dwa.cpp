#include "kernels/dwa.hpp"

#include <algorithm>

#include "kernels/depth_read.hpp"
#include "kernels/reduce.hpp"
#include "kernels/row_ops.hpp"
#include "util/error.hpp"
#include "util/threads.hpp"

namespace attnres::kernels {

std::int64_t dwa_scratch_size(std::int64_t n_tok, int n_sources) { return num_chunks(n_tok) * n_sources; }

template <class Real>
void dwa_forward(const Dwa<Real>& dwa, Real* out) {
  const int n = dwa.n_sources, d = dwa.d;
  require(n >= 1 && n <= kMaxSources, "a DWA needs 1 to ", kMaxSources, " sources, got ", n);
#pragma omp parallel for schedule(static) if (dwa.n_tok * d * n >= kParallelMin)
  for (std::int64_t t = 0; t < dwa.n_tok; ++t) {
    const Real* v[kMaxSources];
    for (int s = 0; s < n; ++s) v[s] = dwa.sources[s] + t * d;
    Real* h = out + t * d;
    mix_rows(1, &h, v, dwa.alpha, n, n, d);
  }
}

template <class Real>
void dwa_backward(const Dwa<Real>& dwa, const Real* dout, Real* const* dsources, Real* dalpha, Real* scratch) {
  const int n = dwa.n_sources, d = dwa.d;
  const std::int64_t chunks = num_chunks(dwa.n_tok);
#pragma omp parallel for schedule(static) if (dwa.n_tok * d * n >= kParallelMin)
  for (std::int64_t ch = 0; ch < chunks; ++ch) {
    Real* acc = scratch + ch * n;
    std::fill(acc, acc + n, Real(0));
    const std::int64_t t_end = std::min(dwa.n_tok, (ch + 1) * kReduceChunk);
    for (std::int64_t t = ch * kReduceChunk; t < t_end; ++t) {
      const Real* v[kMaxSources];
      Real* dv[kMaxSources];
      for (int s = 0; s < n; ++s) {
        v[s] = dwa.sources[s] + t * d;
        dv[s] = dsources[s] + t * d;
      }
      const Real* g = dout + t * d;
      Real c[kMaxSources];
      dots(n, g, v, d, c);
      for (int s = 0; s < n; ++s) acc[s] += c[s];
      // dv_s += alpha_s g: n outputs from the one input row g.
      mix_rows<true>(n, dv, &g, dwa.alpha, 1, 1, d);
    }
  }
  sum_chunks_into(dalpha, scratch, chunks, n);
}

bool dwa_after_block(int block, int period) { return block >= 1 && period >= 1 && block % period == 0; }

std::vector<int> dwa_sources(int block, int dilation, int period) {
  require(dilation >= 1 && period >= 1, "DWA dilation and period must be >= 1 (got ", dilation, ", ", period, ")");
  std::vector<int> s;
  if (!dwa_after_block(block, period)) return s;
  for (int j = block % dilation; j <= block; j += dilation) s.push_back(j);
  return s;
}

std::int64_t dwa_parameter_count(int n_blocks, int dilation, int period) {
  std::int64_t n = 0;
  for (int i = 1; i <= n_blocks; ++i) n += static_cast<std::int64_t>(dwa_sources(i, dilation, period).size());
  return n;
}

template void dwa_forward<float>(const Dwa<float>&, float*);
template void dwa_forward<double>(const Dwa<double>&, double*);
template void dwa_backward<float>(const Dwa<float>&, const float*, float* const*, float*, float*);
template void dwa_backward<double>(const Dwa<double>&, const double*, double* const*, double*, double*);

}  // namespace attnres::kernels
