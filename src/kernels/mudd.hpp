// MUDDFormer's DA module (baselines-spec §2): after block i, C per-token mixes ("ways": Q, K, V, R
// in this order; the last DA has R alone) of the block outputs X_0..X_{i+1}, with weights from a
// small generator on the block output x = X_{i+1}:
//   n = RMSNorm(x) (no weight, or gen_norm), h = n W1^T, dw = GELU(h) W2^T + a  (c-major: dw[c*S+j])
//   x_c = sum_j dw[c, j] X_j
// PrePostDANorm (post_norm set, §2.2): the sources are the normalised X^_j (each source's own norm,
// applied by the caller once and shared by all later DAs), x_c = x + sum_j dw[c,j] X^_j for Q, K, V
// and x_R = x + RMSNorm_post(sum_j dw[R,j] X^_j). Without a generator (w1 == nullptr) dw = a for
// every token (the "static dense" ablation, mudd_dynamic = false).
// Saved per token: dw (C*S), h (K) and the generator's RMS factor; the streams are the next block's
// inputs, which the model keeps. The R stream's pre-norm mix is recomputed in the backward.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace attnres::kernels {

enum class Gelu { erf, tanh };  // exact (released PyTorch code) or the tanh approximation (JAX/flax)
inline constexpr std::array kGelus = {Gelu::erf, Gelu::tanh};
std::string to_string(Gelu kind);

inline constexpr int kMaxWays = 4;

template <class Real>
struct MuddDa {
  const Real* const* sources = nullptr;  // n_sources pointers [n_tok, d]: X_0..X_{S-1}, or X^_j
  int n_sources = 0;                     // S
  int n_ways = kMaxWays;                 // C; the last way is R
  std::int64_t n_tok = 0;
  int d = 0;
  Real eps = 0;
  const Real* x = nullptr;  // the block output X_{S-1} [n_tok, d]: generator input (and PrePost residual)
  // Generator (w1 == nullptr: static, dw = a).
  int hidden = 0;                  // K (mudd_hidden_width)
  const Real* gen_norm = nullptr;  // [d]; nullptr = RMSNorm without weight (base variant)
  const Real* w1 = nullptr;        // [K, d]
  const Real* w2 = nullptr;        // [C*S, K]
  Gelu gelu = Gelu::erf;
  const Real* a = nullptr;          // [C, S]
  const Real* post_norm = nullptr;  // [d]: PrePostDANorm's R-stream norm; nullptr = base variant

  bool dynamic() const { return w1 != nullptr; }
  bool prepost() const { return post_norm != nullptr; }
};

// What the backward reads and accumulates into.
template <class Real>
struct MuddGrads {
  const Real* const* dout = nullptr;  // n_ways pointers [n_tok, d]: the gradients of the streams
  Real* const* dsources = nullptr;    // += per source [n_tok, d] (of X^_j with PrePost)
  Real* dx = nullptr;                 // += [n_tok, d] the generator input's (and PrePost residual's)
                                      // gradient; may be dsources[S-1] (base: x is the last source)
  Real* dw1 = nullptr;                // += [K, d]
  Real* dw2 = nullptr;                // += [C*S, K]
  Real* da = nullptr;                 // += [C, S]
  Real* dgen_norm = nullptr;          // += [d] when gen_norm is set
  Real* dpost_norm = nullptr;         // += [d] when post_norm is set
};

// out: n_ways pointers [n_tok, d] (not aliasing a source or x). dw: [n_tok, C*S], hidden: [n_tok, K],
// rms: [n_tok] (written when dynamic). scratch: mudd_scratch_size.
template <class Real>
void mudd_forward(const MuddDa<Real>& da, Real* const* out, Real* dw, Real* hidden, Real* rms, Real* scratch);

// Parameter gradients are summed over tokens in fixed chunk order (the generator's weight
// gradients by GEMMs over all tokens).
template <class Real>
void mudd_backward(const MuddDa<Real>& da, const Real* dw, const Real* hidden, const Real* rms,
                   const MuddGrads<Real>& grads, Real* scratch);

std::int64_t mudd_scratch_size(std::int64_t n_tok, int d, int n_ways, int n_sources, int hidden);

// The generator's hidden width K for C ways over S sources (spec §2.1): C*S*expand, rounded, when
// round > 0, to the next strictly larger multiple of round ((floor(C*S*expand / round) + 1) * round,
// the official configs' rule: 64 -> 128). expand is mudd_last_expand (4) for the last DA, else 1.
int mudd_hidden_width(int n_ways, int n_sources, int expand, int round);

// GELU and its derivative, as the generator applies them (the first computes both, sharing erf).
template <class Real>
Real gelu_and_derivative(Real h, Gelu kind, Real* derivative);
template <class Real>
Real gelu(Real h, Gelu kind);
template <class Real>
Real gelu_derivative(Real h, Gelu kind);

}  // namespace attnres::kernels
