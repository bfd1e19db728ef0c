#include "model/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/json.hpp"
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

namespace {

// n * m for sizes read from a file, or an Error when the product does not fit in 63 bits.
std::uint64_t checked_size(std::int64_t n, std::uint64_t m, const std::string& path, const std::string& name) {
  std::uint64_t out = 0;
  if (__builtin_mul_overflow(static_cast<std::uint64_t>(n), m, &out) || out > (std::uint64_t(1) << 62))
    fail("'", path, "': tensor '", name, "' is impossibly large (its shape overflows)");
  return out;
}

std::string metadata_digest(const std::map<std::string, std::string>& metadata) {
  return checksum_hex(checksum64(nlohmann::json(metadata).dump()));
}

// Digests of many byte ranges, in parallel when there is enough to hash.
std::vector<std::string> digests(const std::vector<std::pair<const unsigned char*, std::size_t>>& ranges) {
  std::vector<std::string> out(ranges.size());
  std::size_t total = 0;
  for (const auto& r : ranges) total += r.second;
  const auto n = static_cast<std::int64_t>(ranges.size());
#pragma omp parallel for schedule(dynamic, 1) if (total > (std::size_t(1) << 24) && n > 1)
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& [data, size] = ranges[static_cast<std::size_t>(i)];
    out[static_cast<std::size_t>(i)] = checksum_hex(checksum64(data, size));
  }
  return out;
}

// Checks the digests of kChecksumKey's value against the file's payload; the first tensor in
// file order that differs is named.
void verify_checksums(const std::string& text, const SafetensorsFile& file,
                      const std::vector<std::pair<std::uint64_t, std::string>>& order, const std::string& path) {
  const nlohmann::json j = parse_json(text, [&] { return concat("'", path, "': corrupt '", kChecksumKey, "' metadata: "); });
  auto hex_at = [&](const nlohmann::json& obj, const std::string& key, const std::string& what) {
    const auto it = obj.find(key);
    require(it != obj.end() && it->is_string() && it->get_ref<const std::string&>().size() == 16, "'", path,
            "': the '", kChecksumKey, "' metadata has no valid digest for ", what);
    return it->get<std::string>();
  };
  require(j.is_object(), "'", path, "': the '", kChecksumKey, "' metadata is not a JSON object");
  const auto algorithm = j.find("algorithm");
  require(algorithm != j.end() && algorithm->is_string(), "'", path, "': the '", kChecksumKey,
          "' metadata names no algorithm");
  require(*algorithm == kChecksumAlgorithm, "'", path, "': checksum algorithm '", algorithm->get<std::string>(),
          "' is not supported (attnres writes and reads ", kChecksumAlgorithm, ")");
  const auto tensors = j.find("tensors");
  require(tensors != j.end() && tensors->is_object(), "'", path, "': the '", kChecksumKey,
          "' metadata has no \"tensors\" object");
  for (const auto& [name, digest] : tensors->items())
    require(file.tensors.count(name) == 1, "'", path, "': the '", kChecksumKey, "' metadata names tensor '", name,
            "', which the file does not hold");
  std::vector<std::pair<const unsigned char*, std::size_t>> ranges;
  std::vector<std::string> stored;
  for (const auto& [offset, name] : order) {
    stored.push_back(hex_at(*tensors, name, "tensor '" + name + "'"));
    const StoredTensor& t = file.tensors.at(name);
    ranges.emplace_back(t.bytes.data(), t.bytes.size());
  }
  const std::vector<std::string> computed = digests(ranges);
  for (std::size_t i = 0; i < order.size(); ++i)
    require(stored[i] == computed[i], "'", path, "': tensor '", order[i].second, "' does not match its checksum (",
            kChecksumAlgorithm, " ", computed[i], ", stored ", stored[i], "): the file is corrupt");
  const std::string meta = metadata_digest(file.metadata);
  require(hex_at(j, "metadata", "the metadata") == meta, "'", path, "': the metadata does not match its checksum (",
          kChecksumAlgorithm, " ", meta, ", stored ", j.at("metadata").get<std::string>(), "): the file is corrupt");
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const TensorRef> tensors) {
  require(metadata.count(kChecksumKey) == 0, "write_safetensors: metadata key '", kChecksumKey, "' is reserved");
  nlohmann::json header = nlohmann::json::object();
  std::vector<std::pair<const unsigned char*, std::size_t>> ranges;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::uint64_t size = static_cast<std::uint64_t>(product(t.shape)) * dtype_size(t.dtype);
    require(!header.contains(t.name) && t.name != "__metadata__", "write_safetensors: bad or repeated tensor name '",
            t.name, "'");
    header[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}};
    ranges.emplace_back(static_cast<const unsigned char*>(t.data), static_cast<std::size_t>(size));
    offset += size;
  }
  const std::vector<std::string> digest = digests(ranges);
  nlohmann::json checksum = {{"algorithm", kChecksumAlgorithm}, {"metadata", metadata_digest(metadata)},
                             {"tensors", nlohmann::json::object()}};
  for (std::size_t i = 0; i < tensors.size(); ++i) checksum["tensors"][tensors[i].name] = digest[i];
  std::map<std::string, std::string> stored = metadata;
  stored[kChecksumKey] = checksum.dump();
  header["__metadata__"] = stored;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');  // keeps tensor data 8-byte aligned
  const std::uint64_t header_size = text.size();
  write_file_atomically(path, [&](std::FILE* f) {
    write_bytes(f, &header_size, sizeof(header_size), path);
    write_bytes(f, text.data(), text.size(), path);
    for (const auto& [data, size] : ranges) write_bytes(f, data, size, path);
  });
}

