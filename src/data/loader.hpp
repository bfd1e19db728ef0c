// Reading prepared datasets: a memory-mapped split (TokenDataset) and the deterministic,
// resumable batch order used by training (BatchLoader).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.hpp"

namespace attnres::data {

struct DatasetOpenOptions {
  // Hash every shard's payload and check every id < vocabulary size at open (one pass over
  // the data, parallel over shards). When off, ids are still range-checked as they are read.
  bool verify_checksums = true;
  // When set, the manifest's tokenizer content hash, vocabulary size and end-of-text id must
  // match it (wherever its files are: tokenizers are matched by content, not path).
  const Tokenizer* tokenizer = nullptr;
};

class TokenDataset {   // one split ("train"|"val"|"test") of a prepared directory, memory-mapped shards
 public:
  // Validates the manifest, every shard's header and size, and (by default) checksums and ids.
  // Throws attnres::Error naming the file at fault.
  static TokenDataset open(const std::string& dir, const std::string& split);
  static TokenDataset open(const std::string& dir, const std::string& split, const DatasetOpenOptions& options);

  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;
  TokenDataset(const TokenDataset&) = delete;
  TokenDataset& operator=(const TokenDataset&) = delete;
  ~TokenDataset();

  std::int64_t num_tokens() const { return num_tokens_; }
  int vocab_size() const { return vocab_size_; }
  std::int32_t eot_id() const { return eot_id_; }
  // The manifest's tokenizer spec with its path taken from the directory (absolute); version 1
  // manifests recorded it absolute.
  const std::string& tokenizer_spec() const { return tokenizer_spec_; }
  // The content hash the manifest records: Tokenizer::content_hash(), or for a version 1
  // manifest legacy_content_hash().
  const std::string& tokenizer_hash() const { return tokenizer_hash_; }
  // The tokenizer's content hash, vocabulary size and end-of-text id are the manifest's.
  bool made_with(const Tokenizer& tokenizer) const;
  const std::string& dir() const { return dir_; }
  const std::string& split() const { return split_; }

  friend std::unique_ptr<Tokenizer> open_dataset_tokenizer(const TokenDataset& data);

  std::int32_t token(std::int64_t i) const;                 // global index across shards
  void copy_tokens(std::int64_t begin, std::span<std::int32_t> out) const;

 private:
  struct Shard;
  TokenDataset();
  void copy_from_shard(const Shard& shard, std::int64_t offset, std::span<std::int32_t> out) const;

  std::string dir_, split_;
  std::string tokenizer_spec_, tokenizer_hash_;
  std::string tokenizer_spec_when_prepared_;  // the absolute spec at prepare time (version 2), a fallback
  bool legacy_hash_ = false;                  // a version 1 manifest: hash64 content hash
  int vocab_size_ = 0;
  std::int32_t eot_id_ = -1;
  std::int64_t num_tokens_ = 0;
  std::vector<Shard> shards_;
  std::vector<std::int64_t> shard_begin_;  // first global index of each shard
};

// Builds the tokenizer a dataset was prepared with: from the manifest's spec relative to the
// directory, else (the directory was moved without it) from the absolute spec recorded at prepare
// time, and checks that its content hash is the manifest's (the files there may have changed
// since). Throws attnres::Error naming the paths tried and both hashes.
std::unique_ptr<Tokenizer> open_dataset_tokenizer(const TokenDataset& data);

struct LoaderPosition {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;  // global batches already taken in this epoch
  bool operator==(const LoaderPosition&) const = default;
};
void to_json(nlohmann::json& j, const LoaderPosition& position);
void from_json(const nlohmann::json& j, LoaderPosition& position);  // throws attnres::Error

class BatchLoader {
 public:
  // Cuts the split into non-overlapping windows of seq_len+1 tokens (window i starts at token
  // i*seq_len), ordered by a permutation fixed by (data_seed, epoch). A global batch is
  // `global_batch` consecutive windows of that order; rank r of `world` gets windows
  // [r*global_batch/world, (r+1)*global_batch/world) of it. An epoch is the
  // floor(num_windows/global_batch) full batches; the remaining windows of that epoch's order
  // are not used, and the next epoch draws a new permutation.
  // `data` must outlive the loader. Throws attnres::Error for a bad geometry.
  BatchLoader(const TokenDataset& data, int global_batch, int seq_len, std::uint64_t data_seed, int rank = 0,
              int world = 1);

  void next(std::span<std::int32_t> out);  // out.size() == (global_batch/world)*(seq_len+1); advances
  LoaderPosition position() const { return position_; }
  void seek(LoaderPosition pos);           // throws if pos.step >= steps_per_epoch()
  std::int64_t num_windows() const { return num_windows_; }
  void window(std::int64_t index, std::span<std::int32_t> out) const;  // unshuffled window i, for evaluation

  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int local_batch() const { return global_batch_ / world_; }
  int seq_len() const { return seq_len_; }

  // The window order of one epoch (a permutation of [0, num_windows)); exposed for tests.
  std::vector<std::int64_t> epoch_order(std::uint64_t epoch) const;

 private:
  const TokenDataset* data_;
  int global_batch_, seq_len_;
  std::uint64_t data_seed_;
  int rank_, world_;
  std::int64_t num_windows_ = 0;
  std::int64_t steps_per_epoch_ = 0;
  LoaderPosition position_;
  std::vector<std::int64_t> order_;  // permutation of the current epoch
  std::uint64_t order_epoch_ = 0;
  bool order_valid_ = false;
};

}  // namespace attnres::data
