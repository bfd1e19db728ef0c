// The CUDA backend's model: the same decoder-only Transformer, residual topology
// (model/topology.hpp) and flat parameter layout as Model<float> (model/model.hpp), run on one GPU.
//
// API for the trainer (the CPU model's, plus device-side optimizer and precision):
//   CudaModel model(config, max_batch, max_seq, kernels::MatmulPrecision::bf16);  // fp32 by default; device 0
//   model.init_params(seed);                              // or load_params_from_host(span)
//   CudaAdamW opt(model.layout(), adamw_config);
//   double loss = model.forward_backward(tokens, B, T);  // tokens [B, T+1] on the host
//   double norm = opt.step(model, lr, grad_clip);         // clip + AdamW, fused, on the device
//   model.copy_params_to_host(span) / copy_grads_to_host(span) / opt.copy_state_to_host(m, v)
//
// Parameters, gradients and AdamW moments are flat fp32 device buffers laid out by ParamLayout,
// offsets identical to the CPU model's, so checkpoints copy to and from host spans unchanged.
// Activations live in one device arena sized up front for (max_batch, max_seq) and the
// precision; a training step allocates nothing.
//
// Precision:
//   fp32: every tensor fp32; GEMMs in fp32 FMA (cuBLASLt CUBLAS_COMPUTE_32F, no TF32); attention
//         on fp32 FMA kernels. Agrees with Model<float> to fp32 rounding.
//   bf16: mixed precision. GEMM operands (normalised inputs, q/k/v, attention output, SwiGLU
//         tensors, activation gradients feeding GEMMs, and a bf16 shadow of the weights, which
//         the model keeps current itself: loads and update_params) are bf16, with fp32
//         accumulation. fp32: master weights, gradients, optimizer state, the residual stream
//         (embedding, sublayer outputs and partial sums, their gradients), depth reads and all
//         their statistics (RMS factors, logits, mixes), norms' statistics, logits and the loss.
//         Attention uses bf16 tensor cores when head_dim is 64 or 128 (cuDNN's fused flash
//         attention when the build has cuDNN, else the WMMA kernels; attention()).
//
// Not provided (CPU model only for now): KV-cache decoding, read_weights diagnostics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cuda/attention.hpp"
#include "cuda/buffer.hpp"
#include "cuda/gemm.hpp"
#include "cuda/kernels.hpp"
#include "kernels/precision.hpp"
#include "model/config.hpp"
#include "model/param_layout.hpp"
#include "model/topology.hpp"
#include "model/weights.hpp"
#include "optim/adamw.hpp"

namespace attnres::cuda {

// Number, name and memory of the visible GPUs (empty when there is none or no driver).
struct DeviceInfo {
  int index = 0;
  std::string name;
  std::size_t total_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};
std::vector<DeviceInfo> list_devices();

class CudaModel {
 public:
  // The arena is carved for `precision` (set_precision re-carves: build in the precision you train in,
  // as the fp32 arena of a large model may not fit where the bf16 one does).
  CudaModel(const ModelConfig& config, std::int64_t max_batch, int max_seq,
            kernels::MatmulPrecision precision = kernels::MatmulPrecision::fp32, bool with_grad = true,
            int device = 0);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  std::int64_t n_params() const { return layout_.total(); }
  std::int64_t max_batch() const { return max_batch_; }
  int max_seq() const { return max_seq_; }
  int device() const { return device_; }

  // Switches precision; re-carves the activation arena (sized for the new element types).
  void set_precision(kernels::MatmulPrecision p);
  kernels::MatmulPrecision precision() const { return precision_; }

  // Host <-> device copies of the flat buffers (span sizes must equal n_params()).
  void init_params(std::uint64_t seed, double perturbation = 0);  // init_params<float> on the host, then uploaded
  void load_params_from_host(std::span<const float> params);
  void copy_params_to_host(std::span<float> params) const;
  void copy_grads_to_host(std::span<float> grads) const;

