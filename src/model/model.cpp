#include "model/model.hpp"

#include <algorithm>
#include <type_traits>

#include "kernels/cross_entropy.hpp"
#include "kernels/elementwise.hpp"
#include "kernels/embedding.hpp"
#include "kernels/gemm.hpp"
#include "kernels/rmsnorm.hpp"
#include "model/family.hpp"
#include "util/error.hpp"

namespace attnres {

namespace k = kernels;

namespace {
constexpr std::int64_t kCrossEntropyRows = 256;
}  // namespace

template <class Real>
Model<Real>::Model(const ModelConfig& config, std::int64_t max_batch, int max_seq, bool with_grad)
    : config_(config),
      layout_(config),
      max_batch_(max_batch),
      max_seq_(max_seq),
      with_grad_(with_grad),
      final_norm_(has_model_norms(config)),
      topo_(config),
      bodies_(config_, w_, g_, with_grad) {
  require(max_batch >= 1, "batch size must be at least 1");
  require(max_seq >= 1 && max_seq <= config.max_seq_len, "sequence length ", max_seq,
          " must be between 1 and model.max_seq_len = ", config.max_seq_len);
  params_.assign(static_cast<std::size_t>(layout_.total()), Real(0));
  w_ = bind_weights<Real>(config_, layout_, params_);
  if (with_grad_) {
    grads_.assign(static_cast<std::size_t>(layout_.total()), Real(0));
    g_ = bind_weights<Real>(config_, layout_, grads_);
  }
  trunk_ = make_trunk<Real>({config_, layout_, topo_, params_, grads_, w_, g_, bodies_, trunk_buffers_});
  ArenaCarver<Real> count{nullptr};
  carve(count);
  arena_.assign(static_cast<std::size_t>(count.used), Real(0));
  ArenaCarver<Real> lay_out{arena_.data()};
  carve(lay_out);
  const std::int64_t bt = max_batch_ * max_seq_;
  inputs_.assign(static_cast<std::size_t>(bt), 0);
  targets_.assign(static_cast<std::size_t>(bt), 0);
  ce_row_loss_.assign(static_cast<std::size_t>(kCrossEntropyRows), 0.0);
}

template <class Real>
void Model<Real>::set_matmul_precision(k::MatmulPrecision precision) {
  require(precision == k::MatmulPrecision::fp32 || std::is_same_v<Real, float>,
          "bf16 matmuls are only available for float models (this model computes in double)");
  precision_ = precision;
  bodies_.set_precision(precision);
}

// Lays every buffer out in the arena (or only counts: ArenaCarver): the model's, the bodies', the
// trunk's; the shared reduction scratch fits every user.
template <class Real>
void Model<Real>::carve(ArenaCarver<Real>& arena) {
  const std::int64_t bt = max_batch_ * max_seq_, d = config_.d_model;
  emb_ = arena.take(bt * d);
  trunk_->carve(arena, bt);
  if (final_norm_) {
    x_final_ = arena.take(bt * d);
    rstd_final_ = arena.take(bt);
  }
  bodies_.carve(arena, bt);
  ce_logits_ = arena.take(kCrossEntropyRows * config_.vocab_size);
  TrunkBuffers<Real>& b = trunk_buffers_;
  b.emb = emb_;
  if (with_grad_) {
    b.demb = arena.take(bt * d);
    b.dh = arena.take(bt * d);
    dx_final_ = final_norm_ ? arena.take(bt * d) : b.dh;  // without a final norm the head's gradient is the trunk's
    b.dx = arena.take(bt * d);
    b.reduce = arena.take(std::max(
        {k::rmsnorm_scratch_size(bt, config_.d_model), bodies_.reduce_scratch(bt), trunk_->reduce_scratch(bt)}));
  }
  bodies_.set_reduce(b.reduce);
}

template <class Real>
void Model<Real>::set_inputs(std::span<const std::int32_t> tokens, std::int64_t batch, int seq, bool with_targets) {
  require(batch >= 1 && batch <= max_batch_, "batch size ", batch, " exceeds the model's capacity ", max_batch_);
  require(seq >= 1 && seq <= max_seq_, "sequence length ", seq, " exceeds the model's capacity ", max_seq_);
  const std::int64_t row = with_targets ? seq + 1 : seq;
  require(static_cast<std::int64_t>(tokens.size()) == batch * row, "expected ", batch * row, " tokens, got ",
          tokens.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (int t = 0; t < seq; ++t) {
      const std::int32_t in = tokens[static_cast<std::size_t>(b * row + t)];
      require(in >= 0 && in < config_.vocab_size, "token id ", in, " is outside the vocabulary [0, ",
              config_.vocab_size, ")");
      inputs_[static_cast<std::size_t>(b * seq + t)] = in;
      if (with_targets) {
        const std::int32_t out = tokens[static_cast<std::size_t>(b * row + t + 1)];
        require(out >= 0 && out < config_.vocab_size, "token id ", out, " is outside the vocabulary [0, ",
                config_.vocab_size, ")");
        targets_[static_cast<std::size_t>(b * seq + t)] = out;
      }
    }
  n_tok_ = batch * seq;
}

template <class Real>
void Model<Real>::forward_trunk(const Pass<Real>& pass) {
  k::embedding_forward(emb_, inputs_.data(), w_.tok_emb, n_tok_, config_.d_model);
  final_input_ = trunk_->forward(pass);
  head_input_ = final_input_;
  if (!final_norm_) return;
  k::rmsnorm_forward(x_final_, rstd_final_, final_input_, w_.final_norm, n_tok_, config_.d_model,
                     static_cast<Real>(config_.norm_eps));
  head_input_ = x_final_;
}

template <class Real>
void Model<Real>::backward_trunk(const Pass<Real>& pass) {
  const TrunkBuffers<Real>& b = trunk_buffers_;
  if (final_norm_)  // (otherwise the LM head wrote its input's gradient into dh itself)
    k::rmsnorm_backward(b.dh, g_.final_norm, dx_final_, final_input_, w_.final_norm, rstd_final_, n_tok_,
                        config_.d_model, b.reduce);
  trunk_->backward(pass);  // from dh, the final norm's input gradient
  k::embedding_backward(g_.tok_emb, inputs_.data(), b.demb, n_tok_, config_.d_model);
}

template <class Real>
double Model<Real>::forward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq) {
  set_inputs(tokens, batch, seq, true);
  forward_trunk({batch, seq});
  const k::CrossEntropyScratch<Real> ce{ce_logits_, ce_row_loss_.data(), kCrossEntropyRows};
  const double total = k::lm_head_cross_entropy<Real>(head_input_, w_.lm_head, targets_.data(), n_tok_,
                                                      config_.d_model, config_.vocab_size, ce, Real(0), nullptr,
                                                      nullptr, precision_);
  return total / static_cast<double>(n_tok_);
}

template <class Real>
double Model<Real>::forward_backward(std::span<const std::int32_t> tokens, std::int64_t batch, int seq) {
  require(with_grad_, "this model was built without gradient buffers");
  set_inputs(tokens, batch, seq, true);
  forward_trunk({batch, seq});
  const std::int64_t n = n_tok_, d = config_.d_model;
  std::fill(grads_.begin(), grads_.end(), Real(0));
  k::zero(trunk_buffers_.demb, n * d);
  bodies_.begin_backward(n);
  const k::CrossEntropyScratch<Real> ce{ce_logits_, ce_row_loss_.data(), kCrossEntropyRows};
  const double total = k::lm_head_cross_entropy<Real>(head_input_, w_.lm_head, targets_.data(), n, config_.d_model,
                                                      config_.vocab_size, ce, Real(1) / static_cast<Real>(n),
                                                      dx_final_, g_.lm_head, precision_);
  backward_trunk({batch, seq});
  return total / static_cast<double>(n);
}

template <class Real>
void Model<Real>::logits(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, std::span<Real> out) {
  set_inputs(inputs, batch, seq, false);
  require(static_cast<std::int64_t>(out.size()) == n_tok_ * config_.vocab_size, "logits buffer has the wrong size");
  forward_trunk({batch, seq});
  k::linear_forward(out.data(), head_input_, w_.lm_head, n_tok_, config_.d_model, config_.vocab_size, false,
                    precision_);
}

template <class Real>
void Model<Real>::decode(std::span<const std::int32_t> inputs, std::int64_t batch, int seq, KvCache<Real>& cache,
                         std::span<Real> out) {
  require(batch == cache.batch, "decode: the cache was made for batch ", cache.batch);
  require(cache.length + seq <= cache.max_seq && cache.max_seq <= config_.max_seq_len,
          "the context is full (", cache.max_seq, " tokens)");
  require(static_cast<std::int64_t>(out.size()) == batch * config_.vocab_size, "logits buffer has the wrong size");
  set_inputs(inputs, batch, seq, false);
  forward_trunk({batch, seq, &cache});
  cache.length += seq;
  for (std::int64_t b = 0; b < batch; ++b)
    k::linear_forward(out.data() + b * config_.vocab_size, head_input_ + ((b + 1) * seq - 1) * config_.d_model,
                      w_.lm_head, 1, config_.d_model, config_.vocab_size, false, precision_);
}

template class Model<float>;
template class Model<double>;

}  // namespace attnres
