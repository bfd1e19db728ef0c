// attnres_gpu_check: the CUDA backend against the CPU backend (tests/gpu/check.sh, docs/cuda.md).
//
//   (a) fp32 parity: every residual mode and control on random weights; logits, loss and every
//       gradient tensor of the CUDA model (fp32, no TF32) against Model<double> on the same
//       fp32 weights, largest relative error <= 1e-4 (Model<float>'s error is shown beside it; a
//       tensor Model<float> itself gets only to more than 2.5e-5 is held to 4x that error).
//   (b) bf16: loss within 1e-2 of fp32 (small models in every mode, and preset S at init), the
//       whole gradient within 5% (norm-wise); the attention kernels (tensor-core and fp32-FMA)
//       and, in a build with cuDNN, cuDNN's fused attention (cuda::Attention, impl cudnn) against
//       CPU float64 attention on the same bf16-rounded inputs.
//   (c) 20 AdamW steps (grad clip 1.0, weight decay) on the CPU (Model<float> + AdamW) and on
//       the GPU (fp32): loss curves agree to 1e-3 relative.
//   (d) throughput of presets S and M in bf16 (block and rd): tokens/s, MFU against the bf16 GEMM
//       rate measured here (cuBLASLt, 8192^3), RD/Block step-time and device-memory ratios.
//       Targets (S MFU >= 40%, RD/Block <= 1.02) are reported; they fail the run only with --strict.
//   (r), (e) (only when --only names them): issue #49's bandwidth checks. (r) the depth-read
//       backward of one block, batched vs one read at a time; (e) RoPE of q and k, SwiGLU forward /
//       backward and the cross-entropy, the kernels before vs the new ones on the same inputs (RoPE
//       and SwiGLU bit-identical; the cross-entropy against a float64 reference), each way's time,
//       bytes and rate against a device-to-device copy. --quick: small shapes (the emulator).
//
// Baseline families on CUDA (issue #48; today DenseFormer, the value residual, Delta AttnRes
// with every option, the Gated Residual, hyper-connections, mHC and MUDDFormer):
// checks (a)-(c)
// take every variant of testing::cuda_variants(), so a family's modes join them when its record
// sets `cuda`; (d) times every arm (model/arms.hpp) of a non-AttnRes mode that the CUDA backend
// trains, and block+vres, on the same preset as block, and prints its step time and device memory
// against block's.
//
// --modes NAME,... restricts (a)-(d) to those variants / arms (by name: "denseformer_2x2",
// "denseformer-4x5"; the extra cases "block untied", "rd hd128", "S init rd" go with their mode);
// the attention-kernel cases of (b) then run only when the list names "attention". (d) always times
// block and rd as the reference. A name none of them has is an error (exit 2).
//
// --attention auto|cudnn|wmma|simt picks the attention implementation of every CudaModel the
// checks build (cuda::Attention; auto: cuDNN when the build has it); (d) names it in each row.
//
// Prints one table; exits 1 when a check failed, 2 when there is no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "bench/flops.hpp"
#include "common/model_util.hpp"
#include "cuda/attention.hpp"
#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "kernels/attention.hpp"
#include "model/arms.hpp"
#include "model/family.hpp"
#include "model/model.hpp"
#include "optim/adamw.hpp"
#include "train/train_config.hpp"
#include "util/checksum.hpp"
#include "util/rng.hpp"
#include "util/threads.hpp"

namespace {

using namespace attnres;
using cuda::CudaAdamW;
using cuda::CudaModel;
using cuda::DType;
using Precision = kernels::MatmulPrecision;
using testing::Variant;

// ---------------------------------------------------------------------------------------------
// The result table
// ---------------------------------------------------------------------------------------------

struct Row {
  std::string check, name, metric;
  double value = 0, limit = 0;
  bool higher_is_better = false;
  bool fatal = true;  // a miss fails the run (performance targets: only with --strict)
  bool pass = true;
  std::string note;
};
std::vector<Row> g_rows;
bool g_strict = false;
bool g_quick = false;  // skip the preset-size cases in (b)
std::vector<std::string> g_modes;  // --modes: the variants and arms to check (empty: all)

bool selected(const std::string& name) {
  return g_modes.empty() || std::find(g_modes.begin(), g_modes.end(), name) != g_modes.end();
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}
// --attention: the implementation every CudaModel of the checks uses (cuda/attention.hpp).
cuda::kern::AttentionImpl g_attention = cuda::kern::AttentionImpl::automatic;

void add_row(const std::string& check, const std::string& name, const std::string& metric, double value,
             double limit, bool higher_is_better = false, bool fatal = true, const std::string& note = "") {
  Row r{check, name, metric, value, limit, higher_is_better, fatal || g_strict, true, note};
  r.pass = std::isfinite(value) && (higher_is_better ? value >= limit : value <= limit);
  std::printf("  %-2s %-26s %-34s %11.3e  %s %9.2e  %s%s%s\n", check.c_str(), name.c_str(), metric.c_str(), value,
              higher_is_better ? ">=" : "<=", limit, r.pass ? "PASS" : (r.fatal ? "FAIL" : "MISS"),
              note.empty() ? "" : "  ", note.c_str());
  std::fflush(stdout);
  g_rows.push_back(std::move(r));
}

void add_info(const std::string& check, const std::string& name, const std::string& text) {
  std::printf("  %-2s %-26s %s\n", check.c_str(), name.c_str(), text.c_str());
  std::fflush(stdout);
}

void add_error(const std::string& check, const std::string& name, const std::string& what) {
  Row r{check, name, "error", NAN, 0, false, true, false, what};
  std::printf("  %-2s %-26s ERROR: %s\n", check.c_str(), name.c_str(), what.c_str());
  std::fflush(stdout);
  g_rows.push_back(std::move(r));
}

// max |a - b| / max |b| (tests/common/test_util.hpp's measure).
template <class A, class B>
double max_rel(const A* a, const B* b, std::size_t n) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref == 0 ? diff : diff / ref;
}

// ||a - b|| / ||b||.
template <class A, class B>
double norm_rel(const A* a, const B* b, std::size_t n) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += x * x;
    ref += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

// Nearest bf16 (ties to even) as a float, and its 16-bit pattern.
std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_round(float x) {
  const std::uint32_t u = static_cast<std::uint32_t>(bf16_bits(x)) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

ModelConfig variant_config(ModelConfig c, const Variant& v) { return v.apply(c); }

// Random weights (every parameter perturbed, as in tests/common/model_util.hpp), rounded to fp32.
std::vector<float> random_weights(const ModelConfig& c, std::uint64_t seed, testing::WeightScales scales) {
  Model<double> m(c, 1, 1, false);
  testing::randomize_weights(m, seed, scales);
  std::vector<float> w(m.params().size());
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(m.params()[i]);
  return w;
}

// Sequences a model can learn: x_{t+1} = (5 x_t + 3) mod V, with 10% random tokens.
std::vector<std::int32_t> pattern_tokens(int batch, int seq, int vocab, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> t(static_cast<std::size_t>(batch) * (seq + 1));
  for (int b = 0; b < batch; ++b) {
    std::int32_t x = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)));
    for (int i = 0; i <= seq; ++i) {
      t[static_cast<std::size_t>(b) * (seq + 1) + i] = x;
      x = rng.uniform() < 0.1 ? static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(vocab)))
                              : (5 * x + 3) % vocab;
    }
  }
  return t;
}

