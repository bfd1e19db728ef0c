// Host-side launchers of the CUDA backend's kernels (src/cuda/*.cu). Every pointer is a device
// pointer; every launch is asynchronous on `stream`. Tensors typed `void*` + DType hold fp32 or
// bf16 (GEMM operands in bf16 mode); everything else is fp32.
//
// Each kernel mirrors one CPU kernel of src/kernels (named at each declaration) and keeps its
// semantics; parameter-gradient reductions over tokens are summed in fixed chunks of 64 tokens
// and then in chunk order, so results do not depend on scheduling (bit-reproducible runs).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/buffer.hpp"
#include "cuda/gemm.hpp"
#include "kernels/delta_read.hpp"
#include "kernels/streams.hpp"
#include "kernels/mudd.hpp"
#include "kernels/value_residual.hpp"

namespace attnres::cuda::kern {

// Tokens per chunk of the deterministic parameter-gradient reductions (kReduceChunk on the CPU).
inline constexpr std::int64_t kChunkTokens = 64;
inline std::int64_t num_chunks(std::int64_t n_tok) { return (n_tok + kChunkTokens - 1) / kChunkTokens; }
// Largest d_model the warp-per-token kernels (norms, depth reads) support.
inline constexpr int kMaxWidth = 2048;

// ---- elementwise and normalisation (ops.cu) ------------------------------------------------

// kernels/embedding: out[t] = table[tokens[t]].
void embedding_forward(float* out, const std::int32_t* tokens, const float* table, std::int64_t n, int d,
                       Stream stream);
// kernels/embedding backward, deterministic: the positions of each distinct token id are added
// into its row in ascending order (the CPU's order). ids[u], starts[u]..starts[u+1] index
// positions[]; built on the host (CudaModel::set_inputs).
void embedding_backward(float* dtable, const std::int32_t* ids, const std::int32_t* starts,
                        const std::int32_t* positions, int n_ids, const float* dout, int d, Stream stream);

// kernels/rmsnorm forward: y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps) (w null: no weight,
// as MUDD's generator norm without one).
void rmsnorm_forward(void* y, DType y_type, float* rstd, const float* x, const float* w, std::int64_t n, int d,
                     float eps, Stream stream);
// kernels/rmsnorm backward: dx = (or += when accumulate) the input gradient; dw += the weight
// gradient (w null: no weight, dw untouched). scratch: rmsnorm_scratch_floats.
void rmsnorm_backward(float* dx, bool accumulate, float* dw, const float* dy, const float* x, const float* w,
                      const float* rstd, std::int64_t n, int d, float* scratch, Stream stream);
std::int64_t rmsnorm_scratch_floats(std::int64_t n, int d);

// kernels/rope (rotate-half), in place on q and, when not null, k [rows, n_heads*head_dim]; row r
// has position r % seq. inverse: the transposed rotation (backward). Issue #49: q and k in one
// launch, 16-byte loads and stores where head_dim and the pointers allow; scalar: one element a
// thread and one launch per tensor, the kernel before (bit-identical results; check (e) times both).
void rope(void* q, void* k, DType type, std::int64_t rows, int seq, int n_heads, int head_dim, const float* cos,
          const float* sin, bool inverse, Stream stream, bool scalar = false);

// kernels/swiglu: act = silu(gate) * up; backward overwrites dgate, dup. Issue #49: 16-byte loads
// and stores when the pointers are 16-byte aligned (a scalar tail); scalar: one element a thread,
// the kernels before (bit-identical results; check (e)).
void swiglu_forward(void* act, const void* gate, const void* up, DType type, std::int64_t n, Stream stream,
                    bool scalar = false);
void swiglu_backward(void* dgate, void* dup, const void* dact, const void* gate, const void* up, DType type,
                     std::int64_t n, Stream stream, bool scalar = false);

// dst += src (fp32).
void add_into(float* dst, const float* src, std::int64_t n, Stream stream);
// x /= divisor (fp32; a true division, as the CPU trainer's micro-batch average).
void divide(float* x, float divisor, std::int64_t n, Stream stream);
// If dst: dst += src. If cast: cast = src rounded to bf16. One pass over src.
void add_and_cast(float* dst, const float* src, void* cast_bf16, std::int64_t n, Stream stream);
// dst (bf16) = src (fp32), round to nearest even.
void cast_to_bf16(void* dst, const float* src, std::int64_t n, Stream stream);
// out[k] += sum over chunks c (ascending, in a fixed order) of partial[c * stride + k], k < width:
// the second stage of the chunked parameter-gradient reductions.
void sum_chunks(float* out, const float* partial, std::int64_t chunks, std::int64_t stride, int width,
                Stream stream);

// kernels/cross_entropy, one chunk of rows: logits [rows, vocab] of logits_type, read with fp32
// math (issue #49: bf16 in bf16 mode, as torch.autocast's LM head writes them; fp32 in fp32 mode,
// the kernel before). row_loss[r] = logsumexp(row) - row[target] (double). When dlogits is not
// null it receives grad_scale * (softmax(row) - onehot(target)) in dlogits_type; it may alias
// logits when the types are the same. bf16 logits move 8 a thread (16-byte loads and stores)
// when vocab % 8 == 0 and the pointers are 16-byte aligned. Every sum has a fixed order.
void cross_entropy(const void* logits, DType logits_type, const std::int32_t* targets, std::int64_t rows, int vocab,
                   double* row_loss, void* dlogits, DType dlogits_type, float grad_scale, Stream stream);
// out[0] = sum of x[0..n) in double, in a fixed order (one block).
void sum_doubles(const double* x, std::int64_t n, double* out, Stream stream);

// ---- optimizer (ops.cu) --------------------------------------------------------------------

// Global gradient norm, torch's clip_grad_norm_ (optim/adamw: clip_grad_norm): partial sums of
// squares in double over chunks of kNormChunk elements, then one block adds them in order and
// writes norm[0] (double) and clip[0] = 1 if clipping applies, clip[1] = the factor (float).
inline constexpr std::int64_t kNormChunk = std::int64_t(1) << 16;
void grad_norm(const float* grads, std::int64_t n, double* partials, double max_norm, double* norm, float* clip,
               Stream stream);

// optim/adamw: torch's AdamW, one fused pass: g = grads * clip factor (when clip[0] != 0; the
// clipped gradient is written back, as clip_grad_norm does on the CPU), then the update. Weight
// decay applies to elements inside the ranges run_begin[i] .. run_end[i] (sorted, disjoint).
// params_bf16 (optional) receives the updated parameters rounded to bf16.
struct AdamWStep {
  float step_size = 0;   // lr / (1 - beta1^t)
  float bias2_sqrt = 0;  // sqrt(1 - beta2^t)
  float decay = 1;       // 1 - lr * weight_decay
  float beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0, eps = 0;
};
void adamw(float* params, float* grads, float* m, float* v, std::int64_t n, const AdamWStep& step, const float* clip,
           const std::int64_t* decay_begin, const std::int64_t* decay_end, int n_decay_ranges, void* params_bf16,
           Stream stream);

// ---- depth reads (depth_read.cu): kernels/depth_read, one warp per token --------------------

struct DepthReadForward {
  const float* const* sources = nullptr;  // device array of n_sources pointers, each [n_tok, d]
  int n_sources = 0;
  std::int64_t n_tok = 0;
  int d = 0;
  float eps = 0;
  const float* gamma = nullptr;  // key-norm weight [d]
  int n_routes = 1;
  const float* queries[2] = {};  // per route; nullptr = uniform route
  bool average = false;          // one output, the mean of the routes' mixes
  float* rms = nullptr;          // [n_tok, n_sources]
  float* logits = nullptr;       // [n_routes, n_tok, n_sources] (uniform routes' rows untouched)
  // Delta AttnRes (kernels/delta_read): h = residual + mix, the stream plus the read, before the
  // norm (null: h = the mix).
  const float* residual = nullptr;
  // Delta AttnRes's options (with residual): the gate, h = residual + g mix on every route, with
  // g = sigmoid(gate_param[0]) (sigmoid_scalar), gate_param[0] (learnable_alpha) or the row
  // gate_param[t] (sigmoid_vector: the gate values [n_tok, d]); mix / mixv (optional) keep route
  // 0's / 1's mix before the gate. gamma1: route 1's own key-norm weight (the V route; null:
  // gamma, which RD's routes share).
  kernels::DeltaGate gate = kernels::DeltaGate::none;
  const float* gate_param = nullptr;
  float* mix = nullptr;
  float* mixv = nullptr;
  const float* gamma1 = nullptr;
  // Route 0 (or the average): the mix h (fp32, kept for the backward) and, fused, its RMSNorm.
  float* h = nullptr;
  const float* norm_w = nullptr;
  void* x = nullptr;
  DType x_type = DType::f32;
  float* rstd = nullptr;
  // Route 1 when it feeds V on its own (rd decoupled / frozen; Delta's V route, whose h_V =
  // residual + g mixv): only its normalised input.
  float* hv = nullptr;  // optional
  void* xv = nullptr;
  float* rstdv = nullptr;
};
void depth_read_forward(const DepthReadForward& a, Stream stream);

// Recomputes route 1 of a read (rd decoupled / frozen) from the saved logits, with the same
// arithmetic as the forward (bit-identical hv): writes hv, xv = RMSNorm(hv), rstdv.
void depth_read_recompute_value(const DepthReadForward& a, Stream stream);

struct DepthReadBackward {
  const float* const* sources = nullptr;
  float* const* dsources = nullptr;  // device array; each += its gradient
  int n_sources = 0;
  std::int64_t n_tok = 0;
  int d = 0;
  const float* gamma = nullptr;
  int n_routes = 1;
  const float* queries[2] = {};
  bool average = false;
  const float* rms = nullptr;
  const float* logits = nullptr;
  const float* dout[2] = {};     // per route (dout[0] alone when average)
  float* dqueries[2] = {};       // += (skipped where null)
  float* dgamma = nullptr;       // +=
  float* scratch = nullptr;      // depth_read_scratch_floats
  // Delta AttnRes's V route: route 1's own key-norm weight and its gradient (null: gamma, dgamma).
  const float* gamma1 = nullptr;
  float* dgamma1 = nullptr;
  // Issue #49: sources [0, n_deferred) (the completed blocks every read of a group shares) get
  // their gradients later, from depth_read_group_backward, in one pass for the whole group; this
  // read leaves their coefficients in coef [n_tok][n_deferred][kDepthReadCoefs] and its chunk
  // partials in scratch, and its query / key-norm gradients are added by the group's call.
  // n_deferred = 0: everything here (the scratch is free again when the call's kernels have run).
  int n_deferred = 0;
  float* coef = nullptr;
};
// Per (token, deferred source): alpha_0, alpha_1 (both times the route's gradient scale),
// delta_0 r_s, delta_1 r_s, r_s^2 (sum_r delta_r z_r) / d.
inline constexpr int kDepthReadCoefs = 5;
void depth_read_backward(const DepthReadBackward& a, Stream stream);
std::int64_t depth_read_scratch_floats(std::int64_t n_tok, int d);

// Issue #49: the reads of one group (consecutive reads of a block, Topology::read_groups), each
// already through depth_read_backward with the same n_deferred > 0, in the order they ran. One
// pass over each shared source adds every read's share of its gradient (the reads in that order,
// the same arithmetic per read as depth_read_backward's immediate sources), then every read's
// query and key-norm gradients are finalised (fixed order: deterministic).
inline constexpr int kMaxReadGroup = 8;
struct DepthReadGroup {
  int n_reads = 0;
  DepthReadBackward reads[kMaxReadGroup];
};
void depth_read_group_backward(const DepthReadGroup& g, Stream stream);

// ---- Delta AttnRes's options (delta.cu): kernels/delta_read's null source and gate -----------
// (The reads themselves are depth_read_forward / depth_read_backward with residual, gate and
// gamma1; the vector gate's two [d, d] products are cuBLASLt GEMMs: cuda_model_delta.cpp.)

// out[t] = v for every token t (the null source: one learned vector per read) [n_tok, d].
void delta_broadcast(float* out, const float* v, std::int64_t n_tok, int d, Stream stream);
// out[k] += sum over tokens t of x[t, k]: per 64-token chunk in token order, then the chunks in
// order (sum_chunks). The null source's and the vector gate's bias gradients. scratch:
// delta_scratch_floats.
void delta_column_sum(float* out, const float* x, std::int64_t n_tok, int d, float* scratch, Stream stream);
std::int64_t delta_scratch_floats(std::int64_t n_tok, int d);
// sigmoid_vector's gate values, in place: g = sigmoid(g + bias) (g holds the GEMM's x W^T).
void delta_gate_vector_forward(float* g, const float* bias, std::int64_t n_tok, int d, Stream stream);
struct DeltaGateBackward {
  kernels::DeltaGate gate = kernels::DeltaGate::none;
  const float* param = nullptr;  // the logit or alpha [1] (the scalar gates)
  const float* g = nullptr;      // sigmoid_vector: the gate values [n_tok, d]
  int n_routes = 1;
  const float* dh[2] = {};  // per route: dL/dh [n_tok, d]
  const float* c[2] = {};   // per route: the mix before the gate [n_tok, d]
  std::int64_t n_tok = 0;
  int d = 0;
};
// The gate's own gradient, from dg = sum_r dh_r c_r (routes in order per element). Scalar gates:
// dparam[0] += its sum over tokens and channels (per 64-token chunk, then the chunks in order),
// times g (1 - g) for sigmoid_scalar. sigmoid_vector: dp (overwritten) = dg g (1 - g), the
// pre-activation's gradient (its bias's, W's and the stream's are the caller's). scratch:
// delta_scratch_floats.
void delta_gate_backward(const DeltaGateBackward& a, float* dparam, float* dp, float* scratch, Stream stream);
// out = g dh, the read's output gradient through the gate (out may not alias dh).
void delta_gate_scale(float* out, const float* dh, const DeltaGateBackward& a, Stream stream);

// ---- DenseFormer (dwa.cu): kernels/dwa --------------------------------------------------------

struct Dwa {
  const float* const* sources = nullptr;  // device array of n_sources pointers, each [n_tok, d], alpha's order
  int n_sources = 0;
  std::int64_t n_tok = 0;
  int d = 0;
  const float* alpha = nullptr;  // [n_sources] (a parameter)
};
// out [n_tok, d] = sum_j alpha_j sources[j] (fused multiply-adds in source order, as the CPU).
void dwa_forward(const Dwa& a, float* out, Stream stream);
// dsources[j] += alpha_j dout (device array of n_sources pointers); dalpha[j] += sum over tokens
// of <dout, sources[j]> (chunked, fixed order). scratch: dwa_scratch_floats.
void dwa_backward(const Dwa& a, const float* dout, float* const* dsources, float* dalpha, float* scratch,
                  Stream stream);
std::int64_t dwa_scratch_floats(std::int64_t n_tok, int n_sources);

// ---- the value residual (value_residual.cu): kernels/value_residual ---------------------------

struct ValueResidual {
  const void* v1 = nullptr;  // [n_tok, d] the first attention sublayer's values (type)
  const void* vn = nullptr;  // [n_tok, d] this sublayer's own values (type)
  DType type = DType::f32;
  std::int64_t n_tok = 0;
  int d = 0;
  kernels::VresMode mode = kernels::VresMode::fixed;
  const float* params = nullptr;  // the layer's attn.vres_lambda (learned modes)
  float constant1 = 0.5f, constant2 = 0.5f;  // vres_mode constant
};
// out (type) = lambda1 v1 + lambda2 vn.
void value_residual_forward(const ValueResidual& a, void* out, Stream stream);
// dv (type, in place): dV' in, lambda2 dV' out (vn's gradient); dv1 (fp32) += lambda1 dV'; in the
// learned modes dparams (the layer's vres_lambda gradient) += the lambdas' gradients (sums over
// tokens in fixed chunk order; null: skipped). scratch: value_residual_scratch_floats.
void value_residual_backward(const ValueResidual& a, void* dv, float* dv1, float* dparams, float* scratch,
                             Stream stream);
std::int64_t value_residual_scratch_floats(std::int64_t n_tok);
// dst (type) += src (fp32), rounded to the type.
void add_fp32(void* dst, DType type, const float* src, std::int64_t n, Stream stream);

// ---- the Gated Residual (gated_residual.cu): kernels/gated_residual ----------------------------
// Branches H [n_tok, n, d] (fp32); a module's norm weight w [n d] (applied as 1 + w); the W_down,
// W_up and W_inject products are cuBLASLt GEMMs between these (CudaModel). Operand-type outputs
// (`type`) feed those GEMMs.

// H[t, i] = emb[t] for every branch (the entry); demb[t] += sum_i dH[t, i] (its backward).
void gr_expand(float* H, const float* emb, std::int64_t n_tok, int n, int d, Stream stream);
void gr_reduce(float* demb, const float* dH, std::int64_t n_tok, int n, int d, Stream stream);
// hn (type) = RMSNorm(H_i) (1 + w_i) per branch; rms [n_tok, n] written when compute_rms, else read.
void gr_norm(void* hn, DType type, float* rms, bool compute_rms, const float* H, const float* w, std::int64_t n_tok,
             int n, int d, float eps, Stream stream);
// p *= scale (in place), a (type) = SiLU(p); count elements.
void gr_silu(void* a, DType type, float* p, std::int64_t count, float scale, Stream stream);
// x (type) [n_tok, d] = (1/n) sum_i sigmoid(q_i) Hn_i, q [n_tok, n d] the read gates' pre-sigmoid.
void gr_mix(void* x, DType type, const float* q, const float* H, const float* rms, const float* w, std::int64_t n_tok,
            int n, int d, Stream stream);
// beta [n_tok, n] = 2 sigmoid(beta / n), in place (W_inject's output in, the write gates out).
void gr_write_gates(float* beta, std::int64_t n_tok, int n, Stream stream);
// out [n_tok, n, d] = H_i + beta_i y (out may alias H).
void gr_write_forward(float* out, const float* H, const float* beta, const float* y, std::int64_t n_tok, int n, int d,
                      Stream stream);
// Given dH = dL/dH': dy (fp32, overwritten) = sum_i beta_i dH_i; ds_n (type) [n_tok, n] = the write
// gates' pre-sigmoid gradient / n, <dH_i, y> beta_i (1 - beta_i / 2) / n.
void gr_write_backward(float* dy, void* ds_n, DType type, const float* dH, const float* y, const float* beta,
                       std::int64_t n_tok, int n, int d, Stream stream);
// Given dx (the sublayer input's gradient): dhn (fp32, overwritten) = G dx / n and dq (type) =
// Hn (dx / n) G (1 - G), G = sigmoid(q).
void gr_gate_backward(float* dhn, void* dq, DType type, const float* q, const float* dx, const float* H,
                      const float* rms, const float* w, std::int64_t n_tok, int n, int d, Stream stream);
// dp (type) = da SiLU'(p) / n.
void gr_silu_backward(void* dp, DType type, const float* da, const float* p, std::int64_t count, int n,
                      Stream stream);
// The branch norm's backward given dhn = dL/dHn: dH += the branches' gradient, dw += the weight's
// (chunked, fixed order). scratch: gr_scratch_floats.
void gr_norm_backward(float* dH, float* dw, const float* dhn, const float* H, const float* rms, const float* w,
                      std::int64_t n_tok, int n, int d, float* scratch, Stream stream);
std::int64_t gr_scratch_floats(std::int64_t n_tok, int n, int d);
// ---- hyper-connections and mHC (streams.cu): kernels/streams, hyper_connection, mhc ----------
// The n-stream state is [n_tok, n, d] fp32; CudaModel runs the modules' projections as GEMMs
// between these kernels (cuda_model_streams.cpp).

inline constexpr int kMaxStreamsGpu = kernels::kMaxStreams;

// kernels::StreamCoefficients: alpha [n, n+1] then beta [n] per token (stride n(n+2)), or shared (0).
struct StreamCoef {
  const float* alpha = nullptr;
  const float* beta = nullptr;
  std::int64_t stride = 0;
};
// kernels/streams: the entry (every stream = scale x), the exit (x = scale sum_k H_k), the write
// out_k = sum_i alpha[i, k+1] H_i + beta_k y and its backward (dy, dbeta [n_tok, n] overwritten).
void stream_expand(float* streams, const float* x, std::int64_t n_tok, int n, int d, float scale, Stream stream);
void stream_reduce(float* x, const float* streams, std::int64_t n_tok, int n, int d, float scale, Stream stream);
void stream_write_forward(float* out, const float* streams, const StreamCoef& c, const float* y, std::int64_t n_tok,
                          int n, int d, Stream stream);
void stream_write_backward(float* dy, float* dbeta, const float* dout, const float* y, const StreamCoef& c,
                           std::int64_t n_tok, int n, int d, Stream stream);

// kernels::HyperConnection (w_alpha null: static HC).
struct HyperConnection {
  const float* streams = nullptr;
  std::int64_t n_tok = 0;
  int n = 0, d = 0;
  float eps = 0;
  const float *A = nullptr, *B = nullptr;
  const float *w_alpha = nullptr, *w_beta = nullptr, *s_alpha = nullptr, *s_beta = nullptr, *norm = nullptr;
  bool tanh = true;
};
struct HyperConnectionGrads {  // all +=
  float *A = nullptr, *B = nullptr, *w_alpha = nullptr, *w_beta = nullptr, *s_alpha = nullptr, *s_beta = nullptr,
        *norm = nullptr;
};
// wg [n+2, d] = the projection rows (W_alpha's, then w_beta) times the norm weight.
void hc_scale_projections(float* wg, const HyperConnection& hc, Stream stream);
// h0 [n_tok, d] = sum_i alpha[i, 0] H_i; dynamic: from proj [n_tok n, n+2] = H wg^T (a GEMM) the
// coefficients coef, their tanh act [n_tok, n(n+2)] and the rows' RMS factors rms [n_tok, n].
void hc_forward(const HyperConnection& hc, const float* proj, float* h0, float* coef, float* act, float* rms,
                Stream stream);
// The backward in three kernels around two GEMMs: width (dstreams = the width paths, overwritten;
// the A, B, s gradients; dynamic: gproj [n_tok n, n+2] = r c), then rows = gproj wg and
// hc_backward_norm (dstreams += the row norms' backward), then acc = gproj^T H and
// hc_backward_params (W's and gamma's gradients). partial: num_chunks(n_tok) * (n(n+2) + 2).
void hc_backward_width(const HyperConnection& hc, const float* coef, const float* act, const float* rms,
                       const float* dh0, const float* dout, const float* dbeta, float* dstreams, float* gproj,
                       const HyperConnectionGrads& grads, float* partial, Stream stream);
void hc_backward_norm(const HyperConnection& hc, const float* rms, const float* rows, float* dstreams, Stream stream);
void hc_backward_params(const HyperConnection& hc, const float* acc, const HyperConnectionGrads& grads, Stream stream);

// kernels::ManifoldHyperConnection (col_row: the Sinkhorn order of the paper's eq. 9).
struct Mhc {
  const float* streams = nullptr;
  std::int64_t n_tok = 0;
  int n = 0, d = 0;
  float eps = 0;
  const float* alpha = nullptr;  // [3]
  const float* bias = nullptr;   // [n(n+2)]
  int iters = 20;
  bool col_row = true;
  float pre_eps = 0;
};
// Given z = x phi^T (a GEMM, [n_tok, n(n+2)]): z *= the state's RMS factor (in place, kept for the
// backward), rms [n_tok], coef [n_tok, n(n+2)], h_in [n_tok, d].
void mhc_forward(const Mhc& mh, float* z, float* h_in, float* coef, float* rms, Stream stream);
// The backward: coef's gradients to gz [n_tok, n(n+2)] (dbias, dalpha +=; partial:
// num_chunks(n_tok) * (n(n+2) + 3); work: mhc_work_floats), then dstreams = gz phi (a GEMM), then
// mhc_backward_state (the RMSNorm backward in place, the width paths added, gz *= r), then
// dphi += gz^T x (a GEMM).
void mhc_backward_coef(const Mhc& mh, const float* z, const float* dh_in, const float* dout, const float* dpost,
                       float* gz, float* dbias, float* dalpha, float* partial, float* work, Stream stream);
void mhc_backward_state(const Mhc& mh, const float* coef, const float* rms, const float* dh_in, const float* dout,
                        float* dstreams, float* gz, Stream stream);
std::int64_t mhc_work_floats(std::int64_t n_tok, int n, int iters);
// ---- MUDDFormer's DA modules (mudd.cu): kernels/mudd's per-token parts ------------------------
// (CudaModel runs the generator's GEMMs through cuBLASLt: cuda_model_mudd.cpp.)

inline constexpr int kMuddMaxSources = 128;  // X_0..X_{n_layers}: passed by value to the kernels

// One DA's C-way mix over S sources (kernels/mudd's MuddDa without the generator).
struct MuddMix {
  const float* sources[kMuddMaxSources] = {};  // X_0..X_{S-1} (PrePostDANorm: the normalised X^_j), [n_tok, d]
  int n_sources = 0;                           // S
  int n_ways = kernels::kMaxWays;              // C; the last way is R
  std::int64_t n_tok = 0;
  int d = 0;
  float eps = 0;
  const float* x = nullptr;          // the block output X_{S-1} [n_tok, d] (PrePostDANorm's residual)
  const float* a = nullptr;          // [C, S]
  const float* post_norm = nullptr;  // PrePostDANorm's R-stream norm [d]; null: the base variant
  float* out[kernels::kMaxWays] = {};  // forward: the streams [n_tok, d] (not aliasing a source or x)
};
struct MuddMixGrads {
  const float* dout[kernels::kMaxWays] = {};     // the streams' gradients
  float* dsources[kMuddMaxSources] = {};         // += per source
  float* dx = nullptr;                           // += PrePostDANorm's residual gradient
  float* da = nullptr;                           // += [C, S]
  float* dpost_norm = nullptr;                   // += [d]
};
// act = GELU(hidden); dh *= GELU'(hidden) (n elements).
void mudd_gelu(float* act, const float* hidden, std::int64_t n, kernels::Gelu kind, Stream stream);
void mudd_gelu_backward(float* dh, const float* hidden, std::int64_t n, kernels::Gelu kind, Stream stream);
// out[c] = sum_j w[c, j] X_j (fused multiply-adds in source order) with w = dw per token
// ([n_tok, C*S], the generator's output, to which a is added in place) or a (dw null: static);
// PrePostDANorm: out[c] = x + mix_c, R's mix through post_norm first.
void mudd_mix_forward(const MuddMix& m, float* dw, Stream stream);
// The mix's backward: dsources, dx, da and dpost_norm (sums over tokens in a fixed order), and
// delta [n_tok, C*S] = dL/d dw when not null. scratch: mudd_mix_scratch_floats.
void mudd_mix_backward(const MuddMix& m, const float* dw, const MuddMixGrads& g, float* delta, float* scratch,
                       Stream stream);
std::int64_t mudd_mix_scratch_floats(std::int64_t n_tok, int d, int n_ways, int n_sources);

// ---- attention (attention.cu): kernels/attention, causal, flash style -----------------------

// q, k, v, out: [batch, seq, n_heads*head_dim] of `type`; lse: [batch, n_heads, seq] (fp32).
enum class AttentionImpl {
  automatic,  // bf16 with head_dim 64 or 128: tensor cores (WMMA); otherwise the fp32-FMA kernels
  simt,       // fp32 FMA kernels (any type, head_dim <= 256)
  wmma,       // bf16 tensor-core kernels (head_dim 64 or 128 only)
  cudnn,      // cuDNN's fused flash attention: only through cuda::Attention (attention.hpp), which
              // owns the plans; the functions below refuse it
};
const char* to_string(AttentionImpl impl);
// "auto", "cudnn", "wmma", "simt" (exit-1 style attnres::Error naming the value otherwise).
AttentionImpl parse_attention_impl(const std::string& name);
struct AttentionShape {
  std::int64_t batch = 0;
  int seq = 0;
  int n_heads = 0;
  int head_dim = 0;
};
void attention_forward(void* out, float* lse, const void* q, const void* k, const void* v, DType type,
                       const AttentionShape& shape, Stream stream, AttentionImpl impl = AttentionImpl::automatic);
// dq, dk, dv overwritten (type). delta: scratch [batch, n_heads, seq] (fp32).
void attention_backward(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
                        const void* out, const float* lse, float* delta, DType type, const AttentionShape& shape,
                        Stream stream, AttentionImpl impl = AttentionImpl::automatic);
bool attention_has_wmma(DType type, int head_dim);

}  // namespace attnres::cuda::kern
