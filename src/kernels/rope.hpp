// Rotary position embedding, rotate-half convention (Llama / Hugging Face): inside each
// head, dimension i pairs with i + head_dim/2, rotated by position * theta^(-2i/head_dim).
#pragma once

#include <cstdint>

namespace attnres::kernels {

// cos, sin: [max_pos, head_dim/2], computed in double then rounded.
template <class Real>
void rope_tables(Real* cos, Real* sin, int max_pos, int head_dim, double theta);

// In place on x [rows, n_heads*head_dim]; row r has position pos0 + r % seq_len.
template <class Real>
void rope_forward(Real* x, std::int64_t rows, int seq_len, int pos0, int n_heads, int head_dim, const Real* cos,
                  const Real* sin);

// In place: the transpose (inverse) rotation applied to a gradient.
template <class Real>
void rope_backward(Real* dx, std::int64_t rows, int seq_len, int pos0, int n_heads, int head_dim, const Real* cos,
                   const Real* sin);

}  // namespace attnres::kernels
