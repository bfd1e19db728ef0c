// TokenDataset validation and BatchLoader order, sharding across ranks and resumption.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "data/hash.hpp"
#include "data/loader.hpp"
#include "data/prepare.hpp"
#include "data/shard.hpp"
#include "data_test_util.hpp"
#include "util/error.hpp"

namespace attnres::data {
namespace {

using namespace testing;
using Ids = std::vector<std::int32_t>;

template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// A bytes-tokenized dataset of `docs` documents, all in train, in shards of `shard_tokens`.
std::string make_dataset(const TempDir& tmp, int docs = 40, std::int64_t shard_tokens = 300) {
  std::string jsonl;
  for (int i = 0; i < docs; ++i) jsonl += "{\"text\": \"document number " + std::to_string(i) + " with some text\"}\n";
  write_file(tmp / "in.jsonl", jsonl);
  PrepareOptions o;
  const std::string inputs[] = {tmp / "in.jsonl"};
  o.inputs = expand_inputs(inputs);
  o.out_dir = tmp / "data";
  o.fractions = SplitFractions{0, 0};
  o.shard_tokens = shard_tokens;
  o.progress = false;
  prepare_dataset(o, *make_tokenizer("bytes"));
  return o.out_dir;
}

Ids all_tokens(const TokenDataset& d) {
  Ids ids(static_cast<std::size_t>(d.num_tokens()));
  for (std::int64_t i = 0; i < d.num_tokens(); ++i) ids[static_cast<std::size_t>(i)] = d.token(i);
  return ids;
}

TEST(DataTokenDataset, ReadsAcrossShards) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp);
  const TokenDataset d = TokenDataset::open(dir, "train");
  EXPECT_EQ(d.vocab_size(), 257);
  EXPECT_EQ(d.eot_id(), 256);
  EXPECT_EQ(d.tokenizer_spec(), "bytes");
  EXPECT_EQ(d.tokenizer_hash(), make_tokenizer("bytes")->content_hash());
  const Ids all = all_tokens(d);
  EXPECT_EQ(all[0], 256);
  EXPECT_EQ(all[1], 'd');
  // Every range, including ones spanning shard boundaries (every 300 tokens).
  for (std::int64_t begin : {0, 1, 250, 299, 300, 599, 1000}) {
    for (std::size_t n : {0u, 1u, 2u, 350u, 700u}) {
      if (begin + static_cast<std::int64_t>(n) > d.num_tokens()) continue;
      Ids out(n);
      d.copy_tokens(begin, out);
      EXPECT_TRUE(std::equal(out.begin(), out.end(), all.begin() + begin)) << begin << "+" << n;
    }
  }
  Ids too_many(2);
  EXPECT_THROW(d.copy_tokens(d.num_tokens() - 1, too_many), Error);
  EXPECT_THROW(d.token(-1), Error);
  TokenDataset moved = std::move(const_cast<TokenDataset&>(d));
  EXPECT_EQ(all_tokens(moved), all);
}

nlohmann::json manifest(const std::string& dir) { return nlohmann::json::parse(read_file(dir + "/manifest.json")); }
void save_manifest(const std::string& dir, const nlohmann::json& m) { write_file(dir + "/manifest.json", m.dump(2)); }

// Rewrites a shard's payload token `index` to `value`, fixing the header and manifest checksums
// so that only the id check can catch it.
void plant_token(const std::string& dir, std::size_t index, std::uint16_t value) {
  const std::string path = dir + "/train-00000.bin";
  std::string bytes = read_file(path);
  bytes[kShardHeaderBytes + 2 * index] = static_cast<char>(value & 0xFF);
  bytes[kShardHeaderBytes + 2 * index + 1] = static_cast<char>(value >> 8);
  ShardHeader h = decode_shard_header(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), path);
  h.checksum = hash64(std::string_view(bytes).substr(kShardHeaderBytes));
  unsigned char header[kShardHeaderBytes];
  encode_shard_header(h, header);
  bytes.replace(0, kShardHeaderBytes, reinterpret_cast<const char*>(header), kShardHeaderBytes);
  write_file(path, bytes);
  nlohmann::json m = manifest(dir);
  m["splits"]["train"]["shards"][0]["checksum"] = hex64(h.checksum);
  save_manifest(dir, m);
}

