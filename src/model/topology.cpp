#include "model/topology.hpp"

#include <algorithm>

#include "kernels/dwa.hpp"

namespace attnres {

std::vector<ReadPlan> make_read_plans(const ModelConfig& c) {
  std::vector<ReadPlan> plans;
  if (!c.uses_depth_reads()) return plans;
  const int L = c.n_sublayers(), S = c.sublayers_per_block(), N = c.effective_blocks();
  auto block_end = [&](int n) { return (n + 1) * S - 1; };  // sublayer whose output is b_{n+1}
  for (int j = 0; j <= L; ++j) {
    ReadPlan p;
    p.sources.push_back(kEmbedding);
    const int n = j == L ? N : j / S;  // completed blocks before this read
    for (int m = 0; m < n; ++m) p.sources.push_back(block_end(m));
    if (j < L && j % S != 0) p.sources.push_back(j - 1);  // partial sum of the current block
    if (j < L && is_attention(j) && c.residual == ResidualMode::rd) {
      switch (c.value_route) {
        case ValueRoute::tied: break;  // one query serves both routes: one read
        case ValueRoute::decoupled:
          p.n_routes = 2;
          p.separate_value = true;
          break;
        case ValueRoute::average:
          p.n_routes = 2;
          p.average = true;
          break;
        case ValueRoute::frozen:
          p.n_routes = 2;
          p.uniform_value = true;
          p.separate_value = true;
          break;
      }
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

std::string delta_read_prefix(int j) {
  return "layers." + std::to_string(layer_of(j)) + (is_attention(j) ? ".attn_res." : ".mlp_res.");
}

const char* delta_gate_tensor(kernels::DeltaGate gate) {
  switch (gate) {
    case kernels::DeltaGate::none: return nullptr;
    case kernels::DeltaGate::sigmoid_scalar: return "gate_logit";
    case kernels::DeltaGate::learnable_alpha: return "gate_alpha";
    case kernels::DeltaGate::sigmoid_vector: return "gate.weight";
  }
  return nullptr;
}

std::vector<int> delta_read_sources(const ModelConfig& c, int j) {
  std::vector<int> sources;
  if (j == 0) return sources;
  const int S = c.sublayers_per_block();
  const bool partial = c.residual == ResidualMode::delta || c.delta_block_partial;
  const int done = partial ? j / S : (j - 1) / S;  // completed blocks it reads
  sources.push_back(kEmbedding);
  for (int m = 0; m < done; ++m) sources.push_back((m + 1) * S - 1);
  if (partial && j % S != 0) sources.push_back(j - 1);
  return sources;
}

Topology::Topology(const ModelConfig& config)
    : n_sublayers_(config.n_sublayers()),
      sublayers_per_block_(config.uses_depth_reads() ? config.sublayers_per_block() : 1),
      plans_(make_read_plans(config)),
      dwa_of_block_(static_cast<std::size_t>(config.n_layers + 1), -1) {
  if (config.residual == ResidualMode::denseformer) {
    for (int i = 1; i <= config.n_layers; ++i) {
      const std::vector<int> src = kernels::dwa_sources(i, config.dwa_dilation, config.dwa_period);
      if (src.empty()) continue;
      DwaPlan p;
      p.block = i;
      for (int x : src) p.sources.push_back(x == 0 ? kEmbedding : 2 * x - 1);
      p.output = dwa_stream(i);
      dwa_of_block_[static_cast<std::size_t>(i)] = static_cast<int>(dwas_.size());
      dwas_.push_back(std::move(p));
    }
  }
  for (const ReadPlan& p : plans_) {
    max_sources_ = std::max(max_sources_, static_cast<int>(p.sources.size()));
    any_separate_value_ = any_separate_value_ || p.separate_value;
  }
}

std::vector<ReadGroup> Topology::read_groups(int max_reads) const {
  std::vector<ReadGroup> groups;
  const int S = sublayers_per_block_;
  for (int hi = has_reads() ? final_read() : -1; hi >= 0;) {
    const int block = (hi == final_read() ? hi - 1 : hi) / S;
    ReadGroup g;
    g.hi = hi;
    g.lo = std::max(block * S, hi - std::max(1, max_reads) + 1);
    // The common prefix of the reads' sources, of streams written before sublayer lo.
    const std::vector<int>& first = read(g.lo).sources;
    int n = 0;
    while (n < static_cast<int>(first.size()) && first[static_cast<std::size_t>(n)] < g.lo) {
      bool shared = true;
      for (int r = g.lo + 1; r <= g.hi && shared; ++r) {
        const std::vector<int>& src = read(r).sources;
        shared = n < static_cast<int>(src.size()) && src[static_cast<std::size_t>(n)] == first[static_cast<std::size_t>(n)];
      }
      if (!shared) break;
      ++n;
    }
    g.n_shared = n;
    groups.push_back(g);
    hi = g.lo - 1;
  }
  return groups;
}

int Topology::input(int j) const {
  if (j == 0) return kEmbedding;
  if (!is_attention(j) && j != n_sublayers_) return j - 1;
  const int block = j / 2;  // blocks completed before sublayer j
  const int dwa = dwa_of_block_[static_cast<std::size_t>(block)];
  return dwa >= 0 ? dwas_[static_cast<std::size_t>(dwa)].output : j - 1;
}

const DwaPlan* Topology::dwa_ending_at(int j) const {
  if (is_attention(j)) return nullptr;
  const int dwa = dwa_of_block_[static_cast<std::size_t>(j / 2 + 1)];
  return dwa >= 0 ? &dwas_[static_cast<std::size_t>(dwa)] : nullptr;
}

int Topology::write_base(int j) const {
  if (!has_reads()) return input(j);
  return j % sublayers_per_block_ == 0 ? kNoStream : j - 1;
}

}  // namespace attnres