  // tokens: [batch, seq+1] (host); position t of a row predicts token t+1. Returns the mean
  // next-token cross-entropy in nats (synchronises).
  double forward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq);
  // As forward, and overwrites the device gradients with the gradient of the mean loss.
  double forward_backward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq);
  // Logits [batch, seq, vocab] (host, fp32) for inputs [batch, seq].
  void logits(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, std::span<float> out);

  // The device gradient buffer (fp32, ParamLayout offsets): micro-batch sums and the reduction
  // across ranks work on it in place.
  float* device_grads() { return grads_.as<float>(); }

  // The buffers an in-place parameter update works on (it may also rewrite the gradients, as
  // clipping does). In bf16 mode the update must write params_bf16, the bf16 copy of the new
  // weights that GEMMs read (null in fp32 mode).
  struct ParamUpdate {
    float* params = nullptr;
    float* grads = nullptr;
    void* params_bf16 = nullptr;
    std::int64_t n = 0;
    Stream stream = nullptr;
  };
  // Runs `update` (enqueued on stream()) on the device parameters; the bf16 copy then counts as
  // current. The only way to write the weights besides init_params / load_params_from_host.
  void update_params(const std::function<void(const ParamUpdate&)>& update);

  Stream stream() const { return stream_; }
  void synchronize() const;
  // Bytes this model holds on the device (parameters, gradients, bf16 copy, arena, GEMM and
  // cuDNN attention workspaces).
  std::size_t device_bytes() const;
  Gemm& gemm() { return *gemm_; }
  // Which attention implementation runs (cuda/attention.hpp; automatic by default: cuDNN when
  // built with it, bf16 and head_dim 64 / 128, else the WMMA or FMA kernels).
  Attention& attention() { return *attention_; }

 private:
  struct Sublayer {
    float* h = nullptr;  // read output (fp32; null in prenorm)
    float* rms = nullptr;
    float* read_logits = nullptr;
    void* x = nullptr;  // normalised input (GEMM operand type)
    float* rstd = nullptr;
    void *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr;  // attention (operand type)
    float* lse = nullptr;
    void *gate = nullptr, *up = nullptr, *act = nullptr;  // MLP (operand type)
    float* out = nullptr;   // partial sum after this sublayer's write-back
    float* dout = nullptr;  // its gradient
  };
  struct Buffers {
    float* emb = nullptr;
    float* demb = nullptr;
    std::vector<Sublayer> sub;
    float *h_final = nullptr, *rms_final = nullptr, *logits_final = nullptr;
    void* x_final = nullptr;
    float* rstd_final = nullptr;
    float* hv = nullptr;  // rd value route (recomputed in the backward)
    void* xv = nullptr;
    float* rstdv = nullptr;
    float *dx_final = nullptr, *dh = nullptr, *dhv = nullptr, *dx = nullptr, *dxv = nullptr;
    void *dq = nullptr, *dk = nullptr, *dv = nullptr, *datt = nullptr, *dout_op = nullptr;
    void *dgate = nullptr, *dup = nullptr, *dact = nullptr;
    float* delta = nullptr;   // attention backward scratch [B, H, T]
    float* reduce = nullptr;  // chunked parameter-gradient partials
    // [ce_rows, V], fp32-sized: the loss's logits and, in place, their gradient in the operand
    // type (issue #49); logits()'s in fp32.
    void* ce_logits = nullptr;
    double* row_loss = nullptr;
    double* loss = nullptr;
    float *rope_cos = nullptr, *rope_sin = nullptr;
    std::int32_t* tokens = nullptr;  // inputs | targets | ids | starts | positions
    const float** read_sources = nullptr;  // [n_reads][max_sources]
    float** read_dsources = nullptr;       // [n_reads][max_sources]
    // DenseFormer: each DWA's output Y_i and its gradient, by block (null where none); the source
    // pointer tables of the DWAs, one after the other (Topology::dwas() order, from dwa_table[i]).
    std::vector<float*> dwa_out, ddwa_out;
    const float** dwa_sources = nullptr;
    float** dwa_dsources = nullptr;
    // The value residual: V' of the current attention sublayer (operand type; recomputed in the
    // backward), and V_1's gradient gathered from the later layers (fp32).
    void* vmix = nullptr;
    float* dv1 = nullptr;
    // Delta AttnRes (delta, delta_block; sub[j].out holds sublayer j's source, f_j or its block's
    // partial sum, and sub[j].dout its gradient): the stream x_{j+1} after each sublayer, a sublayer's
    // output before it joins the partial sum, the stream's gradient, and the reads' source tables
    // ([L][delta_max_src_], by sublayer).
    std::vector<float*> delta_x;
    float* delta_f = nullptr;
    float* dstream = nullptr;
    const float** delta_sources = nullptr;
    float** delta_dsources = nullptr;
    std::size_t dstream_floats = 0;  // demb, every dout, ddwa_out and dv1: one block, zeroed by one memset
    // hc / mhc (config.uses_streams(); cuda_model_streams.cpp): the n-stream state H_j [n_tok, n, d]
    // entering each sublayer j and the exit's H_L (sub[j].h holds module j's read, sub[j].out the
    // sublayer's output y, h_final the readout); each module's saved coefficients, tanh values or z,
    // and RMS factors (none for static HC); the state's gradients (two, used in turn), the write's
    // dbeta and the modules' scratch.
    std::vector<float*> stream_state, stream_coef, stream_act, stream_rms;
    float* dstate[2] = {nullptr, nullptr};
    float* dbeta = nullptr;
    float* stream_scratch = nullptr;
    // Issue #49, the batched read backward: per slot of a read group (slot i: its i-th read from
    // the top) the read's output gradients (slot 0: dh and dhv), the coefficients of its shared
    // sources and its query / key-norm partials, kept until the group's pass.
    float *read_dh = nullptr, *read_dhv = nullptr, *read_coef = nullptr, *read_scratch = nullptr;
  };

  void carve(unsigned char* base, std::size_t& used);
  void build_arena();
  void refresh_shadow();
  void set_inputs(std::span<const std::int32_t> tokens, std::int64_t batch, int seq, bool with_targets);
  void forward_trunk(std::int64_t batch, int seq);
  void backward_trunk(std::int64_t batch, int seq);
  void lm_head_loss(bool with_grad);
  DType op_type() const { return precision_ == kernels::MatmulPrecision::bf16 ? DType::bf16 : DType::f32; }
  // The buffer of a residual-stream index of the topology (kNoStream: null), and its gradient.
  const float* residual(int index) const;
  float* dresidual(int index);
  const void* op_weight(const float* w) const;  // a weight's GEMM operand (bf16 copy or fp32)
  // Read `read` with its parameters p (model/topology.hpp's read_params) and the following norm's
  // weight norm_w; the backward adds into the parameter gradients dp.
  void read_forward(int read, const ReadParams<float>& p, const float* norm_w, float* h, void* x, float* rstd,
                    float* rms, float* logits, bool recompute);
  void read_backward(int read, const ReadParams<float>& p, const ReadParams<float>& dp, const float* dout,
                     const float* dout_v, const float* rms, const float* logits);
  // Where read `read`'s output gradient (value_route: its separate value route's) goes: its slot
  // of its read group (issue #49).
  float* read_dout(int read, bool value_route);
  // The value residual of attention layer `layer` (null: none, as in layer 0 or without it).
  std::optional<kern::ValueResidual> value_residual(int layer) const;
  // A DWA of DenseFormer (one of Topology::dwas()) for the kernels, and its backward.
  kern::Dwa dwa(const DwaPlan& plan) const;
  void dwa_backward(const DwaPlan& plan);
  // Delta AttnRes: the stream x_j entering sublayer j (j = L: the final norm's input), and sublayer
  // j's read (kernels/delta_read: a depth read whose gated output adds to x_j), fused with the
  // following norm (and the V route's), and its backward given dL/dh (adding the stream's share
  // into dstream; cuda_model_delta.cpp).
  const float* delta_stream(int j) const;
  void delta_read_forward(int j, const float* norm_w);
  void delta_read_backward(int j, const float* dh);
  // Delta AttnRes's options (cuda_model_delta.cpp): binds each read's tensors, carves their
  // buffers (only for the options that are on); a read source's buffer and its gradient (the
  // topology's indices, or kDeltaNullSource); the input of sublayer j's V projection when its read
  // has a V route (null: none, V reads s.x).
  static constexpr int kDeltaNullSource = -100;
  void delta_bind();
  void delta_carve(const std::function<float*(std::int64_t)>& f32, const std::function<void*(std::int64_t)>& op);
  const float* delta_source(int index) const;
  float* delta_dsource(int index);
  void* delta_value_input(int j) const;
  // The SwiGLU MLP body of a sublayer s (shared by every trunk): out = W_down (SiLU(W_gate x) * W_up x)
  // + base (null: none) from s.x, keeping s.gate, s.up and s.act; its backward given dy (the GEMM
  // operand type) adds the weight gradients into lg and overwrites b.dx with dL/dx.
  void mlp_forward(const LayerWeights<float>& lw, const Sublayer& s, float* out, const float* base, std::int64_t n);
  void mlp_backward(const LayerWeights<float>& lw, LayerWeights<float>& lg, const Sublayer& s, const void* dy,
                    std::int64_t n);
  // The Gated Residual (gr, cuda_model_gated_residual.cpp; model/gated_residual_trunk.cpp step for
  // step): binds the modules' weights, carves their buffers; module j's read into sub[j].x (j = L:
  // the final mixer, into x_final; module 0 first fills the branches with the embedding), its write
  // of y_j = sub[j].out into H_{j+1}; backward: the write's (dy into sub[j].dout) and the read's
  // given dL/dx (the final mixer's first zeroes dL/dH, module 0's last adds it into demb).
  void gr_bind();
  void gr_carve(const std::function<void*(std::int64_t)>& take);
  void gr_read_forward(int j);
  void gr_write_forward(int j);
  void gr_write_backward(int j);
  void gr_read_backward(int j, const float* dx);
  // Hyper-connections and mHC (cuda_model_streams.cpp; model/stream_trunk.cpp step for step): the
  // entry (H_0 = the embedding n times), module j's read (sub[j].h) fused with the sublayer's
  // pre-norm, its write H_{j+1}, the exit (h_final); backward: the exit's gradient into the state,
  // the write's (sub[j].dout = dL/dy, dbeta), the module's given dL/dh, the entry's (demb).
  struct StreamModule {  // offsets of module j's tensors in the flat buffers (-1: none)
    std::int64_t A = -1, B = -1, w_alpha = -1, w_beta = -1, s_alpha = -1, s_beta = -1, norm = -1;
    std::int64_t phi = -1, alpha = -1, bias = -1;
  };
  void bind_streams();
  static std::int64_t stream_scratch_floats(const ModelConfig& c, std::int64_t bt);
  const float* stream_param(std::int64_t offset) const;
  float* stream_grad(std::int64_t offset);
  kern::HyperConnection hc_module(int j) const;
  kern::Mhc mhc_module(int j) const;
  kern::StreamCoef stream_coefficients(int j) const;
  void stream_read_forward(int j, const float* norm_w);
  void stream_write_forward(int j);
  void stream_exit_forward();
  void stream_exit_backward();
  void stream_write_backward(int j);
  void stream_read_backward(int j, const float* dh);
  // MUDDFormer (issue #48; cuda_model_mudd.cpp, which defines MuddState: the DA modules' weights
  // and buffers, the blocks' Q, K, V inputs): its trunk replaces forward_trunk / backward_trunk.
  struct MuddState;
  void mudd_init();
  void mudd_carve(const std::function<float*(std::int64_t)>& f32, const std::function<void*(std::int64_t)>& op);
  void mudd_forward_trunk(std::int64_t batch, int seq);
  void mudd_backward_trunk(std::int64_t batch, int seq);

  ModelConfig config_;
  ParamLayout layout_;
  std::int64_t max_batch_;
  int max_seq_;
  bool with_grad_;
  int device_;
  kernels::MatmulPrecision precision_ = kernels::MatmulPrecision::fp32;
  Topology topo_;
  std::int64_t ce_rows_ = 0;
  // Issue #49: the reads' groups (Topology::read_groups), each read's group, the most reads a
  // group has (and of those with a separate value route), and the group whose reads' backward has
  // begun (its pass runs after its last).
  std::vector<ReadGroup> read_groups_;
  std::vector<int> read_group_of_;
  int read_group_slots_ = 0, read_group_value_slots_ = 0;
  int read_value_slot(int read) const;  // its slot among its group's reads with a separate value route
  kern::DepthReadGroup read_group_pending_;

  Stream stream_ = nullptr;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Attention> attention_;
  DeviceBuffer params_, grads_, shadow_, arena_;
  bool shadow_valid_ = false;  // the bf16 copy (shadow_) holds the current params_
  ModelWeights<float> w_, g_;
  // DenseFormer's DWA weights and their gradients (dwa.{block}.alpha), and where each DWA's
  // pointers start in the source tables, by Topology::dwas().
  std::vector<const float*> dwa_alpha_;
  std::vector<float*> dwa_dalpha_;
  std::vector<std::size_t> dwa_table_;
  // Delta AttnRes (config.uses_delta_reads()): each sublayer's read sources (model/topology.hpp's
  // delta_read_sources after kDeltaNullSource with delta_null_source; empty: no read) and the most
  // any read has.
  bool delta_ = false;
  std::vector<std::vector<int>> delta_src_;
  std::size_t delta_max_src_ = 1;
  // Delta AttnRes's options, per sublayer: the read's V route, null source and gate tensors and
  // their gradients (null where absent), and what the backward needs: the mixes before the gate
  // (c, cv), the vector gate's values g, the V route's h_V, normalised input xv and its RMS
  // factors. Shared by the reads: the null source's broadcast and its gradient, the reads' output
  // gradients through the gate (gdh), the vector gate's pre-activation gradient (dp).
  struct DeltaOptions {
    const float *value_query = nullptr, *value_key_norm = nullptr, *null_source = nullptr, *gate = nullptr,
                *gate_bias = nullptr;
    float *dvalue_query = nullptr, *dvalue_key_norm = nullptr, *dnull_source = nullptr, *dgate = nullptr,
          *dgate_bias = nullptr;
    bool value_route = false;
    float *c = nullptr, *cv = nullptr, *g = nullptr, *hv = nullptr, *rstdv = nullptr;
    void* xv = nullptr;
  };
  std::vector<DeltaOptions> delta_opt_;
  float *delta_null_ = nullptr, *delta_dnull_ = nullptr, *delta_gdh_[2] = {nullptr, nullptr}, *delta_dp_ = nullptr;
  // The Gated Residual (the family without model norms): per module j = 0..L (L: the final mixer,
  // without W_inject) its weights, their gradients, the branches entering it [bt, n, d] and what
  // its backward keeps (the branch RMS factors [bt, n], W_down's output p [bt, r], the write gates
  // [bt, n]); the buffers the modules share: the normalised branches, SiLU(p) and the gradients'
  // GEMM operands (operand type), the read gates' pre-sigmoid q, dL/dHn, dL/da and dL/dH (fp32).
  struct GrModule {
    const float *norm = nullptr, *w_down = nullptr, *w_up = nullptr, *w_inject = nullptr;
    float *dnorm = nullptr, *dw_down = nullptr, *dw_up = nullptr, *dw_inject = nullptr;
    float *H = nullptr, *rms = nullptr, *p = nullptr, *beta = nullptr;
  };
  struct GrShared {
    void *hn = nullptr, *a = nullptr, *dq = nullptr, *dp = nullptr, *ds = nullptr;
    float *q = nullptr, *dhn = nullptr, *da = nullptr, *dH = nullptr;
  };
  bool gr_ = false;
  std::vector<GrModule> gr_mod_;
  GrShared gr_buf_;
  // hc / mhc (config.uses_streams()): the modules' tensors by sublayer.
  bool streams_ = false;
  std::vector<StreamModule> stream_modules_;
  std::shared_ptr<MuddState> mudd_;  // MUDDFormer (model.residual = mudd); null otherwise
  Buffers buf_;

  PinnedBuffer host_tokens_, host_loss_;
  std::vector<std::int32_t> counts_;
  std::int64_t n_tok_ = 0;
  int n_ids_ = 0;
};

