// Token embedding lookup and its scatter-add backward.
#pragma once

#include <cstdint>

namespace attnres::kernels {

template <class Real>
void embedding_forward(Real* out, const std::int32_t* tokens, const Real* table, std::int64_t n, int d);

// dtable[tokens[t]] += dout[t]; threads split the columns, so the sum order is fixed.
template <class Real>
void embedding_backward(Real* dtable, const std::int32_t* tokens, const Real* dout, std::int64_t n, int d);

}  // namespace attnres::kernels
