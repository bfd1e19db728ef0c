#include "util/threads.hpp"
#include "kernels/cross_entropy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

// First: it includes <immintrin.h> with GCC 12's false-positive warnings silenced (see there).
#include "kernels/avx512_tiles.hpp"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kernels/fast_math.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_bf16.hpp"
#include "kernels/gemm_bf16_avx512.hpp"
#include "kernels/gemm_f32.hpp"

namespace attnres::kernels {

namespace {

// One row of logits: returns lse - row[target]; with a gradient, row becomes
// grad_scale * (softmax(row) - onehot(target)), as exp(row - max) * (grad_scale / sum): one
// exponential per logit (the loss is the same bits as with exp(row - lse) taken again).
template <class Real>
double softmax_row(Real* row, int vocab, std::int32_t target, Real grad_scale, bool with_grad) {
  const Real mx = row_max(row, vocab), at_target = row[target];
  const Real total = exp_shifted(row, vocab, mx, false);
  const Real lse = mx + std::log(total);
  const double loss = static_cast<double>(lse) - static_cast<double>(at_target);
  if (with_grad) {
    const Real scale = grad_scale / total;
#pragma omp simd
    for (int j = 0; j < vocab; ++j) row[j] *= scale;
    row[target] -= grad_scale;
  }
  return loss;
}

#if ATTNRES_AVX512_CODE
// softmax_row on 16 lanes. The maximum and the scaling are the same bits in any width. The sum
// of the exponentials: on 16 lane sums for bf16 models (its own order), or in exp_shifted's order
// for fp32 (exp_shifted_avx512: the same bits as the 8-lane softmax_row, so the avx512 backend
// keeps the avx2 backend's training hashes). Whole steps unmasked, the last one masked (a masked
// store every step is slow on AMD Zen).
template <bool ExpShiftedOrder>
ATTNRES_AVX512_TARGET double softmax_row_avx512(float* row, int vocab, std::int32_t target, float grad_scale,
                                                 bool with_grad) {
  using namespace avx512;
  const int full = vocab / 16 * 16;
  const __mmask16 last = lanes(vocab - full);
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int j = 0; j < full; j += 16) mx = _mm512_max_ps(_mm512_loadu_ps(row + j), mx);
  if (last != 0) mx = _mm512_mask_max_ps(mx, last, _mm512_maskz_loadu_ps(last, row + full), mx);
  const float m = reduce_max(mx), at_target = row[target];
  float total;
  if constexpr (ExpShiftedOrder) {
    total = exp_shifted_avx512(row, vocab, m);
  } else {
    const __m512 shift = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < full; j += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(row + j), shift));
      sum = _mm512_add_ps(sum, e);
      _mm512_storeu_ps(row + j, e);
    }
    if (last != 0) {
      const __m512 e = _mm512_maskz_mov_ps(last, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(last, row + full), shift)));
      sum = _mm512_add_ps(sum, e);
      _mm512_mask_storeu_ps(row + full, last, e);
    }
    total = reduce_add(sum);
  }
  const float lse = m + std::log(total);
  const double loss = static_cast<double>(lse) - static_cast<double>(at_target);
  if (with_grad) {
    const __m512 scale = _mm512_set1_ps(grad_scale / total);
    for (int j = 0; j < full; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), scale));
    if (last != 0)
      _mm512_mask_storeu_ps(row + full, last, _mm512_mul_ps(_mm512_maskz_loadu_ps(last, row + full), scale));
    row[target] -= grad_scale;
  }
  return loss;
}
#endif

// The chunk loop of both precisions: per chunk of rows, the logits, each row's loss (and its
// softmax gradient in place), then dX and dW. Head supplies the three steps.
template <class Real, class Head>
double chunked_cross_entropy(const Head& head, const Real* x, const std::int32_t* targets, std::int64_t n, int d,
                             int vocab, const CrossEntropyScratch<Real>& scratch, Real grad_scale, Real* dx) {
  const bool with_grad = dx != nullptr;
  double total = 0;
  for (std::int64_t r0 = 0; r0 < n; r0 += scratch.rows) {
    const std::int64_t rows = std::min(scratch.rows, n - r0);
    Real* logits = scratch.logits;
    head.logits(logits, x + r0 * d, rows);
#pragma omp parallel for schedule(static) if (rows * vocab >= kParallelMin)
    for (std::int64_t r = 0; r < rows; ++r)
      scratch.row_loss[r] = head.row(logits + r * vocab, targets[r0 + r], grad_scale, with_grad);
    for (std::int64_t r = 0; r < rows; ++r) total += scratch.row_loss[r];
    if (with_grad) head.backward(dx + r0 * d, logits, x + r0 * d, rows);
  }
  return total;
}

// The Linear head in the model's precision (fp32 or double models; Real's own GEMMs).
template <class Real>
struct LinearHead {
  const Real* w;
  Real* dw;
  int d, vocab;
  MatmulPrecision precision;
  void logits(Real* out, const Real* x, std::int64_t rows) const {
    linear_forward(out, x, w, rows, d, vocab, false, precision);
  }
  double row(Real* logits, std::int32_t target, Real grad_scale, bool with_grad) const {
    return softmax_row(logits, vocab, target, grad_scale, with_grad);
  }
  void backward(Real* dx, const Real* dlogits, const Real* x, std::int64_t rows) const {
    linear_backward_input(dx, dlogits, w, rows, d, vocab, false, precision);
    linear_backward_weight(dw, dlogits, x, rows, d, vocab, precision);
  }
};