// The arms (model/arms.hpp) of the baseline families that the CUDA backend trains: every arm whose
// mode is not one of AttnRes's (prenorm, full, block, rd) and that cuda_refusal accepts, and
// block with the value residual.
std::vector<std::string> baseline_arms() {
  std::vector<std::string> out = {"block+vres"};
  for (const std::string& arm : arm_names()) {
    const ModelConfig c = apply_arm(ModelConfig{}, arm);
    const ResidualMode m = c.residual;
    const bool attnres = m == ResidualMode::prenorm || m == ResidualMode::full || m == ResidualMode::block ||
                         m == ResidualMode::rd;
    if (!attnres && cuda_refusal(c).empty()) out.push_back(arm);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// (a) fp32 parity
// ---------------------------------------------------------------------------------------------

void parity_case(const std::string& name, const ModelConfig& c, int batch, int seq, std::uint64_t seed) {
  // Unit-gain matrices, and pseudo-queries giving depth logits of std ~1.4 as in the CPU suite's
  // d = 8 models (a std-0.5 query at d = 64 makes the depth softmax so peaky that fp32 itself,
  // CPU or GPU, loses about 1e-4 to cancellation in the key-norm gradients), and MUDD's W2, a and
  // post norm within 0.1 of their init (at 0.5 each mixing weight sums K products to a few units,
  // and Model<float> itself is up to 1.2e-4 off Model<double>).
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d_model));
  const std::vector<float> w = random_weights(c, seed, {scale, 0.2, 1.4 * scale, 0.1});
  const std::vector<std::int32_t> tokens = testing::random_tokens(batch, seq, c.vocab_size, seed + 7);
  std::vector<std::int32_t> inputs(static_cast<std::size_t>(batch) * seq);
  for (int b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t) inputs[static_cast<std::size_t>(b) * seq + t] = tokens[static_cast<std::size_t>(b) * (seq + 1) + t];
  const std::size_t n_logits = static_cast<std::size_t>(batch) * seq * c.vocab_size;

  Model<double> ref(c, batch, seq, true);
  for (std::size_t i = 0; i < w.size(); ++i) ref.params()[i] = w[i];
  std::vector<double> ref_logits(n_logits);
  ref.logits(inputs, batch, seq, ref_logits);
  const double ref_loss = ref.forward_backward(tokens, batch, seq);

  Model<float> cpu(c, batch, seq, true);
  std::copy(w.begin(), w.end(), cpu.params().begin());
  std::vector<float> cpu_logits(n_logits);
  cpu.logits(inputs, batch, seq, cpu_logits);
  const double cpu_loss = cpu.forward_backward(tokens, batch, seq);

  CudaModel gpu(c, batch, seq);
  gpu.attention().set_impl(g_attention);
  gpu.load_params_from_host(w);
  std::vector<float> gpu_logits(n_logits);
  gpu.logits(inputs, batch, seq, gpu_logits);
  const double gpu_loss = gpu.forward_backward(tokens, batch, seq);
  std::vector<float> gpu_grads(w.size());
  gpu.copy_grads_to_host(gpu_grads);

  // Each gradient tensor is held to 1e-4, or to 4x Model<float>'s own error where that is larger: a
  // gradient that is one sum of cancelling terms over every token (hc's s_alpha and s_beta, sums of
  // tanh values of either sign) is only as accurate as fp32 makes it, on the CPU as on the GPU. The
  // row shows the worst error scaled to the 1e-4 bound: the error itself wherever Model<float>'s is
  // below 2.5e-5 (every tensor of the single-stream modes).
  double worst_grad = 0, worst_cpu_grad = 0;
  std::string worst_name;
  for (const ParamInfo& p : ref.layout().params()) {
    const auto off = static_cast<std::size_t>(p.offset), n = static_cast<std::size_t>(p.numel);
    const double e = max_rel(gpu_grads.data() + off, ref.grads().data() + off, n);
    const double e_cpu = max_rel(cpu.grads().data() + off, ref.grads().data() + off, n);
    worst_cpu_grad = std::max(worst_cpu_grad, e_cpu);
    const double bound = std::max(1e-4, 4 * e_cpu), scaled = e * 1e-4 / bound;
    if (scaled > worst_grad || worst_name.empty()) {
      worst_grad = scaled;
      worst_name = p.name;
      if (bound > 1e-4) worst_name += " (" + fmt("%.1e", e) + ", held to 4 x its cpu f32 " + fmt("%.1e", e_cpu) + ")";
    }
  }
  const double logit_err = max_rel(gpu_logits.data(), ref_logits.data(), n_logits);
  const double loss_err = std::abs(gpu_loss - ref_loss) / std::abs(ref_loss);
  add_row("a", name, "logits max rel err vs f64", logit_err, 1e-4, false, true,
          "cpu f32: " + fmt("%.1e", max_rel(cpu_logits.data(), ref_logits.data(), n_logits)));
  add_row("a", name, "loss rel err vs f64", loss_err, 1e-4, false, true,
          "loss " + fmt("%.6f", ref_loss) + ", cpu f32: " + fmt("%.1e", std::abs(cpu_loss - ref_loss) / ref_loss));
  // The digest of the CUDA gradients: equal digests across builds or runs mean bit-identical
  // gradients (a kernel rewritten without changing its arithmetic; reproducibility).
  add_row("a", name, "grads max rel err vs f64 (worst)", worst_grad, 1e-4, false, true,
          worst_name + "; cpu f32: " + fmt("%.1e", worst_cpu_grad) + "; cuda grads xxh3 " +
              checksum_hex(checksum64(gpu_grads.data(), gpu_grads.size() * sizeof(float))));
}