TEST(DataTokenDataset, RejectsDamagedData) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp);
  const std::string shard = dir + "/train-00000.bin";
  const std::string good = read_file(shard);
  const nlohmann::json good_manifest = manifest(dir);
  auto restore = [&] {
    write_file(shard, good);
    save_manifest(dir, good_manifest);
  };

  write_file(shard, good.substr(0, good.size() - 2));
  expect_error([&] { TokenDataset::open(dir, "train"); }, shard + ": size 662 bytes, expected 664 for 300 tokens (truncated or corrupt shard)");
  restore();

  std::string flipped = good;
  flipped[kShardHeaderBytes + 10] ^= 1;
  write_file(shard, flipped);
  expect_error([&] { TokenDataset::open(dir, "train"); }, shard + ": checksum mismatch");
  DatasetOpenOptions lazy;
  lazy.verify_checksums = false;
  EXPECT_NO_THROW(TokenDataset::open(dir, "train", lazy));  // header and size are still right
  restore();

  std::string magic = good;
  magic[0] = 'X';
  write_file(shard, magic);
  expect_error([&] { TokenDataset::open(dir, "train"); }, shard + ": not an attnres token shard (bad magic)");
  restore();

  plant_token(dir, 7, 300);  // 300 >= vocabulary 257
  expect_error([&] { TokenDataset::open(dir, "train"); }, shard + ": token id 300 is not below the vocabulary size 257");
  const TokenDataset unverified = TokenDataset::open(dir, "train", lazy);
  Ids window(10);
  expect_error([&] { unverified.copy_tokens(0, window); }, "token id 300 is not below the vocabulary size 257");
  restore();

  nlohmann::json m = good_manifest;
  m["splits"]["train"]["tokens"] = 5;
  save_manifest(dir, m);
  expect_error([&] { TokenDataset::open(dir, "train"); }, "shards hold");
  restore();

  write_file(dir + "/manifest.json", "{\"format\": ");
  expect_error([&] { TokenDataset::open(dir, "train"); }, "manifest.json: malformed JSON");
  fs::remove(dir + "/manifest.json");
  expect_error([&] { TokenDataset::open(dir, "train"); }, "is not a prepared dataset: no manifest.json");
  restore();
  expect_error([&] { TokenDataset::open(dir, "dev"); }, "unknown split 'dev'");
  EXPECT_NO_THROW(TokenDataset::open(dir, "train"));
}

TEST(DataTokenDataset, ChecksTheTokenizer) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp);
  const auto bytes = make_tokenizer("bytes");
  DatasetOpenOptions o;
  o.tokenizer = bytes.get();
  EXPECT_NO_THROW(TokenDataset::open(dir, "train", o));
  EXPECT_EQ(open_dataset_tokenizer(TokenDataset::open(dir, "train"))->spec(), "bytes");
  if (!have_gpt2()) return;
  const auto gpt2 = make_tokenizer("gpt2:" + gpt2_dir());
  o.tokenizer = gpt2.get();
  expect_error([&] { TokenDataset::open(dir, "train", o); }, "was prepared with tokenizer bytes");
  // A manifest whose recorded hash no longer matches the tokenizer's files.
  nlohmann::json m = manifest(dir);
  m["tokenizer"]["hash"] = "0000000000000000";
  save_manifest(dir, m);
  expect_error([&] { open_dataset_tokenizer(TokenDataset::open(dir, "train")); }, "changed since");
}

TEST(DataTokenDataset, ReadsVersionOneManifests) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp);
  const auto bytes = make_tokenizer("bytes");
  // As version 1 wrote it: no relative spec, fallback or algorithm; a hash64 content hash.
  nlohmann::json m = manifest(dir);
  m["format_version"] = 1;
  m["tokenizer"] = {{"spec", "bytes"}, {"hash", bytes->legacy_content_hash()}, {"vocab_size", 257}, {"eot_id", 256}};
  save_manifest(dir, m);
  const TokenDataset d = TokenDataset::open(dir, "train");
  EXPECT_TRUE(d.made_with(*bytes));
  EXPECT_EQ(open_dataset_tokenizer(d)->content_hash(), bytes->content_hash());
  ASSERT_NE(bytes->legacy_content_hash(), bytes->content_hash());
  m["tokenizer"]["hash"] = bytes->content_hash();  // the new digest in an old manifest: not its tokenizer
  save_manifest(dir, m);
  EXPECT_FALSE(TokenDataset::open(dir, "train").made_with(*bytes));
  m["format_version"] = 3;
  save_manifest(dir, m);
  expect_error([&] { TokenDataset::open(dir, "train"); }, "manifest version 3 is not supported (expected 1 or 2");
}