// torch AdamW (optim/adamw.hpp semantics: decay on matrices only) with global-norm gradient
// clipping, fused into two device passes (norm, then clip + update); moments fp32 on the device.
class CudaAdamW {
 public:
  CudaAdamW(const ParamLayout& layout, AdamWConfig config, int device = 0);

  // Clips the model's gradients to max_norm (if > 0; torch's clip_grad_norm_), applies one AdamW
  // update at learning rate lr and refreshes the model's bf16 weights. Returns the gradient norm
  // before clipping (synchronises to read it).
  double step(CudaModel& model, double lr, double max_norm);

  std::int64_t steps() const { return t_; }
  void set_steps(std::int64_t t) { t_ = t; }
  const AdamWConfig& config() const { return config_; }
  void copy_state_to_host(std::span<float> m, std::span<float> v) const;
  void load_state_from_host(std::span<const float> m, std::span<const float> v);
  std::size_t device_bytes() const;

 private:
  AdamWConfig config_;
  std::int64_t n_ = 0;
  int n_ranges_ = 0;
  std::int64_t t_ = 0;
  DeviceBuffer m_, v_, ranges_, partials_, norm_, clip_;
};

// Multi-GPU seam: sums the flat gradient buffer over data-parallel ranks, in place, on the
// model's stream (then the caller scales by 1/world if it wants the mean). A single process
// needs nothing. With NCCL (ATTNRES_WITH_NCCL): construct from (rank, world, id) where rank 0
// made the id with nccl_unique_id() and the caller shared it (e.g. dist::Communicator::broadcast).
class GradAllReduce {
 public:
  static bool available();                     // built with NCCL
  static std::vector<char> nccl_unique_id();   // on rank 0
  GradAllReduce(int rank, int world, std::span<const char> unique_id, int device = 0);
  ~GradAllReduce();
  GradAllReduce(const GradAllReduce&) = delete;
  GradAllReduce& operator=(const GradAllReduce&) = delete;
  void sum(float* device_data, std::int64_t n, Stream stream);
  void sum_grads(CudaModel& model) { sum(model.device_grads(), model.n_params(), model.stream()); }
  int world() const { return world_; }

 private:
  int world_ = 1;
  void* comm_ = nullptr;  // ncclComm_t
};

}  // namespace attnres::cuda