void check_parity() {
  std::printf("(a) CUDA fp32 vs CPU (Model<double> reference, same fp32 weights)\n");
  ModelConfig base;
  base.vocab_size = 97;
  base.d_model = 64;
  base.n_layers = 4;
  base.n_heads = 2;
  base.mlp_hidden = 96;
  base.n_blocks = 4;
  base.max_seq_len = 48;
  for (const Variant& v : testing::cuda_variants()) {
    if (!selected(v.name)) continue;
    try {
      parity_case(v.name, variant_config(base, v), 3, 45, 11);
    } catch (const std::exception& e) {
      add_error("a", v.name, e.what());
    }
  }
  if (selected("block")) try {  // untied LM head
    ModelConfig c = variant_config(base, {"block", ResidualMode::block, ValueRoute::decoupled});
    c.tie_embeddings = false;
    parity_case("block untied", c, 3, 45, 12);
  } catch (const std::exception& e) {
    add_error("a", "block untied", e.what());
  }
  if (selected("rd")) try {  // head_dim 128 (the other fp32 attention kernel), two key tiles
    ModelConfig c = variant_config(base, {"rd", ResidualMode::rd, ValueRoute::decoupled});
    c.d_model = 256;
    c.n_heads = 2;
    c.n_layers = 2;
    c.n_blocks = 2;
    c.mlp_hidden = 320;
    c.max_seq_len = 80;
    parity_case("rd hd128", c, 2, 70, 13);
  } catch (const std::exception& e) {
    add_error("a", "rd hd128", e.what());
  }
  // Issue #49: one block of 8 sublayers, so the batched read backward splits the final read and
  // the 8 sublayers' reads into groups of at most kMaxReadGroup (8 reads, then 1), with both
  // routes and a separate value route in every slot.
  if (selected("rd")) try {
    ModelConfig c = variant_config(base, {"rd", ResidualMode::rd, ValueRoute::decoupled});
    c.n_blocks = 1;
    parity_case("rd one block", c, 3, 45, 18);
  } catch (const std::exception& e) {
    add_error("a", "rd one block", e.what());
  }
  // DenseFormer 4 x 5 over 6 blocks: one DWA, after block 5, reading X_1 and X_5 (sources other
  // than the embedding, a block without a DWA before it and after it; block 6 reads the DWA).
  if (selected("denseformer-4x5")) try {
    ModelConfig c = apply_arm(base, "denseformer-4x5");
    c.n_layers = 6;
    parity_case("denseformer-4x5 L6", c, 2, 45, 14);
  } catch (const std::exception& e) {
    add_error("a", "denseformer-4x5 L6", e.what());
  }
  // The value residual with constant lambdas (the variants have fixed, learned_convex, learned_pair).
  if (selected("block_vres_constant")) try {
    ModelConfig c = variant_config(base, {"block", ResidualMode::block, ValueRoute::decoupled});
    c.value_residual = true;
    c.vres_mode = kernels::VresMode::constant;
    c.vres_lambda1 = 2;
    c.vres_lambda2 = 1;
    parity_case("block_vres_constant", c, 3, 45, 15);
  } catch (const std::exception& e) {
    add_error("a", "block_vres_constant", e.what());
  }
  // Delta AttnRes's other delta_block schedule (the released code's: completed blocks only) and
  // delta with the value residual (without a V route; the variants cover each option, the cases
  // after these every option at once).
  if (selected("delta_block")) try {
    ModelConfig c = variant_config(base, {.name = "delta_block", .residual = ResidualMode::delta_block});
    c.delta_block_partial = false;
    parity_case("delta_block released", c, 3, 45, 16);
  } catch (const std::exception& e) {
    add_error("a", "delta_block released", e.what());
  }
  if (selected("delta")) try {
    ModelConfig c = variant_config(base, {.name = "delta", .residual = ResidualMode::delta});
    c.value_residual = true;
    c.vres_mode = kernels::VresMode::learned_pair;
    parity_case("delta vres_pair", c, 3, 45, 17);
  } catch (const std::exception& e) {
    add_error("a", "delta vres_pair", e.what());
  }
  // Every option of Delta AttnRes at once: the vector gate (its GEMMs), the null source (sublayer
  // 0 reads it alone) and the V route; delta_block with the value residual too.
  for (const ResidualMode mode : {ResidualMode::delta, ResidualMode::delta_block}) {
    const bool delta = mode == ResidualMode::delta;
    const std::string name = delta ? "delta all options" : "delta_block all+vres";
    if (!selected(delta ? "delta_vector_vroute" : "delta_block_vroute_null")) continue;
    try {
      ModelConfig c = variant_config(base, {.name = name, .residual = mode});
      c.delta_gate = kernels::DeltaGate::sigmoid_vector;
      c.delta_null_source = true;
      c.delta_value_route = DeltaValueRoute::decoupled;
      c.value_residual = !delta;
      c.vres_mode = kernels::VresMode::learned_pair;
      parity_case(name, c, 3, 45, 20);
    } catch (const std::exception& e) {
      add_error("a", name, e.what());
    }
  }
  // The Gated Residual with the most branches (gr_n = 8) and an untied LM head (the final mixer
  // feeds it directly: no final norm).
  if (selected("gr")) try {
    ModelConfig c = variant_config(base, {.name = "gr", .residual = ResidualMode::gr, .n_streams = 8});
    c.tie_embeddings = false;
    parity_case("gr n8 untied", c, 3, 45, 18);
  } catch (const std::exception& e) {
    add_error("a", "gr n8 untied", e.what());
  }
  // Hyper-connections and mHC at the default n = 4 (the variants have 2 and 3 streams), HC with the
  // mean readout, mHC with mhc_pre_eps and the zero bias init (all streams equal at the entry).
  if (selected("hc")) try {
    ModelConfig c = variant_config(base, {.name = "hc", .residual = ResidualMode::hc, .n_streams = 4});
    c.hc_reduce = StreamReadout::mean;
    parity_case("hc n4 mean", c, 2, 45, 18);
  } catch (const std::exception& e) {
    add_error("a", "hc n4 mean", e.what());
  }
  if (selected("mhc")) try {
    ModelConfig c = variant_config(base, {.name = "mhc", .residual = ResidualMode::mhc, .n_streams = 4});
    c.mhc_pre_eps = 1e-6;
    c.mhc_bias_init = MhcBiasInit::zero;
    parity_case("mhc n4 pre_eps zero_bias", c, 2, 45, 19);
  } catch (const std::exception& e) {
    add_error("a", "mhc n4 pre_eps zero_bias", e.what());
  }
  // MUDDFormer with the paper's generator width (K = C*S, no rounding, the last DA not widened:
  // GEMMs of odd shapes) over 6 blocks.
  if (selected("mudd")) try {
    ModelConfig c = variant_config(base, {.name = "mudd", .residual = ResidualMode::mudd});
    c.n_layers = 6;
    c.mudd_hidden_round = 0;
    c.mudd_last_expand = 1;
    parity_case("mudd paper K L6", c, 2, 45, 18);
  } catch (const std::exception& e) {
    add_error("a", "mudd paper K L6", e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// (b) bf16
// ---------------------------------------------------------------------------------------------

void bf16_case(const std::string& name, const ModelConfig& c, int batch, int seq, std::uint64_t seed) {
  // Init-scale matrices; queries as in (a): at std 0.5 and d = 128 the depth softmax is nearly an
  // argmax and `full` loses 4x more than `block` to cancellation in fp32 already (CPU too).
  const std::vector<float> w = random_weights(c, seed, {0.02, 0.2, 1.4 / std::sqrt(double(c.d_model))});
  const std::vector<std::int32_t> tokens = testing::random_tokens(batch, seq, c.vocab_size, seed + 3);
  CudaModel gpu(c, batch, seq);
  gpu.attention().set_impl(g_attention);
  gpu.load_params_from_host(w);
  const double loss32 = gpu.forward_backward(tokens, batch, seq);
  std::vector<float> g32(w.size()), g16(w.size());
  gpu.copy_grads_to_host(g32);
  gpu.set_precision(Precision::bf16);
  const double loss16 = gpu.forward_backward(tokens, batch, seq);
  gpu.copy_grads_to_host(g16);
  double worst = 0;
  std::string worst_name;
  for (const ParamInfo& p : gpu.layout().params()) {
    const double e = norm_rel(g16.data() + p.offset, g32.data() + p.offset, static_cast<std::size_t>(p.numel));
    if (e > worst || worst_name.empty()) {
      worst = e;
      worst_name = p.name;
    }
  }
  add_row("b", name, "|loss bf16 - loss fp32|", std::abs(loss16 - loss32), 1e-2, false, true,
          "fp32 loss " + fmt("%.5f", loss32));
  add_row("b", name, "grads norm rel err bf16 vs fp32", norm_rel(g16.data(), g32.data(), g32.size()), 5e-2, false,
          true, "worst tensor " + worst_name + " " + fmt("%.1e", worst));
}

// The attention kernels on bf16-rounded inputs against CPU float64 attention on the same values.
// Through cuda::Attention, as CudaModel calls it (impl cudnn: cuDNN's fused attention).
void attention_case(int head_dim, cuda::kern::AttentionImpl impl, DType type, double tol_out, double tol_grad) {
  const int B = 2, H = 3, T = 150, d = H * head_dim;
  const std::size_t n = static_cast<std::size_t>(B) * T * d;
  const std::string name = std::string(cuda::kern::to_string(impl)) + " " + cuda::to_string(type) + " hd" +
                           std::to_string(head_dim);
  Rng rng(head_dim * 7 + static_cast<int>(impl));
  std::vector<float> host[4];  // q, k, v, dout (rounded to the element type)
  for (auto& h : host) {
    h.resize(n);
    for (auto& x : h) {
      x = static_cast<float>(rng.normal());
      if (type == DType::bf16) x = bf16_round(x);
    }
  }
  const std::size_t es = cuda::dtype_size(type);
  cuda::DeviceBuffer dev[4], out(n * es), dq(n * es), dk(n * es), dv(n * es),
      lse(sizeof(float) * B * H * T), delta(sizeof(float) * B * H * T);
  for (int i = 0; i < 4; ++i) {
    dev[i] = cuda::DeviceBuffer(n * es);
    if (type == DType::bf16) {
      std::vector<std::uint16_t> bits(n);
      for (std::size_t j = 0; j < n; ++j) bits[j] = bf16_bits(host[i][j]);
      ATTNRES_CUDA_CHECK(cudaMemcpy(dev[i].data(), bits.data(), n * 2, cudaMemcpyHostToDevice));
    } else {
      ATTNRES_CUDA_CHECK(cudaMemcpy(dev[i].data(), host[i].data(), n * 4, cudaMemcpyHostToDevice));
    }
  }
  const cuda::kern::AttentionShape shape{B, T, H, head_dim};
  cuda::Attention attention(nullptr, impl);
  attention.forward(out.data(), lse.as<float>(), dev[0].data(), dev[1].data(), dev[2].data(), type, shape);
  attention.backward(dq.data(), dk.data(), dv.data(), dev[3].data(), dev[0].data(), dev[1].data(), dev[2].data(),
                     out.data(), lse.as<float>(), delta.as<float>(), type, shape);
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());
  auto fetch = [&](const cuda::DeviceBuffer& b) {
    std::vector<float> v(n);
    if (type == DType::bf16) {
      std::vector<std::uint16_t> bits(n);
      ATTNRES_CUDA_CHECK(cudaMemcpy(bits.data(), b.data(), n * 2, cudaMemcpyDeviceToHost));
      for (std::size_t j = 0; j < n; ++j) {
        const std::uint32_t u = static_cast<std::uint32_t>(bits[j]) << 16;
        std::memcpy(&v[j], &u, 4);
      }
    } else {
      ATTNRES_CUDA_CHECK(cudaMemcpy(v.data(), b.data(), n * 4, cudaMemcpyDeviceToHost));
    }
    return v;
  };
  // CPU float64 reference. The GPU's out (rounded to the element type) is what its backward
  // used for delta = dout . out, so the reference backward takes the reference out.
  std::vector<double> q(host[0].begin(), host[0].end()), k(host[1].begin(), host[1].end()),
      v(host[2].begin(), host[2].end()), g(host[3].begin(), host[3].end());
  std::vector<double> rout(n), rlse(static_cast<std::size_t>(B) * H * T), rdq(n), rdk(n), rdv(n);
  const kernels::AttentionShape cs{B, T, T, H, head_dim, 0};
  kernels::attention_forward<double>(rout.data(), rlse.data(), q.data(), k.data(), v.data(), cs);
  kernels::attention_backward<double>(rdq.data(), rdk.data(), rdv.data(), g.data(), q.data(), k.data(), v.data(),
                                      rout.data(), rlse.data(), cs);
  const std::vector<float> gout = fetch(out), gdq = fetch(dq), gdk = fetch(dk), gdv = fetch(dv);
  std::vector<float> glse(rlse.size());
  ATTNRES_CUDA_CHECK(cudaMemcpy(glse.data(), lse.data(), glse.size() * 4, cudaMemcpyDeviceToHost));
  double lse_err = 0;  // absolute: the saved softmax stats every backward reads
  for (std::size_t i = 0; i < glse.size(); ++i) lse_err = std::max(lse_err, std::abs(glse[i] - rlse[i]));
  add_row("b", "attention " + name, "out max rel err vs f64", max_rel(gout.data(), rout.data(), n), tol_out);
  add_row("b", "attention " + name, "lse max abs err vs f64", lse_err, tol_out);
  const double eg = std::max({max_rel(gdq.data(), rdq.data(), n), max_rel(gdk.data(), rdk.data(), n),
                              max_rel(gdv.data(), rdv.data(), n)});
  add_row("b", "attention " + name, "dq/dk/dv max rel err vs f64", eg, tol_grad);
}

void check_bf16() {
  std::printf("(b) bf16 mixed precision vs fp32\n");
  using cuda::kern::AttentionImpl;
  for (int hd : {64, 128}) {
    if (!selected("attention")) break;
    try {
      attention_case(hd, AttentionImpl::wmma, DType::bf16, 2e-2, 5e-2);
      attention_case(hd, AttentionImpl::simt, DType::bf16, 2e-2, 5e-2);
      if (cuda::Attention::cudnn_built()) attention_case(hd, AttentionImpl::cudnn, DType::bf16, 2e-2, 5e-2);
    } catch (const std::exception& e) {
      add_error("b", "attention hd" + std::to_string(hd), e.what());
    }
  }
  if (selected("attention")) try {
    attention_case(64, AttentionImpl::simt, DType::f32, 1e-5, 1e-4);
  } catch (const std::exception& e) {
    add_error("b", "attention simt fp32", e.what());
  }
  ModelConfig base;
  base.vocab_size = 512;
  base.d_model = 128;
  base.n_layers = 2;
  base.n_heads = 2;  // head_dim 64: tensor-core attention
  base.mlp_hidden = 320;
  base.n_blocks = 2;
  base.max_seq_len = 100;
  for (const Variant& v : testing::cuda_variants()) {
    if (!selected(v.name)) continue;
    try {
      bf16_case(v.name, variant_config(base, v), 2, 100, 21);
    } catch (const std::exception& e) {
      add_error("b", v.name, e.what());
    }
  }
  if (selected("rd")) try {
    ModelConfig c = variant_config(base, {"rd", ResidualMode::rd, ValueRoute::decoupled});
    c.d_model = 256;  // head_dim 128
    bf16_case("rd hd128", c, 2, 100, 22);
  } catch (const std::exception& e) {
    add_error("b", "rd hd128", e.what());
  }
  // Preset S at initialisation, one batch of 4 x 1024.
  if (g_quick) return;
  for (ResidualMode mode : {ResidualMode::block, ResidualMode::rd}) {
    if (!selected(to_string(mode))) continue;
    const std::string name = "S init " + to_string(mode);
    try {
      ModelConfig c = preset("S").model;
      c.residual = mode;
      const int B = 4, T = c.max_seq_len;
      CudaModel gpu(c, B, T, Precision::fp32, false);
      gpu.attention().set_impl(g_attention);
      gpu.init_params(1);
      const std::vector<std::int32_t> tokens = testing::random_tokens(B, T, c.vocab_size, 5);
      const double l32 = gpu.forward(tokens, B, T);
      gpu.set_precision(Precision::bf16);
      const double l16 = gpu.forward(tokens, B, T);
      add_row("b", name, "|loss bf16 - loss fp32|", std::abs(l16 - l32), 1e-2, false, true,
              "fp32 loss " + fmt("%.5f", l32));
    } catch (const std::exception& e) {
      add_error("b", name, e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// (c) training curves
// ---------------------------------------------------------------------------------------------

void check_training(int steps) {
  std::printf("(c) %d AdamW steps, CPU (Model<float>) vs CUDA fp32\n", steps);
  ModelConfig base;
  base.vocab_size = 64;
  base.d_model = 64;
  base.n_layers = 2;
  base.n_heads = 2;
  base.mlp_hidden = 160;
  base.n_blocks = 2;
  base.max_seq_len = 64;
  const int B = 4, T = 64;
  const double lr = 3e-3, clip = 1.0;
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  for (const Variant& v : testing::cuda_variants()) {
    if (!selected(v.name)) continue;
    try {
      const ModelConfig c = variant_config(base, v);
      Model<float> cpu(c, B, T, true);
      init_params<float>(cpu.layout(), 3, cpu.params());
      AdamW<float> cpu_opt(cpu.layout(), ac);
      CudaModel gpu(c, B, T);
      gpu.attention().set_impl(g_attention);
      gpu.load_params_from_host(cpu.params());
      CudaAdamW gpu_opt(gpu.layout(), ac);
      double worst = 0, first = 0, last = 0, worst_norm = 0;
      for (int s = 0; s < steps; ++s) {
        const std::vector<std::int32_t> tokens = pattern_tokens(B, T, c.vocab_size, 100 + s);
        const double lc = cpu.forward_backward(tokens, B, T);
        const double nc = clip_grad_norm<float>(cpu.grads(), clip);
        cpu_opt.step(cpu.params(), cpu.grads(), lr);
        const double lg = gpu.forward_backward(tokens, B, T);
        const double ng = gpu_opt.step(gpu, lr, clip);
        worst = std::max(worst, std::abs(lg - lc) / std::abs(lc));
        worst_norm = std::max(worst_norm, std::abs(ng - nc) / std::max(nc, 1e-12));
        if (s == 0) first = lc;
        last = lc;
      }
      std::vector<float> gp(static_cast<std::size_t>(gpu.n_params()));
      gpu.copy_params_to_host(gp);
      const double perr = max_rel(gp.data(), cpu.params().data(), gp.size());
      add_row("c", v.name, "loss curve max rel diff", worst, 1e-3, false, true,
              "loss " + fmt("%.4f", first) + " -> " + fmt("%.4f", last) + "; grad-norm diff " +
                  fmt("%.1e", worst_norm) + "; params " + fmt("%.1e", perr));
    } catch (const std::exception& e) {
      add_error("c", v.name, e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// (d) throughput
// ---------------------------------------------------------------------------------------------

double gemm_tflops() {
  const std::int64_t N = 8192;
  cuda::DeviceBuffer a(N * N * 2), b(N * N * 2), c(N * N * 2);
  ATTNRES_CUDA_CHECK(cudaMemset(a.data(), 0, a.bytes()));
  ATTNRES_CUDA_CHECK(cudaMemset(b.data(), 0, b.bytes()));
  cudaStream_t s = nullptr;
  ATTNRES_CUDA_CHECK(cudaStreamCreate(&s));
  double best = 0;
  {
    cuda::Gemm g(s);
    auto run = [&] { g.run(false, true, N, N, N, 1.0f, a.data(), N, b.data(), N, DType::bf16, 0.0f, nullptr, c.data(), N, DType::bf16); };
    for (int i = 0; i < 3; ++i) run();
    cudaEvent_t e0, e1;
    ATTNRES_CUDA_CHECK(cudaEventCreate(&e0));
    ATTNRES_CUDA_CHECK(cudaEventCreate(&e1));
    for (int rep = 0; rep < 3; ++rep) {
      ATTNRES_CUDA_CHECK(cudaEventRecord(e0, s));
      for (int i = 0; i < 10; ++i) run();
      ATTNRES_CUDA_CHECK(cudaEventRecord(e1, s));
      ATTNRES_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      ATTNRES_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::max(best, 10 * 2.0 * double(N) * N * N / (ms * 1e-3) / 1e12);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  cudaStreamDestroy(s);
  return best;
}

struct ArmResult {
  double step_s = 0, tokens_per_s = 0, mfu = 0, loss = 0;
  std::size_t bytes = 0, peak_bytes = 0;
};

ArmResult run_arm(const ModelConfig& c, int B, int T, int warmup, int steps, double peak_tflops) {
  ArmResult r;
  std::size_t free0 = 0, total = 0;
  ATTNRES_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  CudaModel model(c, B, T, Precision::bf16);
  model.attention().set_impl(g_attention);
  model.init_params(1);
  AdamWConfig ac;
  CudaAdamW opt(model.layout(), ac);
  std::vector<double> times;
  for (int s = 0; s < warmup + steps; ++s) {
    const std::vector<std::int32_t> tokens = testing::random_tokens(B, T, c.vocab_size, 1000 + s);
    const auto t0 = std::chrono::steady_clock::now();
    r.loss = model.forward_backward(tokens, B, T);
    opt.step(model, 1e-4, 1.0);
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  std::size_t free1 = 0;
  ATTNRES_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  std::sort(times.begin(), times.end());
  r.step_s = times[times.size() / 2];
  r.tokens_per_s = double(B) * T / r.step_s;
  r.mfu = bench::training_flops_per_token(c, T).total() * r.tokens_per_s / (peak_tflops * 1e12);
  r.bytes = model.device_bytes() + opt.device_bytes();
  r.peak_bytes = free0 > free1 ? free0 - free1 : 0;
  return r;
}

void check_throughput(int warmup, int steps, bool with_m, double given_peak) {
  std::printf("(d) throughput, bf16 (median of %d steps after %d warm-up; a step = forward_backward + clip + AdamW)\n",
              steps, warmup);
  const std::string att = cuda::Attention(nullptr, g_attention).choice(DType::bf16, 64);
  add_info("d", "attention", "--attention " + std::string(cuda::kern::to_string(g_attention)) + ": " + att +
                                 (att == "cudnn" ? " (cuDNN " + cuda::Attention::cudnn_version() + ")" : ""));
  double peak = given_peak;
  try {
    if (peak > 0) {
      add_info("d", "bf16 GEMM rate", fmt("%.1f TFLOP/s (given by --peak-tflops, not measured)", peak));
    } else {
      peak = gemm_tflops();
      add_info("d", "bf16 GEMM 8192^3", fmt("%.1f TFLOP/s (cuBLASLt, bf16 in/out, fp32 accumulation)", peak));
    }
  } catch (const std::exception& e) {
    add_error("d", "bf16 GEMM", e.what());
    return;
  }
  std::vector<std::string> presets = {"S"};
  if (with_m) presets.push_back("M");
  for (const std::string& name : presets) {
    try {
      const TrainConfig tc = preset(name);
      ArmResult arms[2];
      const ResidualMode modes[2] = {ResidualMode::block, ResidualMode::rd};
      for (int i = 0; i < 2; ++i) {
        ModelConfig c = tc.model;
        c.residual = modes[i];
        arms[i] = run_arm(c, tc.batch_size, tc.seq_len, warmup, steps, peak);
        add_info("d", name + " " + to_string(modes[i]),
                 fmt("%.0f tokens/s", arms[i].tokens_per_s) + fmt(", step %.1f ms", arms[i].step_s * 1e3) +
                     fmt(", MFU %.1f%%", 100 * arms[i].mfu) + fmt(", device memory %.2f GB", arms[i].bytes / 1e9) +
                     fmt(" (cudaMemGetInfo %.2f GB)", arms[i].peak_bytes / 1e9) + fmt(", loss %.3f", arms[i].loss));
      }
      if (name == "S") add_row("d", "S block", "MFU (bf16 GEMM rate)", arms[0].mfu, 0.40, true, false);
      add_row("d", name + " rd/block", "step-time ratio", arms[1].step_s / arms[0].step_s, 1.02, false, false);
      add_row("d", name + " rd/block", "device-memory ratio", double(arms[1].bytes) / double(arms[0].bytes), 1.02,
              false, false);
      // The baseline families' arms that train on CUDA, against block (reported, no target; preset
      // S only, to spare the GPU's time).
      for (const std::string& arm : baseline_arms()) {
        if (name != "S" || !selected(arm)) continue;
        try {
          const ArmResult r = run_arm(apply_arm(tc.model, arm), tc.batch_size, tc.seq_len, warmup, steps, peak);
          add_info("d", name + " " + arm,
                   fmt("%.0f tokens/s", r.tokens_per_s) + fmt(", step %.1f ms", r.step_s * 1e3) +
                       fmt(", MFU %.1f%%", 100 * r.mfu) + fmt(", device memory %.2f GB", r.bytes / 1e9) +
                       fmt(", loss %.3f", r.loss) + fmt("; vs block: step x%.3f", r.step_s / arms[0].step_s) +
                       fmt(", memory x%.3f", double(r.bytes) / double(arms[0].bytes)));
        } catch (const std::exception& e) {
          add_error("d", name + " " + arm, e.what());
        }
      }
    } catch (const std::exception& e) {
      add_error("d", name, e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Timing on the device
// ---------------------------------------------------------------------------------------------

// Times work on its own stream: the best of `reps` runs of f, after `warmups` untimed ones (the
// bandwidth checks (r) and (e)).
class EventTimer {
 public:
  EventTimer(int reps, int warmups) : reps_(reps), warmups_(warmups) {
    ATTNRES_CUDA_CHECK(cudaStreamCreate(&stream_));
    ATTNRES_CUDA_CHECK(cudaEventCreate(&e0_));
    ATTNRES_CUDA_CHECK(cudaEventCreate(&e1_));
  }
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(stream_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  cudaStream_t stream() const { return stream_; }
  double best_ms(const std::function<void()>& f) {
    for (int w = 0; w < warmups_; ++w) f();
    float best = 0;
    for (int rep = 0; rep < reps_; ++rep) {
      ATTNRES_CUDA_CHECK(cudaEventRecord(e0_, stream_));
      f();
      ATTNRES_CUDA_CHECK(cudaEventRecord(e1_, stream_));
      ATTNRES_CUDA_CHECK(cudaEventSynchronize(e1_));
      float ms = 0;
      ATTNRES_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
      best = rep == 0 ? ms : std::min(best, ms);
    }
    return static_cast<double>(best);
  }

 private:
  int reps_, warmups_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// (r) the depth-read backward of one block, batched against one read at a time (issue #49)
// ---------------------------------------------------------------------------------------------

// One block's reads in backward order (read i is the block's sublayer S-1-i): each reads the n_c
// completed sources and, except the block's first sublayer, the partial sum before it; with rd,
// the attention sublayers' reads have two routes and a separate value route. Both ways run from
// the same inputs: one read at a time (n_deferred = 0, each read's second pass over all its
// sources) and batched (the reads' kernels, then the group's pass over the shared sources).
struct ReadBench {
  double ms_single = 0, ms_batched = 0, ms_copy = 0;                  // best of the repetitions
  double bytes_single = 0, bytes_batched = 0, bytes_once = 0, bytes_copy = 0;  // moved per run
  double source_diff = 0;  // max |source gradient, batched - single| (same arithmetic: 0)
  double param_diff = 0;   // query / key-norm gradients, max rel (summed in another order)
};

ReadBench read_group_bench(std::int64_t n_tok, int d, int n_c, int S, bool rd, int reps) {
  namespace kern = cuda::kern;
  using cuda::DeviceBuffer;
  const std::size_t row = static_cast<std::size_t>(n_tok) * d;
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  auto fill = [&](DeviceBuffer& b, std::size_t n, float lo, float hi) {
    std::vector<float> h(n);
    for (float& x : h) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      x = lo + (hi - lo) * static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
    }
    b = DeviceBuffer(n * sizeof(float));
    ATTNRES_CUDA_CHECK(cudaMemcpy(b.data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  };
  const int n_src = n_c + S - 1;  // the shared sources, then the partial sums P_0 .. P_{S-2}
  std::vector<DeviceBuffer> src(static_cast<std::size_t>(n_src)), dsrc(src.size());
  for (auto& b : src) fill(b, row, -1, 1);
  for (auto& b : dsrc) b = DeviceBuffer(row * sizeof(float));
  struct Read {
    DeviceBuffer dout[2], rms, logits, coef, scratch, q[2], gamma, dq[2], dgamma, table, dtable;
    kern::DepthReadBackward a;
  };
  std::vector<Read> reads(static_cast<std::size_t>(S));
  double once = 0;  // floats a token: every tensor once
  for (int i = 0; i < S; ++i) {
    Read& r = reads[static_cast<std::size_t>(i)];
    const int m = S - 1 - i;  // the sublayer in the block
    const bool two = rd && m % 2 == 0;
    const int n = n_c + (m > 0 ? 1 : 0), R = two ? 2 : 1;
    std::vector<const float*> t;
    std::vector<float*> dt;
    for (int s = 0; s < n_c; ++s) {
      t.push_back(src[static_cast<std::size_t>(s)].as<float>());
      dt.push_back(dsrc[static_cast<std::size_t>(s)].as<float>());
    }
    if (m > 0) {
      t.push_back(src[static_cast<std::size_t>(n_c + m - 1)].as<float>());
      dt.push_back(dsrc[static_cast<std::size_t>(n_c + m - 1)].as<float>());
    }
    r.table = DeviceBuffer(t.size() * sizeof(float*));
    r.dtable = DeviceBuffer(t.size() * sizeof(float*));
    ATTNRES_CUDA_CHECK(cudaMemcpy(r.table.data(), t.data(), t.size() * sizeof(float*), cudaMemcpyHostToDevice));
    ATTNRES_CUDA_CHECK(cudaMemcpy(r.dtable.data(), dt.data(), dt.size() * sizeof(float*), cudaMemcpyHostToDevice));
    for (int ro = 0; ro < R; ++ro) {
      fill(r.dout[ro], row, -1, 1);
      fill(r.q[ro], static_cast<std::size_t>(d), -0.2f, 0.2f);
      fill(r.dq[ro], static_cast<std::size_t>(d), 0, 0);
    }
    fill(r.gamma, static_cast<std::size_t>(d), 0.5f, 1.5f);
    fill(r.dgamma, static_cast<std::size_t>(d), 0, 0);
    fill(r.rms, static_cast<std::size_t>(n_tok) * n, 0.5f, 1.5f);
    fill(r.logits, static_cast<std::size_t>(n_tok) * n * R, -2, 2);
    r.coef = DeviceBuffer(static_cast<std::size_t>(n_tok) * n_c * kern::kDepthReadCoefs * sizeof(float));
    r.scratch = DeviceBuffer(static_cast<std::size_t>(kern::depth_read_scratch_floats(n_tok, d)) * sizeof(float));
    kern::DepthReadBackward& a = r.a;
    a.sources = r.table.as<const float* const>();
    a.dsources = r.dtable.as<float* const>();
    a.n_sources = n;
    a.n_tok = n_tok;
    a.d = d;
    a.gamma = r.gamma.as<float>();
    a.n_routes = R;
    for (int ro = 0; ro < R; ++ro) {
      a.queries[ro] = r.q[ro].as<float>();
      a.dout[ro] = r.dout[ro].as<float>();
      a.dqueries[ro] = r.dq[ro].as<float>();
    }
    a.rms = r.rms.as<float>();
    a.logits = r.logits.as<float>();
    a.dgamma = r.dgamma.as<float>();
    a.scratch = r.scratch.as<float>();
    a.coef = r.coef.as<float>();
    // Floats a token. One at a time: the output gradients, rms and logits, pass 1 over every
    // source, pass 2 reading each source and its gradient and writing the gradient.
    const double small = n * (1.0 + R) / d;
    r.a.n_deferred = 0;
    once += R + small;
  }
  // The batched way's and the single way's floats a token (rows of d; the per-token arrays
  // small/d), and each tensor once: the output gradients, the sources, their gradients read and
  // written.
  double single = 0, batched = 0;
  for (const Read& r : reads) {
    const double n = r.a.n_sources, R = r.a.n_routes, small = n * (1 + R) / d;
    single += R + small + n + 3 * n;
    batched += R + small + n + 3 * (n - n_c) + double(n_c) * kern::kDepthReadCoefs / d;  // + coef write
    batched += R + double(n_c) * kern::kDepthReadCoefs / d;                                // group: g, coef
  }
  batched += 3.0 * n_c;
  once += 3.0 * n_src;
  ReadBench out;
  const double bytes_row = 4.0 * static_cast<double>(row);
  out.bytes_single = single * bytes_row;
  out.bytes_batched = batched * bytes_row;
  out.bytes_once = once * bytes_row;

  EventTimer timer(reps, 0);
  const cudaStream_t stream = timer.stream();
  auto run = [&](bool batch) {
    kern::DepthReadGroup g;
    for (Read& r : reads) {
      r.a.n_deferred = batch ? n_c : 0;
      kern::depth_read_backward(r.a, stream);
      g.reads[g.n_reads++] = r.a;
    }
    if (batch) kern::depth_read_group_backward(g, stream);
  };
  // Each way once from zeroed gradients, to compare them; then timed (the gradients grow).
  std::vector<std::vector<float>> grads[2];
  for (int way = 0; way < 2; ++way) {
    for (auto& b : dsrc) ATTNRES_CUDA_CHECK(cudaMemsetAsync(b.data(), 0, b.bytes(), stream));
    for (Read& r : reads) {
      ATTNRES_CUDA_CHECK(cudaMemsetAsync(r.dgamma.data(), 0, r.dgamma.bytes(), stream));
      for (int ro = 0; ro < r.a.n_routes; ++ro)
        ATTNRES_CUDA_CHECK(cudaMemsetAsync(r.dq[ro].data(), 0, r.dq[ro].bytes(), stream));
    }
    run(way == 1);
    ATTNRES_CUDA_CHECK(cudaStreamSynchronize(stream));
    auto copy = [&](const DeviceBuffer& b) {
      std::vector<float> h(b.bytes() / sizeof(float));
      ATTNRES_CUDA_CHECK(cudaMemcpy(h.data(), b.data(), b.bytes(), cudaMemcpyDeviceToHost));
      grads[way].push_back(std::move(h));
    };
    for (const auto& b : dsrc) copy(b);
    for (const Read& r : reads) {
      copy(r.dgamma);
      for (int ro = 0; ro < r.a.n_routes; ++ro) copy(r.dq[ro]);
    }
  }
  for (std::size_t i = 0; i < grads[0].size(); ++i) {
    const std::vector<float>&x = grads[0][i], &y = grads[1][i];
    if (i < dsrc.size()) {
      for (std::size_t k = 0; k < x.size(); ++k)
        out.source_diff = std::max(out.source_diff, static_cast<double>(std::abs(x[k] - y[k])));
    } else {
      out.param_diff = std::max(out.param_diff, max_rel(y.data(), x.data(), x.size()));
    }
  }
  for (int w = 0; w < 2; ++w) run(w == 1);  // warm-up
  out.ms_single = timer.best_ms([&] { run(false); });
  out.ms_batched = timer.best_ms([&] { run(true); });
  // Device-to-device copy of the same size as the sources (read + write counted).
  {
    DeviceBuffer a(row * sizeof(float) * 4), b(a.bytes());
    ATTNRES_CUDA_CHECK(cudaMemsetAsync(a.data(), 0, a.bytes(), stream));
    auto copy = [&] {
      ATTNRES_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), a.bytes(), cudaMemcpyDeviceToDevice, stream));
    };
    copy();
    out.ms_copy = timer.best_ms(copy);
    out.bytes_copy = 2.0 * static_cast<double>(a.bytes());
  }
  return out;
}

// Preset S and M's shape (one block in the middle: n_c = n_blocks / 2 + 1 sources shared, the
// block's sublayers per block reads), block and rd; with --quick a small case (the emulator).
void check_read_bench(bool with_m) {
  std::printf("(r) depth-read backward of one block: batched vs one read at a time (issue #49)\n");
  struct Case {
    std::string name;
    std::int64_t n_tok;
    int d, n_c, S;
    bool rd;
  };
  std::vector<Case> cases;
  if (g_quick) {
    cases = {{"small block", 200, 64, 3, 4, false}, {"small rd", 200, 64, 3, 4, true}};
  } else {
    for (const std::string name : {"S", "M"}) {
      if (name == "M" && !with_m) continue;
      const TrainConfig tc = preset(name);
      const ModelConfig& c = tc.model;
      const std::int64_t n_tok = std::int64_t(tc.batch_size) * tc.seq_len;
      const int S = c.n_sublayers() / c.n_blocks, n_c = c.n_blocks / 2 + 1;
      cases.push_back({name + " block", n_tok, c.d_model, n_c, S, false});
      cases.push_back({name + " rd", n_tok, c.d_model, n_c, S, true});
    }
  }
  for (const Case& k : cases) {
    try {
      const ReadBench b = read_group_bench(k.n_tok, k.d, k.n_c, k.S, k.rd, g_quick ? 1 : 10);
      add_row("r", k.name, "source grads, batched - single", b.source_diff, 0.0, false, true,
              std::to_string(k.S) + " reads, " + std::to_string(k.n_c) + " shared sources");
      add_row("r", k.name, "query/norm grads max rel diff", b.param_diff, 1e-5, false, true, "summed in another order");
      const double copy_bw = b.bytes_copy / (b.ms_copy * 1e-3);
      const double bw_single = b.bytes_single / (b.ms_single * 1e-3), bw_batched = b.bytes_batched / (b.ms_batched * 1e-3);
      add_info("r", k.name,
               fmt("copy %.0f GB/s; ", copy_bw / 1e9) + fmt("single %.3f ms, ", b.ms_single) +
                   fmt("%.2f GB, ", b.bytes_single / 1e9) + fmt("%.0f GB/s; ", bw_single / 1e9) +
                   fmt("batched %.3f ms, ", b.ms_batched) + fmt("%.2f GB, ", b.bytes_batched / 1e9) +
                   fmt("%.0f GB/s; ", bw_batched / 1e9) + fmt("each tensor once %.2f GB", b.bytes_once / 1e9) +
                   fmt("; bytes single/batched %.2f", b.bytes_single / b.bytes_batched) +
                   fmt(", time single/batched %.2f", b.ms_single / b.ms_batched));
      add_row("r", k.name, "batched bytes/s / copy bytes/s", bw_batched / copy_bw, 0.70, true, false,
              fmt("single: %.2f", bw_single / copy_bw));
    } catch (const std::exception& e) {
      add_error("r", k.name, e.what());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// (e) issue #49's bandwidth-bound rest: RoPE of q and k, SwiGLU forward and backward and the
// cross-entropy, the kernels before against the new ones, side by side
// ---------------------------------------------------------------------------------------------

// The sizes of one training step's calls: n_tok = batch x seq tokens, the attention's d = n_heads
// x head_dim, the MLP's hidden width; the cross-entropy runs on chunks of ce_rows rows. fp32:
// RoPE and SwiGLU in fp32 as well as bf16 (M: bf16 only, to spare the device's time).
struct BwCase {
  std::string name;
  std::int64_t n_tok = 0;
  int seq = 0, d = 0, n_heads = 0, hidden = 0, vocab = 0;
  std::int64_t ce_rows = 0;
  bool fp32 = true;
};

// Device data from a seeded generator: a block of at most 2^20 values (rounded to the type),
// repeated over the buffer (the kernels' speed does not depend on the values).
cuda::DeviceBuffer bw_fill(std::int64_t n, DType type, std::uint64_t seed, float lo, float hi) {
  const std::size_t es = cuda::dtype_size(type), block = static_cast<std::size_t>(std::min<std::int64_t>(n, 1 << 20));
  Rng rng(seed);
  std::vector<float> f(block);
  std::vector<std::uint16_t> h(block);
  for (std::size_t i = 0; i < block; ++i) {
    f[i] = static_cast<float>(lo + (hi - lo) * rng.uniform());
    h[i] = bf16_bits(f[i]);
  }
  const void* src = type == DType::f32 ? static_cast<const void*>(f.data()) : static_cast<const void*>(h.data());
  cuda::DeviceBuffer b(static_cast<std::size_t>(n) * es);
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); i += block) {
    const std::size_t count = std::min(block, static_cast<std::size_t>(n) - i);
    ATTNRES_CUDA_CHECK(
        cudaMemcpy(static_cast<unsigned char*>(b.data()) + i * es, src, count * es, cudaMemcpyHostToDevice));
  }
  return b;
}

cuda::DeviceBuffer bw_copy(const cuda::DeviceBuffer& from) {
  cuda::DeviceBuffer b(from.bytes());
  ATTNRES_CUDA_CHECK(cudaMemcpy(b.data(), from.data(), from.bytes(), cudaMemcpyDeviceToDevice));
  return b;
}

// Elements (of es bytes) that differ between two device buffers of the same size.
std::int64_t bw_mismatches(const cuda::DeviceBuffer& a, const cuda::DeviceBuffer& b, std::size_t es) {
  std::vector<unsigned char> x(a.bytes()), y(b.bytes());
  ATTNRES_CUDA_CHECK(cudaMemcpy(x.data(), a.data(), x.size(), cudaMemcpyDeviceToHost));
  ATTNRES_CUDA_CHECK(cudaMemcpy(y.data(), b.data(), y.size(), cudaMemcpyDeviceToHost));
  std::int64_t n = 0;
  for (std::size_t i = 0; i < x.size(); i += es) n += std::memcmp(x.data() + i, y.data() + i, es) != 0 ? 1 : 0;
  return n;
}

// One kernel's line: the time, bytes and rate of the old and the new way, the rates as a
// fraction of the device-to-device copy's; with timings that mean something (not --quick) the
// new way's fraction against the 70% target of (r) (reported, fatal only with --strict).
void bw_report(const std::string& name, const std::string& kernel, double ms_old, double bytes_old, double ms_new,
               double bytes_new, double copy_bw) {
  const double bw_old = bytes_old / (ms_old * 1e-3), bw_new = bytes_new / (ms_new * 1e-3);
  add_info("e", name + " " + kernel,
           fmt("old %.3f ms, ", ms_old) + fmt("%.3f GB, ", bytes_old / 1e9) + fmt("%.0f GB/s", bw_old / 1e9) +
               fmt(" (%.0f%% of copy); ", 100 * bw_old / copy_bw) + fmt("new %.3f ms, ", ms_new) +
               fmt("%.3f GB, ", bytes_new / 1e9) + fmt("%.0f GB/s", bw_new / 1e9) +
               fmt(" (%.0f%% of copy); ", 100 * bw_new / copy_bw) + fmt("time old/new %.2f", ms_old / ms_new));
  if (!g_quick)
    add_row("e", name + " " + kernel, "new bytes/s / copy bytes/s", bw_new / copy_bw, 0.70, true, false,
            fmt("old: %.2f", bw_old / copy_bw));
}

void bw_rope_swiglu(const BwCase& k, DType type, EventTimer& timer, double copy_bw) {
  namespace kern = cuda::kern;
  const std::string name = k.name + " " + cuda::to_string(type);
  const std::size_t es = cuda::dtype_size(type);
  const cudaStream_t st = timer.stream();
  // RoPE of q and k: the old way (two launches, one element a thread) and the new from the same
  // inputs, forward then inverse (the backward's), compared bit for bit after each.
  {
    const int half = k.d / k.n_heads / 2;
    const cuda::DeviceBuffer q = bw_fill(k.n_tok * k.d, type, 11, -2, 2), kk = bw_fill(k.n_tok * k.d, type, 12, -2, 2);
    const cuda::DeviceBuffer cos = bw_fill(std::int64_t(k.seq) * half, DType::f32, 13, -1, 1),
                             sin = bw_fill(std::int64_t(k.seq) * half, DType::f32, 14, -1, 1);
    cuda::DeviceBuffer qo = bw_copy(q), ko = bw_copy(kk), qn = bw_copy(q), kn = bw_copy(kk);
    auto rope = [&](cuda::DeviceBuffer& a, cuda::DeviceBuffer& b, bool inverse, bool scalar) {
      kern::rope(a.data(), b.data(), type, k.n_tok, k.seq, k.n_heads, k.d / k.n_heads, cos.as<float>(),
                 sin.as<float>(), inverse, st, scalar);
    };
    for (const bool inverse : {false, true}) {
      rope(qo, ko, inverse, true);
      rope(qn, kn, inverse, false);
      ATTNRES_CUDA_CHECK(cudaStreamSynchronize(st));
      add_row("e", name + " rope", std::string(inverse ? "inverse" : "forward") + " q,k elements new != old",
              static_cast<double>(bw_mismatches(qo, qn, es) + bw_mismatches(ko, kn, es)), 0.0, false, true,
              "head_dim " + std::to_string(k.d / k.n_heads));
    }
    const double tensors = 4.0 * static_cast<double>(k.n_tok) * k.d * es, table = 2.0 * k.seq * half * 4;
    const double ms_old = timer.best_ms([&] { rope(qo, ko, false, true); });
    const double ms_new = timer.best_ms([&] { rope(qn, kn, false, false); });
    bw_report(name, "rope q+k", ms_old, tensors + 2 * table, ms_new, tensors + table, copy_bw);
  }
  // SwiGLU forward and backward.
  {
    const std::int64_t n = k.n_tok * k.hidden;
    const cuda::DeviceBuffer gate = bw_fill(n, type, 21, -4, 4), up = bw_fill(n, type, 22, -2, 2),
                             dact = bw_fill(n, type, 23, -1, 1);
    cuda::DeviceBuffer out[2][3];  // [old, new][act, dgate, dup]
    for (auto& way : out)
      for (auto& b : way) b = cuda::DeviceBuffer(static_cast<std::size_t>(n) * es);
    auto forward = [&](int way) {
      kern::swiglu_forward(out[way][0].data(), gate.data(), up.data(), type, n, st, way == 0);
    };
    auto backward = [&](int way) {
      kern::swiglu_backward(out[way][1].data(), out[way][2].data(), dact.data(), gate.data(), up.data(), type, n, st,
                            way == 0);
    };
    for (int way = 0; way < 2; ++way) {
      forward(way);
      backward(way);
    }
    ATTNRES_CUDA_CHECK(cudaStreamSynchronize(st));
    add_row("e", name + " swiglu", "forward act elements new != old",
            static_cast<double>(bw_mismatches(out[0][0], out[1][0], es)), 0.0, false, true,
            std::to_string(n) + " elements");
    add_row("e", name + " swiglu", "backward dgate,dup elements new != old",
            static_cast<double>(bw_mismatches(out[0][1], out[1][1], es) + bw_mismatches(out[0][2], out[1][2], es)),
            0.0);
    const double bytes = static_cast<double>(n) * es;
    bw_report(name, "swiglu fwd", timer.best_ms([&] { forward(0); }), 3 * bytes, timer.best_ms([&] { forward(1); }),
              3 * bytes, copy_bw);
    bw_report(name, "swiglu bwd", timer.best_ms([&] { backward(0); }), 5 * bytes,
              timer.best_ms([&] { backward(1); }), 5 * bytes, copy_bw);
  }
}

// Row losses and logit gradients of the first `rows` rows in float64 from the logits as stored
// (fp32, or bf16 bits), for the cross-entropy rows of (e).
void bw_ce_reference(const cuda::DeviceBuffer& logits, DType type, const std::vector<std::int32_t>& targets,
                     std::int64_t rows, int vocab, double scale, std::vector<double>& loss, std::vector<double>& grad) {
  const std::size_t n = static_cast<std::size_t>(rows) * vocab;
  std::vector<float> x(n);
  if (type == DType::f32) {
    ATTNRES_CUDA_CHECK(cudaMemcpy(x.data(), logits.data(), n * 4, cudaMemcpyDeviceToHost));
  } else {
    std::vector<std::uint16_t> bits(n);
    ATTNRES_CUDA_CHECK(cudaMemcpy(bits.data(), logits.data(), n * 2, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t u = static_cast<std::uint32_t>(bits[i]) << 16;
      std::memcpy(&x[i], &u, 4);
    }
  }
  loss.assign(static_cast<std::size_t>(rows), 0);
  grad.assign(n, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x.data() + r * vocab;
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < vocab; ++j) m = std::max(m, static_cast<double>(row[j]));
    for (int j = 0; j < vocab; ++j) sum += std::exp(row[j] - m);
    const double lse = m + std::log(sum);
    const std::int32_t t = targets[static_cast<std::size_t>(r)];
    loss[static_cast<std::size_t>(r)] = lse - row[t];
    for (int j = 0; j < vocab; ++j)
      grad[static_cast<std::size_t>(r * vocab + j)] = scale * (std::exp(row[j] - lse) - (j == t ? 1.0 : 0.0));
  }
}

// The device's row losses (first `rows`) and bf16 gradients (first rows x vocab) as doubles.
void bw_ce_fetch(const cuda::DeviceBuffer& loss, const cuda::DeviceBuffer& dlogits, std::int64_t rows, int vocab,
                 std::vector<double>& loss_out, std::vector<double>& grad_out) {
  loss_out.assign(static_cast<std::size_t>(rows), 0);
  ATTNRES_CUDA_CHECK(cudaMemcpy(loss_out.data(), loss.data(), loss_out.size() * 8, cudaMemcpyDeviceToHost));
  std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows) * vocab);
  ATTNRES_CUDA_CHECK(cudaMemcpy(bits.data(), dlogits.data(), bits.size() * 2, cudaMemcpyDeviceToHost));
  grad_out.resize(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(bits[i]) << 16;
    float f = 0;
    std::memcpy(&f, &u, 4);
    grad_out[i] = f;
  }
}

// The cross-entropy of one chunk of ce_rows rows in bf16 mode. Before issue #49: the LM head wrote
// fp32 logits, the kernel read them (twice) and wrote bf16 gradients; now the LM head writes bf16
// logits (the same values rounded) and the kernel reads them (twice) and writes the bf16 gradients
// over them. Each way against float64 on its own logits (the first rows); the mean change of the
// row loss that the rounding of the logits makes; the times of the kernel and of the LM head's
// forward GEMM writing fp32 or bf16.
void bw_cross_entropy(const BwCase& k, EventTimer& timer, double copy_bw) {
  namespace kern = cuda::kern;
  using cuda::DeviceBuffer;
  const std::int64_t rows = k.ce_rows, n = rows * k.vocab;
  const int V = k.vocab;
  const cudaStream_t st = timer.stream();
  const float scale = 1.0f / static_cast<float>(k.n_tok);
  DeviceBuffer l32 = bw_fill(n, DType::f32, 31, -8, 8), l16 = bw_fill(n, DType::bf16, 31, -8, 8);
  std::vector<std::int32_t> targets(static_cast<std::size_t>(rows));
  Rng rng(32);
  for (auto& t : targets) t = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(V)));
  DeviceBuffer tgt(targets.size() * 4), loss_old(static_cast<std::size_t>(rows) * 8), loss_new(loss_old.bytes()),
      dl_old(static_cast<std::size_t>(n) * 2);
  ATTNRES_CUDA_CHECK(cudaMemcpy(tgt.data(), targets.data(), tgt.bytes(), cudaMemcpyHostToDevice));
  const auto* t = tgt.as<std::int32_t>();
  auto old_way = [&] {
    kern::cross_entropy(l32.data(), DType::f32, t, rows, V, loss_old.as<double>(), dl_old.data(), DType::bf16, scale,
                        st);
  };
  auto new_way = [&] {
    kern::cross_entropy(l16.data(), DType::bf16, t, rows, V, loss_new.as<double>(), l16.data(), DType::bf16, scale,
                        st);
  };
  const std::int64_t ref_rows = std::min<std::int64_t>(rows, 16);
  std::vector<double> ref_loss[2], ref_grad[2];
  bw_ce_reference(l32, DType::f32, targets, ref_rows, V, scale, ref_loss[0], ref_grad[0]);
  bw_ce_reference(l16, DType::bf16, targets, ref_rows, V, scale, ref_loss[1], ref_grad[1]);
  old_way();
  new_way();
  ATTNRES_CUDA_CHECK(cudaStreamSynchronize(st));
  const char* what[2] = {"old (fp32 logits)", "new (bf16 logits)"};
  std::vector<double> loss[2], grad[2];
  bw_ce_fetch(loss_old, dl_old, ref_rows, V, loss[0], grad[0]);
  bw_ce_fetch(loss_new, l16, ref_rows, V, loss[1], grad[1]);
  for (int w = 0; w < 2; ++w) {
    double err = 0;
    for (std::size_t r = 0; r < loss[w].size(); ++r) err = std::max(err, std::abs(loss[w][r] - ref_loss[w][r]));
    add_row("e", k.name + " ce", std::string(what[w]) + " loss max abs err", err, 1e-4, false, true,
            "vs f64, " + std::to_string(ref_rows) + " rows of " + std::to_string(V));
    add_row("e", k.name + " ce", std::string(what[w]) + " dlogits max rel err",
            max_rel(grad[w].data(), ref_grad[w].data(), grad[w].size()), 1e-2, false, true, "bf16 gradients");
  }
  {
    std::vector<double> all[2];
    for (int w = 0; w < 2; ++w) {
      all[w].resize(static_cast<std::size_t>(rows));
      ATTNRES_CUDA_CHECK(cudaMemcpy(all[w].data(), (w == 0 ? loss_old : loss_new).data(), all[w].size() * 8,
                                    cudaMemcpyDeviceToHost));
    }
    double diff = 0, mean = 0;
    for (std::size_t r = 0; r < all[0].size(); ++r) {
      diff += all[1][r] - all[0][r];
      mean += all[0][r];
    }
    add_info("e", k.name + " ce", fmt("mean row loss %.6f (fp32 logits); ", mean / rows) +
                                      fmt("bf16 logits change it by %.2e on average", diff / rows));
  }
  const double elems = static_cast<double>(n);
  const double ms_old = timer.best_ms(old_way), ms_new = timer.best_ms(new_way);
  bw_report(k.name, "cross-entropy", ms_old, elems * (4 + 4 + 2), ms_new, elems * (2 + 2 + 2), copy_bw);
  // The LM head's forward GEMM [rows, d] x [V, d]^T, bf16 operands, writing fp32 (before) or bf16.
  const DeviceBuffer x = bw_fill(rows * k.d, DType::bf16, 33, -1, 1),
                     w = bw_fill(std::int64_t(V) * k.d, DType::bf16, 34, -0.1f, 0.1f);
  cuda::Gemm gemm(st);
  auto head = [&](DeviceBuffer& y, DType type) {
    return timer.best_ms([&] { gemm.linear_forward(y.data(), type, x.data(), w.data(), DType::bf16, rows, k.d, V); });
  };
  const double gemm_old = head(l32, DType::f32), gemm_new = head(l16, DType::bf16);
  add_info("e", k.name + " lm-head GEMM",
           fmt("forward writing fp32 logits %.3f ms, ", gemm_old) + fmt("bf16 %.3f ms", gemm_new) +
               fmt("; with the cross-entropy: old %.3f ms", gemm_old + ms_old) +
               fmt(", new %.3f ms", gemm_new + ms_new) + " (" + std::to_string(rows) + " rows)");
}

// With --quick small shapes for the emulator (tails and the scalar fallbacks: head_dim 12, a
// vocabulary not a multiple of 8); else presets S and M (unless --no-m) at their batch.
void check_bandwidth_rest(bool with_m) {
  std::printf("(e) RoPE q+k, SwiGLU and cross-entropy: the kernels before vs the new ones (issue #49)\n");
  std::vector<BwCase> cases;
  if (g_quick) {
    cases = {{"small", 201, 67, 64, 2, 323, 1000, 67, true}, {"odd", 30, 10, 36, 3, 50, 1003, 30, true}};
  } else {
    for (const std::string name : {"S", "M"}) {
      if (name == "M" && !with_m) continue;
      const TrainConfig tc = preset(name);
      const ModelConfig& c = tc.model;
      cases.push_back({name, std::int64_t(tc.batch_size) * tc.seq_len, tc.seq_len, c.d_model, c.n_heads,
                       c.mlp_hidden, c.vocab_size, 4096, name == "S"});
    }
  }
  EventTimer timer(g_quick ? 1 : 10, 1);
  for (const BwCase& k : cases) {
    try {
      // The device-to-device copy rate (read + written) of a buffer the size of the SwiGLU tensors.
      double copy_bw = 0;
      {
        const std::size_t bytes = static_cast<std::size_t>(k.n_tok) * k.hidden * 2;
        cuda::DeviceBuffer a(bytes), b(bytes);
        ATTNRES_CUDA_CHECK(cudaMemset(a.data(), 0, bytes));
        const double ms = timer.best_ms([&] {
          ATTNRES_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, timer.stream()));
        });
        copy_bw = 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
        add_info("e", k.name, fmt("copy %.0f GB/s", copy_bw / 1e9) + fmt(" (%.3f GB)", 2.0 * bytes / 1e9) +
                                  (g_quick ? "; timings meaningless here (--quick)" : ""));
      }
      if (k.fp32) bw_rope_swiglu(k, DType::f32, timer, copy_bw);
      bw_rope_swiglu(k, DType::bf16, timer, copy_bw);
      bw_cross_entropy(k, timer, copy_bw);
    } catch (const std::exception& e) {
      add_error("e", k.name, e.what());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string only = "abcd";
  int train_steps = 20, perf_warmup = 2, perf_steps = 5;
  bool with_m = true;
  double peak_tflops = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--only") only = value();
    else if (a == "--strict") g_strict = true;
    else if (a == "--steps") train_steps = std::stoi(value());
    else if (a == "--perf-steps") perf_steps = std::stoi(value());
    else if (a == "--perf-warmup") perf_warmup = std::stoi(value());
    else if (a == "--peak-tflops") peak_tflops = std::stod(value());
    else if (a == "--no-m") with_m = false;
    else if (a == "--quick") g_quick = true;
    else if (a == "--modes") g_modes = split_list(value());
    else if (a == "--attention") {
      try {
        g_attention = cuda::kern::parse_attention_impl(value());
        const cuda::Attention probe(nullptr, g_attention);  // refuses cudnn in a build without it
      } catch (const std::exception& e) {
        std::fprintf(stderr, "attnres_gpu_check: %s\n", e.what());
        return 2;
      }
    }
    else {
      std::printf(
          "usage: attnres_gpu_check [--only abcd] [--strict] [--steps 20] [--perf-steps 5] [--perf-warmup 2]\n"
          "                         [--peak-tflops X] [--no-m] [--quick] [--attention auto|cudnn|wmma|simt]\n"
          "                         [--modes NAME,...]\n"
          "  --only      which checks to run (letters a-d; r: the depth-read backward's bandwidth, e: RoPE,\n"
          "              SwiGLU and cross-entropy before / after issue #49, side by side)\n"
          "  --strict    performance targets (d) fail the run when missed\n"
          "  --steps     AdamW steps of (c)\n"
          "  --perf-steps, --perf-warmup  timed and untimed steps per arm in (d) (a profiler run: 1 and 0)\n"
          "  --peak-tflops  the bf16 GEMM rate for (d)'s MFU instead of measuring it (a profiler run)\n"
          "  --no-m      throughput of preset S only\n"
          "  --quick     skip the preset-S cases of (b)\n"
          "  --attention the attention implementation of every model (auto: cuDNN when built with it)\n"
          "  --modes     only these variants (a-c: e.g. block,denseformer_2x2) and arms (d: e.g. denseformer-4x5);\n"
          "              the attention-kernel cases of (b) only when it names 'attention'\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  for (const std::string& name : g_modes) {
    std::vector<std::string> known = arm_names();
    for (const Variant& v : testing::cuda_variants()) known.push_back(v.name);
    for (const std::string& x : baseline_arms()) known.push_back(x);
    known.insert(known.end(), {"attention", "block_vres_constant"});
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::fprintf(stderr, "attnres_gpu_check: --modes: no variant or arm is named '%s'\n", name.c_str());
      return 2;
    }
  }
  if (train_steps < 1 || perf_steps < 1 || perf_warmup < 0 || peak_tflops < 0) {
    std::fprintf(stderr, "attnres_gpu_check: --steps and --perf-steps need >= 1, --perf-warmup and --peak-tflops >= 0\n");
    return 2;
  }
  const auto devices = cuda::list_devices();
  if (devices.empty()) {
    std::printf("attnres_gpu_check: no CUDA device\n");
    return 2;
  }
  const auto& dev = devices.front();
  std::printf("device 0: %s (sm_%d%d, %.1f GB); CPU threads: %d\n", dev.name.c_str(), dev.sm_major, dev.sm_minor,
              dev.total_bytes / 1e9, num_threads());
  std::printf("  %-2s %-26s %-34s %11s     %9s  %s\n", "", "case", "metric", "value", "limit", "result");
  const auto t0 = std::chrono::steady_clock::now();
  auto timed = [&](char which, const std::function<void()>& f) {
    if (only.find(which) == std::string::npos) return;
    const auto s = std::chrono::steady_clock::now();
    f();
    std::printf("  (%c took %.1f s)\n", which,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count());
  };
  timed('a', check_parity);
  timed('b', check_bf16);
  timed('c', [&] { check_training(train_steps); });
  timed('d', [&] { check_throughput(perf_warmup, perf_steps, with_m, peak_tflops); });
  timed('r', [&] { check_read_bench(with_m); });
  timed('e', [&] { check_bandwidth_rest(with_m); });
  int failed = 0, missed = 0;
  for (const Row& r : g_rows) {
    if (r.pass) continue;
    if (r.fatal) ++failed;
    else ++missed;
  }
  std::printf("summary: %zu rows, %d failed, %d performance targets missed%s; %.1f s\n", g_rows.size(), failed,
              missed, g_strict ? "" : " (not fatal without --strict)",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return failed > 0 ? 1 : 0;
}