TEST(DataBatchLoader, WindowsAndEpochOrder) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp);
  const TokenDataset d = TokenDataset::open(dir, "train");
  const Ids all = all_tokens(d);
  const int seq = 16;
  BatchLoader loader(d, 4, seq, 1234);
  EXPECT_EQ(loader.num_windows(), (d.num_tokens() - 1) / seq);
  EXPECT_EQ(loader.steps_per_epoch(), loader.num_windows() / 4);
  Ids w(seq + 1);
  loader.window(3, w);
  EXPECT_TRUE(std::equal(w.begin(), w.end(), all.begin() + 3 * seq));
  const auto order0 = loader.epoch_order(0);
  std::set<std::int64_t> unique(order0.begin(), order0.end());
  EXPECT_EQ(unique.size(), static_cast<std::size_t>(loader.num_windows()));
  EXPECT_EQ(*unique.begin(), 0);
  EXPECT_EQ(*unique.rbegin(), loader.num_windows() - 1);
  EXPECT_EQ(order0, BatchLoader(d, 4, seq, 1234).epoch_order(0));
  EXPECT_NE(order0, loader.epoch_order(1));
  EXPECT_NE(order0, BatchLoader(d, 4, seq, 1235).epoch_order(0));
  // Pinned: the order is part of what a seed means (our own shuffle, not std::shuffle).
  const std::vector<std::int64_t> first(order0.begin(), order0.begin() + 5);
  EXPECT_EQ(first, (std::vector<std::int64_t>{55, 22, 54, 58, 9})) << "shuffle changed";

  // next() walks the order batch by batch and wraps into a freshly permuted epoch.
  Ids batch(4 * (seq + 1));
  for (std::int64_t step = 0; step < loader.steps_per_epoch(); ++step) {
    EXPECT_EQ(loader.position(), (LoaderPosition{0, static_cast<std::uint64_t>(step)}));
    loader.next(batch);
    for (int k = 0; k < 4; ++k) {
      loader.window(order0[static_cast<std::size_t>(step * 4 + k)], w);
      EXPECT_TRUE(std::equal(w.begin(), w.end(), batch.begin() + k * (seq + 1)));
    }
  }
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
  loader.next(batch);
  loader.window(loader.epoch_order(1)[0], w);
  EXPECT_TRUE(std::equal(w.begin(), w.end(), batch.begin()));
}

TEST(DataBatchLoader, RanksPartitionTheGlobalBatchAndSeekResumes) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp);
  const TokenDataset d = TokenDataset::open(dir, "train");
  const int seq = 8, gb = 6;
  BatchLoader whole(d, gb, seq, 7);
  BatchLoader r0(d, gb, seq, 7, 0, 3), r1(d, gb, seq, 7, 1, 3), r2(d, gb, seq, 7, 2, 3);
  Ids global(gb * (seq + 1)), part(2 * (seq + 1));
  for (int step = 0; step < 2 * whole.steps_per_epoch() + 3; ++step) {
    whole.next(global);
    Ids joined;
    for (BatchLoader* r : {&r0, &r1, &r2}) {
      r->next(part);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    ASSERT_EQ(joined, global) << "step " << step;
  }
  // Resume from a saved position (through JSON) and get the same batches.
  const nlohmann::json saved = whole.position();
  Ids expected_next(global.size());
  whole.next(expected_next);
  BatchLoader resumed(d, gb, seq, 7);
  resumed.seek(saved.get<LoaderPosition>());
  resumed.next(global);
  EXPECT_EQ(global, expected_next);
  EXPECT_EQ(saved, (nlohmann::json{{"epoch", 2}, {"step", 3}}));
}

TEST(DataBatchLoader, Errors) {
  TempDir tmp;
  const std::string dir = make_dataset(tmp, 2);
  const TokenDataset d = TokenDataset::open(dir, "train");
  expect_error([&] { BatchLoader(d, 5, 4, 0, 0, 2); }, "global batch 5 is not divisible by the 2 ranks");
  expect_error([&] { BatchLoader(d, 2, static_cast<int>(d.num_tokens()), 0); }, "fewer than one window");
  expect_error([&] { BatchLoader(d, 1000, 4, 0); }, "fewer than one global batch of 1000");
  expect_error([&] { BatchLoader(d, 2, 4, 0, 2, 2); }, "rank 2 is not in [0, 2)");
  BatchLoader ok(d, 2, 4, 0);
  Ids wrong(3);
  expect_error([&] { ok.next(wrong); }, "expected (global_batch/world)*(seq_len+1) = 10");
  expect_error([&] { ok.seek(LoaderPosition{0, 1000}); }, "loader position step 1000 is beyond");
  expect_error([] { nlohmann::json::object({{"epoch", 1}}).get<LoaderPosition>(); }, "loader position: missing or invalid \"step\"");
}

}  // namespace
}  // namespace attnres::data
