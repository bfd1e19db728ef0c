// CudaAdamW: torch AdamW with global-norm gradient clipping on the device (cuda/cuda_model.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/check.hpp"
#include "cuda/cuda_model.hpp"
#include "cuda/kernels.hpp"
#include "util/error.hpp"

namespace attnres::cuda {

CudaAdamW::CudaAdamW(const ParamLayout& layout, AdamWConfig config, int device) : config_(config), n_(layout.total()) {
  ATTNRES_CUDA_CHECK(cudaSetDevice(device));
  const auto bytes = static_cast<std::size_t>(n_) * sizeof(float);
  m_ = DeviceBuffer(bytes);
  v_ = DeviceBuffer(bytes);
  ATTNRES_CUDA_CHECK(cudaMemset(m_.data(), 0, bytes));
  ATTNRES_CUDA_CHECK(cudaMemset(v_.data(), 0, bytes));
  // Weight decay on matrices only (ParamInfo::weight_decay), as contiguous ranges.
  std::vector<std::int64_t> begin, end;
  if (config_.weight_decay != 0) {
    for (const ParamInfo& p : layout.params()) {
      if (!p.weight_decay()) continue;
      if (!end.empty() && end.back() == p.offset) end.back() += p.numel;
      else {
        begin.push_back(p.offset);
        end.push_back(p.offset + p.numel);
      }
    }
  }
  n_ranges_ = static_cast<int>(begin.size());
  ranges_ = DeviceBuffer(sizeof(std::int64_t) * std::max<std::size_t>(1, 2 * begin.size()));
  if (n_ranges_ > 0) {
    ATTNRES_CUDA_CHECK(cudaMemcpy(ranges_.data(), begin.data(), sizeof(std::int64_t) * begin.size(),
                                  cudaMemcpyHostToDevice));
    ATTNRES_CUDA_CHECK(cudaMemcpy(ranges_.as<std::int64_t>() + n_ranges_, end.data(),
                                  sizeof(std::int64_t) * end.size(), cudaMemcpyHostToDevice));
  }
  partials_ = DeviceBuffer(sizeof(double) * static_cast<std::size_t>(std::max<std::int64_t>(
                                                1, (n_ + kern::kNormChunk - 1) / kern::kNormChunk)));
  norm_ = DeviceBuffer(sizeof(double));
  clip_ = DeviceBuffer(2 * sizeof(float));
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy-stream memsets and copies above are done
}

double CudaAdamW::step(CudaModel& model, double lr, double max_norm) {
  require(model.n_params() == n_, "CudaAdamW: the model has ", model.n_params(), " parameters, the optimizer ", n_);
  ATTNRES_CUDA_CHECK(cudaSetDevice(model.device()));
  ++t_;
  // The CPU optimizer's scalars, computed the same way (double, then rounded to float).
  const double b1 = config_.beta1, b2 = config_.beta2;
  kern::AdamWStep st;
  st.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, static_cast<double>(t_))));
  st.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_))));
  st.decay = static_cast<float>(1.0 - lr * config_.weight_decay);
  st.beta1 = static_cast<float>(b1);
  st.beta2 = static_cast<float>(b2);
  st.one_minus_beta1 = static_cast<float>(1.0 - b1);
  st.one_minus_beta2 = static_cast<float>(1.0 - b2);
  st.eps = static_cast<float>(config_.eps);
  const Stream s = model.stream();
  // The clip-and-update pass also writes the model's bf16 weight copy (in bf16 mode).
  model.update_params([&](const CudaModel::ParamUpdate& u) {
    kern::grad_norm(u.grads, n_, partials_.as<double>(), max_norm, norm_.as<double>(), clip_.as<float>(), u.stream);
    kern::adamw(u.params, u.grads, m_.as<float>(), v_.as<float>(), n_, st, clip_.as<float>(),
                ranges_.as<std::int64_t>(), ranges_.as<std::int64_t>() + n_ranges_, n_ranges_, u.params_bf16,
                u.stream);
  });
  double norm = 0;
  ATTNRES_CUDA_CHECK(cudaMemcpyAsync(&norm, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, s));
  ATTNRES_CUDA_CHECK(cudaStreamSynchronize(s));
  return norm;
}

void CudaAdamW::copy_state_to_host(std::span<float> m, std::span<float> v) const {
  require(static_cast<std::int64_t>(m.size()) == n_ && static_cast<std::int64_t>(v.size()) == n_,
          "CudaAdamW: state buffer size mismatch");
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());
  ATTNRES_CUDA_CHECK(cudaMemcpy(m.data(), m_.data(), m.size_bytes(), cudaMemcpyDeviceToHost));
  ATTNRES_CUDA_CHECK(cudaMemcpy(v.data(), v_.data(), v.size_bytes(), cudaMemcpyDeviceToHost));
}

void CudaAdamW::load_state_from_host(std::span<const float> m, std::span<const float> v) {
  require(static_cast<std::int64_t>(m.size()) == n_ && static_cast<std::int64_t>(v.size()) == n_,
          "CudaAdamW: state buffer size mismatch");
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());
  ATTNRES_CUDA_CHECK(cudaMemcpy(m_.data(), m.data(), m.size_bytes(), cudaMemcpyHostToDevice));
  ATTNRES_CUDA_CHECK(cudaMemcpy(v_.data(), v.data(), v.size_bytes(), cudaMemcpyHostToDevice));
  ATTNRES_CUDA_CHECK(cudaDeviceSynchronize());  // a pageable upload may return before its DMA lands
}

std::size_t CudaAdamW::device_bytes() const {
  return m_.bytes() + v_.bytes() + ranges_.bytes() + partials_.bytes() + norm_.bytes() + clip_.bytes();
}

}  // namespace attnres::cuda
