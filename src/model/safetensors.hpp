// The safetensors format (a JSON header, then raw little-endian tensors), so PyTorch users
// can read attnres checkpoints directly. The model config travels as JSON in the metadata.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/param_layout.hpp"

namespace attnres {

enum class DType { F32, F64, I32, I64 };
std::string to_string(DType dtype);
std::size_t dtype_size(DType dtype);

// A tensor to write: points at caller-owned data.
struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
};

struct StoredTensor {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;
  std::vector<unsigned char> bytes;

  std::int64_t numel() const;
  // Converts element-wise from the stored dtype.
  template <class T>
  std::vector<T> values() const;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StoredTensor> tensors;

  const StoredTensor& at(const std::string& name, const std::string& path) const;  // Error names file and tensor
};

// Written atomically (temporary file, fsync, rename).
void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const TensorRef> tensors);
// Validates the header, offsets and file size; errors name the file.
SafetensorsFile read_safetensors(const std::string& path);

// Model weights: every parameter of the layout, named as in the spec, with the config in
// the metadata under "config" (plus any extra metadata given).
template <class Real>
void save_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<const Real> params, const std::map<std::string, std::string>& extra = {});

// Reads the config stored in a weights file.
ModelConfig read_weights_config(const std::string& path);

// Loads weights into params (laid out by layout). The file must hold exactly the layout's
// tensors with the same shapes, and a config equal to `config`; otherwise an Error names
// what differs.
template <class Real>
void load_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<Real> params);

}  // namespace attnres
