// Keys and values of every attention layer for incremental decoding (Model::decode), so each new
// token costs one step of work: [n_layers][batch][max_seq][d] for K and for V.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.hpp"

namespace attnres {

template <class Real>
struct KvCache {
  KvCache(const ModelConfig& config, std::int64_t batch, int max_seq)
      : batch(batch),
        max_seq(max_seq),
        d(config.d_model),
        k(static_cast<std::size_t>(config.n_layers * batch * max_seq * config.d_model)),
        v(k.size()) {}
  Real* keys(int layer) { return k.data() + std::int64_t(layer) * batch * max_seq * d; }
  Real* values(int layer) { return v.data() + std::int64_t(layer) * batch * max_seq * d; }

  std::int64_t batch;
  int max_seq;
  int d;
  int length = 0;  // positions filled
  std::vector<Real> k, v;
};

}  // namespace attnres