// fp32 on the own GEMM kernel (kernels/gemm_f32.hpp, AVX2 or AVX-512 tiles): LinearHead's
// products, bit for bit, with the weight packed once per call for the logits and once for dX
// instead of once per chunk.
struct Fp32Head {
  const Fp32PackedB& w_t;  // op(B) = W^T for the logits
  const Fp32PackedB& w_n;  // W for dX
  float* dw;
  int d, vocab;
  bool wide;  // the softmax on 16 lanes (fp32_wide_lanes()): the same bits
  void logits(float* out, const float* x, std::int64_t rows) const {
    gemm_f32_packed(rows, 1.0f, x, d, w_t, false, out, vocab);
  }
  double row(float* logits, std::int32_t target, float grad_scale, bool with_grad) const {
#if ATTNRES_AVX512_CODE
    if (wide) return softmax_row_avx512<true>(logits, vocab, target, grad_scale, with_grad);
#endif
    return softmax_row(logits, vocab, target, grad_scale, with_grad);
  }
  void backward(float* dx, const float* dlogits, const float* x, std::int64_t rows) const {
    gemm_f32_packed(rows, 1.0f, dlogits, vocab, w_n, false, dx, d);
    gemm_f32(true, false, vocab, d, rows, dlogits, vocab, x, d, true, dw, d);
  }
};

double lm_head_cross_entropy_f32(const float* x, const float* w, const std::int32_t* targets, std::int64_t n, int d,
                                 int vocab, const CrossEntropyScratch<float>& scratch, float grad_scale, float* dx,
                                 float* dw) {
  thread_local Fp32PackedB w_t, w_n;
  w_t.pack(true, vocab, d, w, d);
  if (dx != nullptr) w_n.pack(false, d, vocab, w, d);
  const Fp32Head head{w_t, w_n, dw, d, vocab, fp32_wide_lanes()};
  return chunked_cross_entropy(head, x, targets, n, d, vocab, scratch, grad_scale, dx);
}

// bf16 (float models): the three GEMMs on bf16-rounded operands with the weight packed once per
// call for the logits and once for the input gradient (not once per chunk of rows); the softmax
// and its statistics in fp32, on 16 lanes where AVX-512 is available.
struct Bf16Head {
  const Bf16PackedB& w_t;  // op(B) = W^T for the logits
  const Bf16PackedB& w_n;  // W for dX
  float* dw;
  int d, vocab;
  bool wide;  // AVX-512 softmax
  void logits(float* out, const float* x, std::int64_t rows) const {
    gemm_bf16_packed(false, rows, 1.0f, x, d, w_t, 0.0f, out, vocab);
  }
  double row(float* logits, std::int32_t target, float grad_scale, bool with_grad) const {
#if ATTNRES_AVX512_CODE
    if (wide) return softmax_row_avx512<false>(logits, vocab, target, grad_scale, with_grad);
#endif
    return softmax_row(logits, vocab, target, grad_scale, with_grad);
  }
  void backward(float* dx, const float* dlogits, const float* x, std::int64_t rows) const {
    gemm_bf16_packed(false, rows, 1.0f, dlogits, vocab, w_n, 0.0f, dx, d);
    gemm_bf16(true, false, vocab, d, rows, 1.0f, dlogits, vocab, x, d, 1.0f, dw, d);
  }
};

double lm_head_cross_entropy_bf16(const float* x, const float* w, const std::int32_t* targets, std::int64_t n, int d,
                                  int vocab, const CrossEntropyScratch<float>& scratch, float grad_scale, float* dx,
                                  float* dw) {
  thread_local Bf16PackedB w_t, w_n;
  w_t.pack(true, vocab, d, w, d);
  if (dx != nullptr) w_n.pack(false, d, vocab, w, d);
  bool wide = false;
#if ATTNRES_AVX512_CODE
  wide = avx512::cpu_has_avx512();
#endif
  const Bf16Head head{w_t, w_n, dw, d, vocab, wide};
  return chunked_cross_entropy(head, x, targets, n, d, vocab, scratch, grad_scale, dx);
}
}  // namespace

template <class Real>
double lm_head_cross_entropy(const Real* x, const Real* w, const std::int32_t* targets, std::int64_t n, int d,
                             int vocab, const CrossEntropyScratch<Real>& scratch, Real grad_scale, Real* dx,
                             Real* dw, MatmulPrecision precision) {
  if constexpr (std::is_same_v<Real, float>) {
    if (precision == MatmulPrecision::bf16)
      return lm_head_cross_entropy_bf16(x, w, targets, n, d, vocab, scratch, grad_scale, dx, dw);
    if (own_fp32_gemm())
      return lm_head_cross_entropy_f32(x, w, targets, n, d, vocab, scratch, grad_scale, dx, dw);
  }
  const LinearHead<Real> head{w, dw, d, vocab, precision};
  return chunked_cross_entropy(head, x, targets, n, d, vocab, scratch, grad_scale, dx);
}

template double lm_head_cross_entropy<float>(const float*, const float*, const std::int32_t*, std::int64_t, int,
                                             int, const CrossEntropyScratch<float>&, float, float*, float*,
                                             MatmulPrecision);
template double lm_head_cross_entropy<double>(const double*, const double*, const std::int32_t*, std::int64_t, int,
                                              int, const CrossEntropyScratch<double>&, double, double*, double*,
                                              MatmulPrecision);

}  // namespace attnres::kernels
