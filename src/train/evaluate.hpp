// Validation and test NLL of a model on a prepared split.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "data/loader.hpp"
#include "dist/communicator.hpp"
#include "train/inference.hpp"

namespace attnres {

struct EvalResult {
  double nll = 0;           // mean nats per scored token
  std::int64_t tokens = 0;  // scored tokens
};

// Scores the split's first windows in order (window i covers tokens [i*seq, i*seq + seq]),
// up to max_tokens scored tokens (<= 0: the whole split), `batch` windows at a time. With a
// communicator of K ranks, rank r scores every K-th batch and the sums are combined on all ranks.
EvalResult evaluate_split(InferenceBackend& model, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens, dist::Communicator* comm = nullptr);

// The windows evaluate_split scores: up to max_tokens / seq of them (<= 0: all), at least one;
// an error naming the split when it holds no window of seq + 1 tokens.
std::int64_t eval_windows(const data::TokenDataset& split, int seq, std::int64_t max_tokens);

// The same with any loss: `loss` returns the mean loss of [batch, seq+1] tokens.
using BatchLoss = std::function<double(std::span<const std::int32_t> tokens, int batch, int seq)>;
EvalResult evaluate_split(const BatchLoss& loss, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens, dist::Communicator* comm = nullptr);

}  // namespace attnres
