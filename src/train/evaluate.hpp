// Validation and test NLL of a model on a prepared split.
#pragma once

#include <cstdint>

#include "data/loader.hpp"
#include "model/model.hpp"

namespace attnres {

struct EvalResult {
  double nll = 0;           // mean nats per scored token
  std::int64_t tokens = 0;  // scored tokens
};

// Scores the split's first windows in order (window i covers tokens [i*seq, i*seq + seq]),
// up to max_tokens scored tokens (<= 0: the whole split), `batch` windows at a time.
EvalResult evaluate_split(Model<float>& model, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens);

}  // namespace attnres