SafetensorsFile parse_safetensors(std::string_view raw, const std::string& path) {
  require(raw.size() >= 8, "'", path, "' is not a safetensors file (too short)");
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, raw.data(), 8);
  require(header_size <= raw.size() - 8, "'", path, "' is truncated or not a safetensors file (header size ",
          header_size, " exceeds the file)");
  const nlohmann::json header =
      parse_json(raw.substr(8, header_size), [&] { return concat("'", path, "': corrupt safetensors header: "); });
  require(header.is_object(), "'", path, "': safetensors header is not a JSON object");
  const std::uint64_t data_size = raw.size() - 8 - header_size;
  const std::string_view data = raw.substr(8 + header_size);
  SafetensorsFile file;
  std::string checksum_text;
  bool has_checksum = false;
  std::vector<std::pair<std::uint64_t, std::string>> order;  // (first byte, name) of each tensor
  std::vector<std::uint64_t> ends;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      require(entry.is_object(), "'", path, "': __metadata__ must be an object");
      for (const auto& [key, value] : entry.items()) {
        require(value.is_string(), "'", path, "': metadata value '", key, "' must be a string");
        if (key == kChecksumKey) {
          checksum_text = value.get<std::string>();
          has_checksum = true;
        } else {
          file.metadata[key] = value.get<std::string>();
        }
      }
      continue;
    }
    try {
      require(entry.is_object(), "'", path, "': entry of tensor '", name, "' is not an object");
      StoredTensor t;
      t.dtype = parse_dtype(entry.at("dtype").get<std::string>(), path);
      t.shape = entry.at("shape").get<std::vector<std::int64_t>>();
      const auto offsets = entry.at("data_offsets").get<std::vector<std::uint64_t>>();
      require(offsets.size() == 2 && offsets[0] <= offsets[1] && offsets[1] <= data_size, "'", path, "': tensor '",
              name, "' lies outside the file (truncated?)");
      std::uint64_t numel = 1;
      for (auto s : t.shape) {
        require(s >= 0, "'", path, "': tensor '", name, "' has a negative dimension");
        numel = checked_size(s, numel, path, name);
      }
      require(offsets[1] - offsets[0] == checked_size(static_cast<std::int64_t>(numel), dtype_size(t.dtype), path, name),
              "'", path, "': tensor '", name, "' has a size that does not match its shape");
      const std::string_view bytes = data.substr(offsets[0], offsets[1] - offsets[0]);
      t.bytes.assign(bytes.begin(), bytes.end());
      order.emplace_back(offsets[0], name);
      ends.push_back(offsets[1]);
      file.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      fail("'", path, "': bad entry for tensor '", name, "': ", e.what());
    }
  }
  // The tensors tile the data exactly: no holes, no overlaps (as the safetensors format requires).
  std::vector<std::size_t> by_offset(order.size());
  for (std::size_t i = 0; i < by_offset.size(); ++i) by_offset[i] = i;
  std::sort(by_offset.begin(), by_offset.end(), [&](std::size_t a, std::size_t b) {
    return order[a].first != order[b].first ? order[a].first < order[b].first : ends[a] < ends[b];
  });
  std::uint64_t covered = 0;
  for (const std::size_t i : by_offset) {
    require(order[i].first == covered, "'", path, "': tensor '", order[i].second,
            order[i].first < covered ? "' overlaps another tensor" : "' leaves a hole in the data before it");
    covered = ends[i];
  }
  require(covered == data_size, "'", path, "': file size does not match its tensors (", data_size,
          " data bytes, tensors cover ", covered, ")");
  std::sort(order.begin(), order.end());
  if (has_checksum) {
    verify_checksums(checksum_text, file, order, path);
    file.checksummed = true;
  }
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  SafetensorsFile file = parse_safetensors(read_text_file(path), path);
  if (!file.checksummed)
    std::fprintf(stderr,
                 "attnres: note: '%s' carries no payload checksum (written before attnres added them, or by another "
                 "tool): loaded unverified\n",
                 path.c_str());
  return file;
}

