#include "data/loader.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/hash.hpp"
#include "data/parallel.hpp"
#include "data/prepare.hpp"
#include "data/shard.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"
#include "util/json.hpp"
#include "util/rng.hpp"

namespace attnres::data {
namespace fs = std::filesystem;

// A read-only memory map of one shard file; unmapped on destruction.
struct TokenDataset::Shard {
  std::string path;
  const unsigned char* base = nullptr;
  std::size_t size = 0;
  std::int64_t tokens = 0;
  std::uint32_t width = 2;
  std::uint64_t checksum = 0;

  Shard() = default;
  Shard(Shard&& o) noexcept
      : path(std::move(o.path)), base(std::exchange(o.base, nullptr)), size(o.size), tokens(o.tokens),
        width(o.width), checksum(o.checksum) {}
  Shard& operator=(Shard&& o) noexcept {
    if (this != &o) {
      unmap();
      path = std::move(o.path);
      base = std::exchange(o.base, nullptr);
      size = o.size;
      tokens = o.tokens;
      width = o.width;
      checksum = o.checksum;
    }
    return *this;
  }
  ~Shard() { unmap(); }
  void unmap() {
    if (base) ::munmap(const_cast<unsigned char*>(base), size);
    base = nullptr;
  }
  const unsigned char* payload() const { return base + kShardHeaderBytes; }
};

namespace {

std::uint64_t get_u64(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  // Non-negative integers only; values built in code are signed, values parsed from text unsigned.
  require(it != j.end() && it->is_number_integer() && (it->is_number_unsigned() || it->get<std::int64_t>() >= 0),
          where, ": missing or invalid \"", key, "\"");
  return it->get<std::uint64_t>();
}

std::string get_string(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  require(it != j.end() && it->is_string(), where, ": missing or invalid \"", key, "\"");
  return it->get<std::string>();
}

// Hash of the payload and the largest id in it, in one pass.
std::pair<std::uint64_t, std::uint32_t> scan_payload(const unsigned char* p, std::int64_t tokens, std::uint32_t width) {
  Hasher64 hasher;
  std::uint32_t max_id = 0;
  constexpr std::int64_t kBlock = 1 << 16;
  for (std::int64_t begin = 0; begin < tokens; begin += kBlock) {
    const std::int64_t n = std::min(kBlock, tokens - begin);
    const unsigned char* q = p + begin * width;
    hasher.update(q, static_cast<std::size_t>(n * width));
    if (width == 2) {
      for (std::int64_t i = 0; i < n; ++i) max_id = std::max<std::uint32_t>(max_id, q[2 * i] | (q[2 * i + 1] << 8));
    } else {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint32_t v = static_cast<std::uint32_t>(q[4 * i]) | (static_cast<std::uint32_t>(q[4 * i + 1]) << 8) |
                                (static_cast<std::uint32_t>(q[4 * i + 2]) << 16) |
                                (static_cast<std::uint32_t>(q[4 * i + 3]) << 24);
        max_id = std::max(max_id, v);
      }
    }
  }
  return {hasher.digest(), max_id};
}

}  // namespace

TokenDataset::TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;
TokenDataset::~TokenDataset() = default;

TokenDataset TokenDataset::open(const std::string& dir, const std::string& split) {
  return open(dir, split, DatasetOpenOptions{});
}

