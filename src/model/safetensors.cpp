#include "model/safetensors.hpp"

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres {

static_assert(std::endian::native == std::endian::little, "attnres assumes a little-endian machine");

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) { return dtype == DType::F32 || dtype == DType::I32 ? 4 : 8; }

namespace {
DType parse_dtype(const std::string& text, const std::string& path) {
  for (auto d : {DType::F32, DType::F64, DType::I32, DType::I64})
    if (to_string(d) == text) return d;
  fail("'", path, "': unsupported tensor dtype '", text, "' (attnres reads F32, F64, I32, I64)");
}

std::int64_t product(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

template <class Real>
constexpr DType dtype_of() {
  return sizeof(Real) == 4 ? DType::F32 : DType::F64;
}
}  // namespace

std::int64_t StoredTensor::numel() const { return product(shape); }

template <class T>
std::vector<T> StoredTensor::values() const {
  const auto n = static_cast<std::size_t>(numel());
  std::vector<T> out(n);
  auto convert = [&](auto tag) {
    using S = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      S v;
      std::memcpy(&v, bytes.data() + i * sizeof(S), sizeof(S));
      out[i] = static_cast<T>(v);
    }
  };
  switch (dtype) {
    case DType::F32: convert(float{}); break;
    case DType::F64: convert(double{}); break;
    case DType::I32: convert(std::int32_t{}); break;
    case DType::I64: convert(std::int64_t{}); break;
  }
  return out;
}
template std::vector<float> StoredTensor::values<float>() const;
template std::vector<double> StoredTensor::values<double>() const;
template std::vector<std::int32_t> StoredTensor::values<std::int32_t>() const;
template std::vector<std::int64_t> StoredTensor::values<std::int64_t>() const;

const StoredTensor& SafetensorsFile::at(const std::string& name, const std::string& path) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail("'", path, "': missing tensor '", name, "'");
  return it->second;
}

void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const TensorRef> tensors) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::uint64_t size = static_cast<std::uint64_t>(product(t.shape)) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}};
    offset += size;
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // keeps tensor data 8-byte aligned
  const std::uint64_t header_size = text.size();
  write_file_atomically(path, [&](std::FILE* f) {
    write_bytes(f, &header_size, sizeof(header_size), path);
    write_bytes(f, text.data(), text.size(), path);
    for (const auto& t : tensors)
      write_bytes(f, t.data, static_cast<std::size_t>(product(t.shape)) * dtype_size(t.dtype), path);
  });
}

SafetensorsFile read_safetensors(const std::string& path) {
  const std::string raw = read_text_file(path);
  require(raw.size() >= 8, "'", path, "' is not a safetensors file (too short)");
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, raw.data(), 8);
  require(header_size <= raw.size() - 8, "'", path, "' is truncated or not a safetensors file (header size ",
          header_size, " exceeds the file)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(raw.substr(8, header_size));
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "': corrupt safetensors header: ", e.what());
  }
  require(header.is_object(), "'", path, "': safetensors header is not a JSON object");
  const std::uint64_t data_size = raw.size() - 8 - header_size;
  SafetensorsFile file;
  std::uint64_t covered = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      require(entry.is_object(), "'", path, "': __metadata__ must be an object");
      for (const auto& [key, value] : entry.items()) {
        require(value.is_string(), "'", path, "': metadata value '", key, "' must be a string");
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    try {
      StoredTensor t;
      t.dtype = parse_dtype(entry.at("dtype").get<std::string>(), path);
      t.shape = entry.at("shape").get<std::vector<std::int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
      require(offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= data_size, "'", path, "': tensor '",
              name, "' lies outside the file (truncated?)");
      for (auto s : t.shape) require(s >= 0, "'", path, "': tensor '", name, "' has a negative dimension");
      require(offsets[1] - offsets[0] == static_cast<std::uint64_t>(t.numel()) * dtype_size(t.dtype), "'", path,
              "': tensor '", name, "' has a size that does not match its shape");
      t.bytes.assign(raw.begin() + static_cast<std::ptrdiff_t>(8 + header_size + offsets[0]),
                     raw.begin() + static_cast<std::ptrdiff_t>(8 + header_size + offsets[1]));
      covered += offsets[1] - offsets[0];
      file.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      fail("'", path, "': bad entry for tensor '", name, "': ", e.what());
    }
  }
  require(covered == data_size, "'", path, "': file size does not match its tensors (", data_size,
          " data bytes, tensors cover ", covered, ")");
  return file;
}

template <class Real>
void save_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<const Real> params, const std::map<std::string, std::string>& extra) {
  require(static_cast<std::int64_t>(params.size()) == layout.total(), "save_weights: buffer size mismatch");
  std::map<std::string, std::string> metadata = extra;
  metadata["format"] = "pt";
  metadata["config"] = nlohmann::json(config).dump();
  std::vector<TensorRef> refs;
  for (const auto& p : layout.params())
    refs.push_back({p.name, dtype_of<Real>(), p.shape, params.data() + p.offset});
  write_safetensors(path, metadata, refs);
}

namespace {
ModelConfig config_of(const SafetensorsFile& file, const std::string& path) {
  auto it = file.metadata.find("config");
  require(it != file.metadata.end(), "'", path, "' has no model config in its metadata (not an attnres checkpoint?)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    fail("'", path, "': corrupt model config: ", e.what());
  }
  return model_config_from_json(j, path);
}
}  // namespace

ModelConfig read_weights_config(const std::string& path) { return config_of(read_safetensors(path), path); }

template <class Real>
void load_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<Real> params) {
  require(static_cast<std::int64_t>(params.size()) == layout.total(), "load_weights: buffer size mismatch");
  const SafetensorsFile file = read_safetensors(path);
  const ModelConfig stored = config_of(file, path);
  const nlohmann::json a = stored, b = config;
  require(a == b, "'", path, "' holds a different model: its config is ", a.dump(), ", expected ", b.dump());
  for (const auto& [name, t] : file.tensors)
    require(layout.find(name) != nullptr, "'", path, "': unexpected tensor '", name, "' for this model");
  for (const auto& p : layout.params()) {
    const StoredTensor& t = file.at(p.name, path);
    require(t.shape == p.shape, "'", path, "': tensor '", p.name, "' has the wrong shape");
    require(t.dtype == DType::F32 || t.dtype == DType::F64, "'", path, "': tensor '", p.name,
            "' must be F32 or F64");
    const std::vector<Real> v = t.values<Real>();
    std::copy(v.begin(), v.end(), params.begin() + p.offset);
  }
}

template void save_weights<float>(const std::string&, const ModelConfig&, const ParamLayout&, std::span<const float>,
                                  const std::map<std::string, std::string>&);
template void save_weights<double>(const std::string&, const ModelConfig&, const ParamLayout&,
                                   std::span<const double>, const std::map<std::string, std::string>&);
template void load_weights<float>(const std::string&, const ModelConfig&, const ParamLayout&, std::span<float>);
template void load_weights<double>(const std::string&, const ModelConfig&, const ParamLayout&, std::span<double>);

}  // namespace attnres