void require_finite(const StoredTensor& t, const std::string& name, const std::string& path) {
  auto scan = [&](auto tag) {
    using S = decltype(tag);
    const auto n = static_cast<std::int64_t>(t.bytes.size() / sizeof(S));
    std::int64_t first = n;
#pragma omp parallel for reduction(min : first) if (n > (std::int64_t(1) << 22))
    for (std::int64_t i = 0; i < n; ++i) {
      S v;
      std::memcpy(&v, t.bytes.data() + static_cast<std::size_t>(i) * sizeof(S), sizeof(S));
      if (!std::isfinite(v) && i < first) first = i;
    }
    if (first == n) return;
    S v;
    std::memcpy(&v, t.bytes.data() + static_cast<std::size_t>(first) * sizeof(S), sizeof(S));
    fail("'", path, "': tensor '", name, "' holds ", std::isnan(v) ? "a NaN" : "an infinity", " (element ", first,
         " of ", n, "): the weights are corrupt or training diverged before they were saved");
  };
  if (t.dtype == DType::F32) scan(float{});
  else if (t.dtype == DType::F64) scan(double{});
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

ModelConfig weights_config(const SafetensorsFile& file, const std::string& path) {
  auto it = file.metadata.find("config");
  require(it != file.metadata.end(), "'", path, "' has no model config in its metadata (not an attnres checkpoint?)");
  return model_config_from_json(parse_json(it->second, [&] { return concat("'", path, "': corrupt model config: "); }),
                                path);
}

ModelConfig read_weights_config(const std::string& path) { return weights_config(read_safetensors(path), path); }

template <class Real>
void load_weights(const std::string& path, const ModelConfig& config, const ParamLayout& layout,
                  std::span<Real> params) {
  load_weights<Real>(read_safetensors(path), path, config, layout, params);
}

template <class Real>
void load_weights(const SafetensorsFile& file, const std::string& path, const ModelConfig& config,
                  const ParamLayout& layout, std::span<Real> params) {
  require(static_cast<std::int64_t>(params.size()) == layout.total(), "load_weights: buffer size mismatch");
  const ModelConfig stored = weights_config(file, path);
  const nlohmann::json a = stored, b = config;
  require(a == b, "'", path, "' holds a different model: its config is ", a.dump(), ", expected ", b.dump());
  for (const auto& [name, t] : file.tensors)
    require(layout.find(name) != nullptr, "'", path, "': unexpected tensor '", name, "' for this model");
  for (const auto& p : layout.params()) {
    const StoredTensor& t = file.at(p.name, path);
    require(t.shape == p.shape, "'", path, "': tensor '", p.name, "' has the wrong shape");
    require(t.dtype == DType::F32 || t.dtype == DType::F64, "'", path, "': tensor '", p.name,
            "' must be F32 or F64");
    require_finite(t, p.name, path);
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
template void load_weights<float>(const SafetensorsFile&, const std::string&, const ModelConfig&, const ParamLayout&,
                                  std::span<float>);
template void load_weights<double>(const SafetensorsFile&, const std::string&, const ModelConfig&,
                                   const ParamLayout&, std::span<double>);

}  // namespace attnres