TokenDataset TokenDataset::open(const std::string& dir, const std::string& split, const DatasetOpenOptions& options) {
  require(split == "train" || split == "val" || split == "test", "unknown split '", split,
          "' (expected train, val or test)");
  const std::string manifest_path = data::manifest_path(dir);
  const nlohmann::json m =
      parse_json(read_text_file(manifest_path), [&] { return concat(manifest_path, ": malformed JSON: "); });
  require(m.is_object() && m.value("format", "") == "attnres-token-shards", manifest_path,
          ": not an attnres dataset manifest");
  const std::uint64_t version = get_u64(m, "format_version", manifest_path);
  require(version == 1 || version == static_cast<std::uint64_t>(kManifestVersion), manifest_path,
          ": manifest version ", version, " is not supported (expected 1 or ", kManifestVersion,
          "; prepared by a newer attnres?)");

  TokenDataset data;
  data.dir_ = dir;
  data.split_ = split;
  require(m.contains("tokenizer") && m["tokenizer"].is_object(), manifest_path, ": missing \"tokenizer\"");
  const nlohmann::json& tok = m["tokenizer"];
  const std::string tok_where = manifest_path + " (tokenizer)";
  data.legacy_hash_ = version == 1;
  if (version == 1) {
    data.tokenizer_spec_ = get_string(tok, "spec", tok_where);
  } else {
    data.tokenizer_spec_ = spec_resolved_from(get_string(tok, "spec", tok_where), dir);
    data.tokenizer_spec_when_prepared_ = get_string(tok, "spec_when_prepared", tok_where);
    const std::string algorithm = get_string(tok, "hash_algorithm", tok_where);
    require(algorithm == kChecksumAlgorithm, tok_where, ": hash_algorithm '", algorithm, "' is not ",
            kChecksumAlgorithm);
  }
  data.tokenizer_hash_ = get_string(tok, "hash", tok_where);
  const std::uint64_t vocab = get_u64(tok, "vocab_size", tok_where);
  const std::uint64_t eot = get_u64(tok, "eot_id", tok_where);
  require(vocab >= 1 && vocab <= (1ULL << 31) && eot < vocab, tok_where, ": inconsistent vocab_size/eot_id");
  data.vocab_size_ = static_cast<int>(vocab);
  data.eot_id_ = static_cast<std::int32_t>(eot);
  const std::uint64_t width = get_u64(m, "token_bytes", manifest_path);
  require(width == token_bytes_for_vocab(data.vocab_size_), manifest_path, ": token_bytes ", width,
          " does not fit vocabulary size ", vocab);

  if (options.tokenizer) {
    const Tokenizer& t = *options.tokenizer;
    require(data.made_with(t), "dataset '", dir, "' was prepared with tokenizer ", data.tokenizer_spec_, " (hash ",
            data.tokenizer_hash_, ", vocabulary ", vocab, ", end-of-text ", eot, ") but the tokenizer given is ",
            t.spec(), " (hash ", data.legacy_hash_ ? t.legacy_content_hash() : t.content_hash(), ", vocabulary ",
            t.vocab_size(), ", end-of-text ", t.eot_id(), ")");
  }

  require(m.contains("splits") && m["splits"].is_object() && m["splits"].contains(split), manifest_path,
          ": no split \"", split, "\"");
  const nlohmann::json& s = m["splits"][split];
  const std::string split_where = manifest_path + " (split " + split + ")";
  const std::uint64_t split_tokens = get_u64(s, "tokens", split_where);
  require(s.contains("shards") && s["shards"].is_array(), split_where, ": missing \"shards\"");

  std::uint64_t total = 0;
  for (const nlohmann::json& entry : s["shards"]) {
    require(entry.is_object(), split_where, ": malformed shard entry");
    const std::string file = get_string(entry, "file", split_where);
    require(is_shard_file_name(file), split_where, ": bad shard file name '", file, "'");
    Shard shard;
    shard.path = (fs::path(dir) / file).string();
    shard.tokens = static_cast<std::int64_t>(get_u64(entry, "tokens", split_where));
    shard.width = static_cast<std::uint32_t>(width);
    const std::string checksum = get_string(entry, "checksum", split_where);

    const int fd = ::open(shard.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open shard '", shard.path, "': ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail("cannot stat shard '", shard.path, "': ", std::strerror(err));
    }
    const std::uint64_t expected = kShardHeaderBytes + static_cast<std::uint64_t>(shard.tokens) * width;
    if (static_cast<std::uint64_t>(st.st_size) != expected) {
      ::close(fd);
      fail(shard.path, ": size ", st.st_size, " bytes, expected ", expected, " for ", shard.tokens,
           " tokens (truncated or corrupt shard)");
    }
    shard.size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, shard.size, PROT_READ, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    ::close(fd);
    if (map == MAP_FAILED) fail("cannot map shard '", shard.path, "': ", std::strerror(map_errno));
    shard.base = static_cast<const unsigned char*>(map);
    const ShardHeader h = decode_shard_header(shard.base, shard.size, shard.path);
    require(h.token_bytes == width && h.vocab_size == vocab && h.num_tokens == static_cast<std::uint64_t>(shard.tokens),
            shard.path, ": header (", h.num_tokens, " tokens of ", h.token_bytes, " bytes, vocabulary ", h.vocab_size,
            ") does not match the manifest (", shard.tokens, " tokens of ", width, " bytes, vocabulary ", vocab, ")");
    require(hex64(h.checksum) == checksum, shard.path, ": header checksum ", hex64(h.checksum),
            " does not match the manifest's ", checksum);
    shard.checksum = h.checksum;
    total += static_cast<std::uint64_t>(shard.tokens);
    data.shard_begin_.push_back(data.num_tokens_);
    data.num_tokens_ += shard.tokens;
    data.shards_.push_back(std::move(shard));
  }
  require(total == split_tokens, split_where, ": shards hold ", total, " tokens but the manifest says ", split_tokens);
  require(total > 0, "split '", split, "' of '", dir, "' is empty");

  if (options.verify_checksums) {
    parallel_for_each(data.shards_.size(), [&](std::size_t i) {
      const Shard& shard = data.shards_[i];
      const auto [hash, max_id] = scan_payload(shard.payload(), shard.tokens, shard.width);
      require(hash == shard.checksum, shard.path, ": checksum mismatch (payload hash ", hex64(hash), ", header says ",
              hex64(shard.checksum), "): the shard is corrupt");
      require(max_id < vocab, shard.path, ": token id ", max_id, " is not below the vocabulary size ", vocab);
    });
  }
  return data;
}

