#include "train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/error.hpp"

namespace attnres {

EvalResult evaluate_split(InferenceBackend& model, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens, dist::Communicator* comm) {
  const BatchLoss loss = [&model](std::span<const std::int32_t> tokens, int b, int s) {
    return model.loss(tokens, b, s);
  };
  return evaluate_split(loss, split, batch, seq, max_tokens, comm);
}

std::int64_t eval_windows(const data::TokenDataset& split, int seq, std::int64_t max_tokens) {
  require(split.num_tokens() >= seq + 1, "split '", split.split(), "' of '", split.dir(), "' holds ",
          split.num_tokens(), " tokens, too few for one window of ", seq + 1,
          " (seq_len + 1); prepare more text, or give this split a larger fraction");
  std::int64_t windows = data::BatchLoader(split, 1, seq, 0).num_windows();
  if (max_tokens > 0) windows = std::min<std::int64_t>(windows, std::max<std::int64_t>(1, max_tokens / seq));
  return windows;
}

EvalResult evaluate_split(const BatchLoss& loss, const data::TokenDataset& split, int batch, int seq,
                          std::int64_t max_tokens, dist::Communicator* comm) {
  const data::BatchLoader order(split, 1, seq, 0);
  const std::int64_t windows = eval_windows(split, seq, max_tokens);
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch) * (seq + 1));
  double total = 0;
  const int rank = comm != nullptr ? comm->rank() : 0;
  const int world = comm != nullptr ? comm->world() : 1;
  for (std::int64_t w0 = std::int64_t(rank) * batch; w0 < windows; w0 += std::int64_t(world) * batch) {
    const int b = static_cast<int>(std::min<std::int64_t>(batch, windows - w0));
    for (int i = 0; i < b; ++i)
      order.window(w0 + i, std::span<std::int32_t>(tokens).subspan(static_cast<std::size_t>(i) * (seq + 1), seq + 1));
    const double mean = loss(std::span<const std::int32_t>(tokens.data(), static_cast<std::size_t>(b) * (seq + 1)), b, seq);
    // A NaN or infinite loss is never a result: the weights are corrupt or diverged.
    require(std::isfinite(mean), "the loss on windows ", w0, "..", w0 + b - 1, " of split '", split.split(), "' of '",
            split.dir(), "' is ", mean, ": the model's weights are not usable");
    total += mean * b * seq;
  }
  if (comm != nullptr) total = comm->sum(total);
  return {total / double(windows * seq), windows * seq};
}

}  // namespace attnres
