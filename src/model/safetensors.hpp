// The safetensors format (a JSON header, then raw little-endian tensors), so PyTorch users
// can read attnres checkpoints directly. The model config travels as JSON in the metadata.
//
// Integrity (docs/reliability.md): every file attnres writes carries, as the metadata value
// kChecksumKey, a JSON object {"algorithm": "xxh3-64", "metadata": HEX, "tensors": {NAME: HEX}}
// with the XXH3-64 digest (util/checksum.hpp) of each tensor's payload bytes and of the other
// metadata (its compact JSON, keys sorted). Any safetensors reader still loads such a file;
// attnres verifies every digest on every read.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
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

inline constexpr const char* kChecksumKey = "attnres.checksum";

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // without kChecksumKey
  std::map<std::string, StoredTensor> tensors;
  bool checksummed = false;  // the file carried digests, and every one matched

  const StoredTensor& at(const std::string& name, const std::string& path) const;  // Error names file and tensor
};

// Written atomically (temporary file, fsync, rename), with the digests above.
void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const TensorRef> tensors);
// Validates the header, offsets and size of the bytes of a file and verifies its digests; an
// Error names `path` (and the first tensor, in file order, whose digest does not match). A
// file without digests (written before attnres had them, or by another tool) parses with
// checksummed = false.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& path);
// parse_safetensors of the file at `path`; prints a one-line notice on stderr when the file
// carries no digests.
SafetensorsFile read_safetensors(const std::string& path);

// Throws an Error naming the file, the tensor and the element if a F32 or F64 tensor holds a
// NaN or an infinity (loaded weights and optimizer moments must be finite).
void require_finite(const StoredTensor& tensor, const std::string& name, const std::string& path);

// Model weights: every parameter of the layout, named as in the spec, with the config in
// the metadata under "config" (plus any extra metadata given).
template <class Real>
void save_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<const Real> params, const std::map<std::string, std::string>& extra = {});

// Reads the config stored in a weights file.
ModelConfig read_weights_config(const std::string& path);
ModelConfig weights_config(const SafetensorsFile& file, const std::string& path);  // of a file already read

// Loads weights into params (laid out by layout). The file must hold exactly the layout's
// tensors with the same shapes, all finite, and a config equal to `config`; otherwise an
// Error names what differs.
template <class Real>
void load_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<Real> params);
// The same from a file already read (`path` names it in errors).
template <class Real>
void load_weights(const SafetensorsFile& file, const std::string& path, const ModelConfig& config,
                  const ParamLayout& layout, std::span<Real> params);

}  // namespace attnres