void TokenDataset::copy_from_shard(const Shard& shard, std::int64_t offset, std::span<std::int32_t> out) const {
  const unsigned char* p = shard.payload() + offset * shard.width;
  std::uint32_t max_id = 0;
  if (shard.width == 2) {
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::uint32_t v = p[2 * i] | (static_cast<std::uint32_t>(p[2 * i + 1]) << 8);
      max_id = std::max(max_id, v);
      out[i] = static_cast<std::int32_t>(v);
    }
  } else {
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::uint32_t v = static_cast<std::uint32_t>(p[4 * i]) | (static_cast<std::uint32_t>(p[4 * i + 1]) << 8) |
                              (static_cast<std::uint32_t>(p[4 * i + 2]) << 16) |
                              (static_cast<std::uint32_t>(p[4 * i + 3]) << 24);
      max_id = std::max(max_id, v);
      out[i] = static_cast<std::int32_t>(v);
    }
  }
  // Cheap next to the copy, and catches unverified shards with out-of-range ids.
  require(max_id < static_cast<std::uint32_t>(vocab_size_), shard.path, ": token id ", max_id,
          " is not below the vocabulary size ", vocab_size_);
}

void TokenDataset::copy_tokens(std::int64_t begin, std::span<std::int32_t> out) const {
  const auto n = static_cast<std::int64_t>(out.size());
  require(begin >= 0 && begin + n <= num_tokens_, "token range [", begin, ", ", begin + n, ") is outside split '",
          split_, "' of '", dir_, "' (", num_tokens_, " tokens)");
  std::size_t s = static_cast<std::size_t>(
      std::upper_bound(shard_begin_.begin(), shard_begin_.end(), begin) - shard_begin_.begin() - 1);
  std::int64_t done = 0;
  while (done < n) {
    const Shard& shard = shards_[s];
    const std::int64_t offset = begin + done - shard_begin_[s];
    const std::int64_t take = std::min(n - done, shard.tokens - offset);
    copy_from_shard(shard, offset, out.subspan(static_cast<std::size_t>(done), static_cast<std::size_t>(take)));
    done += take;
    ++s;
  }
}

std::int32_t TokenDataset::token(std::int64_t i) const {
  std::int32_t value = 0;
  copy_tokens(i, std::span<std::int32_t>(&value, 1));
  return value;
}

bool TokenDataset::made_with(const Tokenizer& t) const {
  return (legacy_hash_ ? t.legacy_content_hash() : t.content_hash()) == tokenizer_hash_ &&
         t.vocab_size() == vocab_size_ && t.eot_id() == eot_id_;
}

std::unique_ptr<Tokenizer> open_dataset_tokenizer(const TokenDataset& data) {
  std::vector<std::string> specs = {data.tokenizer_spec()};
  if (!data.tokenizer_spec_when_prepared_.empty() && data.tokenizer_spec_when_prepared_ != specs[0])
    specs.push_back(data.tokenizer_spec_when_prepared_);
  std::string tried;
  for (const std::string& spec : specs) {
    std::unique_ptr<Tokenizer> tokenizer;
    try {
      tokenizer = make_tokenizer(spec);
    } catch (const Error& e) {
      tried += concat(tried.empty() ? "" : "; ", e.what());
      continue;
    }
    if (data.made_with(*tokenizer)) return tokenizer;
    tried += concat(tried.empty() ? "" : "; ", spec, " has hash ",
                    data.legacy_hash_ ? tokenizer->legacy_content_hash() : tokenizer->content_hash(), ", vocabulary ",
                    tokenizer->vocab_size(), ", end-of-text ", tokenizer->eot_id());
  }
  fail("the tokenizer '", data.dir(), "' was prepared with (hash ", data.tokenizer_hash(), ", vocabulary ",
       data.vocab_size(), ", end-of-text ", data.eot_id(), ") is not found or has changed since: ", tried,
       "; tokenizers are matched by content: put a byte-identical copy at ", data.tokenizer_spec());
}

void to_json(nlohmann::json& j, const LoaderPosition& position) {
  j = nlohmann::json{{"epoch", position.epoch}, {"step", position.step}};
}

void from_json(const nlohmann::json& j, LoaderPosition& position) {
  require(j.is_object(), "loader position: expected an object with \"epoch\" and \"step\"");
  position.epoch = get_u64(j, "epoch", "loader position");
  position.step = get_u64(j, "step", "loader position");
}

BatchLoader::BatchLoader(const TokenDataset& data, int global_batch, int seq_len, std::uint64_t data_seed, int rank,
                         int world)
    : data_(&data), global_batch_(global_batch), seq_len_(seq_len), data_seed_(data_seed), rank_(rank), world_(world) {
  require(seq_len > 0, "sequence length must be positive, got ", seq_len);
  require(global_batch > 0, "global batch must be positive, got ", global_batch);
  require(world > 0 && rank >= 0 && rank < world, "rank ", rank, " is not in [0, ", world, ")");
  require(global_batch % world == 0, "global batch ", global_batch, " is not divisible by the ", world, " ranks");
  num_windows_ = data.num_tokens() > seq_len ? (data.num_tokens() - 1) / seq_len : 0;
  require(num_windows_ >= 1, "split '", data.split(), "' of '", data.dir(), "' has ", data.num_tokens(),
          " tokens, fewer than one window of seq_len+1 = ", seq_len + 1);
  steps_per_epoch_ = num_windows_ / global_batch;
  require(steps_per_epoch_ >= 1, "split '", data.split(), "' of '", data.dir(), "' has ", num_windows_,
          " windows of ", seq_len + 1, " tokens, fewer than one global batch of ", global_batch);
}

std::vector<std::int64_t> BatchLoader::epoch_order(std::uint64_t epoch) const {
  std::vector<std::int64_t> order(static_cast<std::size_t>(num_windows_));
  for (std::int64_t i = 0; i < num_windows_; ++i) order[static_cast<std::size_t>(i)] = i;
  // Fisher-Yates with our own generator: std::shuffle's result is implementation-defined.
  Rng rng(data_seed_, "attnres-batch-order-epoch-" + std::to_string(epoch));
  for (std::int64_t i = num_windows_ - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i) + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

void BatchLoader::window(std::int64_t index, std::span<std::int32_t> out) const {
  require(index >= 0 && index < num_windows_, "window ", index, " is outside [0, ", num_windows_, ")");
  require(out.size() == static_cast<std::size_t>(seq_len_) + 1, "window buffer holds ", out.size(),
          " tokens, expected seq_len+1 = ", seq_len_ + 1);
  data_->copy_tokens(index * seq_len_, out);
}

void BatchLoader::next(std::span<std::int32_t> out) {
  const std::size_t window_size = static_cast<std::size_t>(seq_len_) + 1;
  const int local = local_batch();
  require(out.size() == static_cast<std::size_t>(local) * window_size, "batch buffer holds ", out.size(),
          " tokens, expected (global_batch/world)*(seq_len+1) = ", static_cast<std::size_t>(local) * window_size);
  if (!order_valid_ || order_epoch_ != position_.epoch) {
    order_ = epoch_order(position_.epoch);
    order_epoch_ = position_.epoch;
    order_valid_ = true;
  }
  const std::size_t first = static_cast<std::size_t>(position_.step) * static_cast<std::size_t>(global_batch_) +
                            static_cast<std::size_t>(rank_) * static_cast<std::size_t>(local);
  for (int k = 0; k < local; ++k)
    window(order_[first + static_cast<std::size_t>(k)], out.subspan(static_cast<std::size_t>(k) * window_size, window_size));
  if (++position_.step == static_cast<std::uint64_t>(steps_per_epoch_)) {
    position_.step = 0;
    ++position_.epoch;
  }
}

void BatchLoader::seek(LoaderPosition pos) {
  require(pos.step < static_cast<std::uint64_t>(steps_per_epoch_), "loader position step ", pos.step,
          " is beyond the ", steps_per_epoch_, " steps of an epoch");
  position_ = pos;
}

}  // namespace attnres::data
