// prepare: shards and manifest, determinism, bad input, atomicity, and the CLI around it.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "data/corpus.hpp"
#include "data/hash.hpp"
#include "data/loader.hpp"
#include "data/prepare.hpp"
#include "data/progress.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "data_test_util.hpp"
#include "util/error.hpp"

namespace attnres::data {
namespace {

using namespace testing;
using Ids = std::vector<std::int32_t>;

// Ids above 65535 force 32-bit shards.
class WideTokenizer final : public Tokenizer {
 public:
  std::vector<std::int32_t> encode(std::string_view text) const override {
    Ids ids;
    for (unsigned char c : text) ids.push_back(69000 + c);
    return ids;
  }
  std::string decode(std::span<const std::int32_t>) const override { return {}; }
  int vocab_size() const override { return 70000; }
  std::int32_t eot_id() const override { return 69999; }
  const std::string& spec() const override { return spec_; }
  std::string content_hash() const override { return "wide"; }
  std::string legacy_content_hash() const override { return "wide"; }

 private:
  std::string spec_ = "wide";
};

struct Corpus {
  std::vector<std::string> paths;
  std::vector<std::string> texts;  // every non-empty document, in input order
  std::vector<std::string> keys;   // its split key
};

// A mixed corpus: JSONL with ids, gzip JSONL without ids, a directory of text files (one gzip).
Corpus make_corpus(const TempDir& tmp, int docs_per_file = 60) {
  Corpus c;
  std::string a;
  for (int i = 0; i < docs_per_file; ++i) {
    // concat() rather than "literal" + std::string: GCC 12 gives a false -Wrestrict on the latter.
    const std::string text = concat("document ", i, " of file a\nwith two lines");
    a += concat("{\"id\": \"a", i, "\", \"text\": \"document ", i, " of file a\\nwith two lines\"}\n");
    c.texts.push_back(text);
    c.keys.push_back(concat("a", i));
    if (i == 5) a += "{\"id\": \"empty\", \"text\": \"   \"}\n\n";  // skipped and counted; a blank line
  }
  write_file(tmp / "in/a.jsonl", a);
  std::string b;
  for (int i = 0; i < docs_per_file; ++i) {
    const std::string text = "gzip document number " + std::to_string(i) + " \xC3\xA9t\xC3\xA9";
    b += "{\"text\": \"" + text + "\", \"meta\": {\"n\": " + std::to_string(i) + "}}\n";
    c.texts.push_back(text);
    c.keys.push_back(text);
  }
  write_gzip(tmp / "in/b.jsonl.gz", b);
  write_file(tmp / "in/dir/one.txt", "a whole text file\n\nis one document\n");
  write_gzip(tmp / "in/dir/two.txt.gz", "so is a compressed one");
  c.texts.push_back("a whole text file\n\nis one document\n");
  c.keys.push_back(c.texts.back());
  c.texts.push_back("so is a compressed one");
  c.keys.push_back(c.texts.back());
  c.paths = {tmp / "in/a.jsonl", tmp / "in/b.jsonl.gz", tmp / "in/dir"};
  return c;
}

PrepareOptions options_for(const std::vector<std::string>& paths, const std::string& out) {
  PrepareOptions o;
  o.inputs = expand_inputs(paths);
  o.out_dir = out;
  o.fractions = SplitFractions{0.2, 0.1};
  o.progress = false;
  return o;
}

Ids read_split(const std::string& dir, const std::string& split) {
  const TokenDataset data = TokenDataset::open(dir, split);
  Ids ids(static_cast<std::size_t>(data.num_tokens()));
  data.copy_tokens(0, ids);
  return ids;
}

nlohmann::json read_manifest(const std::string& dir) { return nlohmann::json::parse(read_file(dir + "/manifest.json")); }

std::vector<std::string> dir_listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(DataPrepare, ShardsHoldEveryDocumentInInputOrder) {
  TempDir tmp;
  const Corpus c = make_corpus(tmp);
  const auto tok = make_tokenizer("bytes");
  PrepareOptions o = options_for(c.paths, tmp / "out");
  const PrepareSummary summary = prepare_dataset(o, *tok);

  std::map<std::string, Ids> expected;
  std::map<std::string, std::uint64_t> docs;
  for (std::size_t i = 0; i < c.texts.size(); ++i) {
    const std::string split = split_name(assign_split(c.keys[i], o.fractions));
    Ids& ids = expected[split];
    ids.push_back(256);
    for (unsigned char ch : c.texts[i]) ids.push_back(ch);
    ++docs[split];
  }
  ASSERT_GT(docs["val"], 0u);
  ASSERT_GT(docs["test"], 0u);
  for (const char* split : {"train", "val", "test"}) EXPECT_EQ(read_split(tmp / "out", split), expected[split]) << split;
  EXPECT_EQ(summary.skipped_empty, 1u);

  const nlohmann::json m = read_manifest(tmp / "out");
  EXPECT_EQ(m["format"], "attnres-token-shards");
  EXPECT_EQ(m["format_version"], 2);
  EXPECT_EQ(m["tokenizer"]["spec"], "bytes");
  EXPECT_EQ(m["tokenizer"]["hash"], tok->content_hash());
  EXPECT_EQ(m["tokenizer"]["vocab_size"], 257);
  EXPECT_EQ(m["tokenizer"]["eot_id"], 256);
  EXPECT_EQ(m["token_bytes"], 2);
  EXPECT_EQ(m["split"]["val_fraction"], 0.2);
  EXPECT_EQ(m["split"]["test_fraction"], 0.1);
  EXPECT_EQ(m["skipped"]["empty_documents"], 1);
  ASSERT_EQ(m["sources"].size(), 4u);
  EXPECT_EQ(m["sources"][0]["path"], tmp / "in/a.jsonl");
  EXPECT_EQ(m["sources"][0]["hash"], hex64(hash_file(tmp / "in/a.jsonl")));
  EXPECT_EQ(m["sources"][1]["bytes"], fs::file_size(tmp / "in/b.jsonl.gz"));
  EXPECT_EQ(m["sources"][3]["path"], tmp / "in/dir/two.txt.gz");
  for (const char* split : {"train", "val", "test"}) {
    EXPECT_EQ(m["splits"][split]["documents"], docs[split]);
    EXPECT_EQ(m["splits"][split]["tokens"], expected[split].size());
    const auto& shard = m["splits"][split]["shards"][0];
    EXPECT_EQ(shard["file"], std::string(split) + "-00000.bin");
    const std::string bytes = read_file(tmp / ("out/" + shard["file"].get<std::string>()));
    EXPECT_EQ(shard["bytes"], bytes.size());
    EXPECT_EQ(shard["checksum"], hex64(hash64(std::string_view(bytes).substr(kShardHeaderBytes))));
    EXPECT_EQ(bytes.substr(0, 8), "ATTNTOKS");
  }
  EXPECT_EQ(dir_listing(tmp / "out"), (std::vector<std::string>{"manifest.json", "test-00000.bin", "train-00000.bin",
                                                                "val-00000.bin"}));
}

TEST(DataPrepare, OutputIndependentOfThreadCount) {
  TempDir tmp;
  const Corpus c = make_corpus(tmp, 300);
  const auto tok = make_tokenizer("bytes");
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    PrepareOptions o = options_for(c.paths, tmp / ("out" + std::to_string(threads)));
    o.batch_bytes = 4096;  // many small parallel rounds
    prepare_dataset(o, *tok);
  }
  omp_set_num_threads(saved);
  for (const std::string name : {"manifest.json", "train-00000.bin", "val-00000.bin", "test-00000.bin"}) {
    EXPECT_EQ(read_file(tmp / ("out1/" + name)), read_file(tmp / ("out2/" + name))) << name;
    EXPECT_EQ(read_file(tmp / ("out1/" + name)), read_file(tmp / ("out3/" + name))) << name;
  }
}

// Documents of a split, as texts decoded from the bytes tokenizer's shards.
std::multiset<std::string> split_documents(const std::string& dir, const std::string& split) {
  std::multiset<std::string> docs;
  std::string current;
  bool open = false;
  for (std::int32_t id : read_split(dir, split)) {
    if (id == 256) {
      if (open) docs.insert(current);
      current.clear();
      open = true;
    } else {
      current.push_back(static_cast<char>(id));
    }
  }
  if (open) docs.insert(current);
  return docs;
}

TEST(DataPrepare, SplitIndependentOfFileOrder) {
  TempDir tmp;
  const Corpus c = make_corpus(tmp);
  const auto tok = make_tokenizer("bytes");
  prepare_dataset(options_for(c.paths, tmp / "fwd"), *tok);
  std::vector<std::string> reversed(c.paths.rbegin(), c.paths.rend());
  prepare_dataset(options_for(reversed, tmp / "rev"), *tok);
  for (const char* split : {"train", "val", "test"})
    EXPECT_EQ(split_documents(tmp / "fwd", split), split_documents(tmp / "rev", split)) << split;
}

TEST(DataPrepare, ShardCapAndWideTokens) {
  TempDir tmp;
  const Corpus c = make_corpus(tmp);
  const WideTokenizer tok;
  PrepareOptions o = options_for(c.paths, tmp / "out");
  o.fractions = SplitFractions{0, 0};
  o.shard_tokens = 1000;
  prepare_dataset(o, tok);
  const nlohmann::json m = read_manifest(tmp / "out");
  EXPECT_EQ(m["token_bytes"], 4);
  const auto& shards = m["splits"]["train"]["shards"];
  ASSERT_GT(shards.size(), 3u);
  std::uint64_t total = 0;
  for (const auto& s : shards) {
    EXPECT_LE(s["tokens"].get<std::uint64_t>(), 1000u);
    total += s["tokens"].get<std::uint64_t>();
  }
  EXPECT_EQ(total, m["splits"]["train"]["tokens"].get<std::uint64_t>());
  EXPECT_TRUE(m["splits"]["val"]["shards"].empty());
  Ids expected;
  for (const std::string& text : c.texts) {
    expected.push_back(69999);
    for (unsigned char ch : text) expected.push_back(69000 + ch);
  }
  EXPECT_EQ(read_split(tmp / "out", "train"), expected);
  EXPECT_THROW(TokenDataset::open(tmp / "out", "val"), Error);  // empty split
}

TEST(DataPrepare, FailureLeavesNothingThatLooksComplete) {
  TempDir tmp;
  const Corpus c = make_corpus(tmp);
  const auto tok = make_tokenizer("bytes");
  PrepareOptions good = options_for(c.paths, tmp / "out");
  good.shard_tokens = 500;  // several completed shards before the failure below
  prepare_dataset(good, *tok);
  write_file(tmp / "out/notes.txt", "kept");
  ASSERT_TRUE(fs::exists(tmp / "out/manifest.json"));
  std::vector<std::string> paths = c.paths;
  write_file(tmp / "z_bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": broken}\n");
  paths.push_back(tmp / "z_bad.jsonl");
  PrepareOptions bad = options_for(paths, tmp / "out");
  bad.shard_tokens = 500;
  EXPECT_THROW(prepare_dataset(bad, *tok), Error);
  EXPECT_EQ(dir_listing(tmp / "out"), std::vector<std::string>{"notes.txt"});
  EXPECT_THROW(TokenDataset::open(tmp / "out", "train"), Error);
}

// --- the CLI ---

std::string prepare_cli(const std::string& inputs, const std::string& out, const std::string& extra = "") {
  return "prepare --input " + inputs + " --tokenizer bytes --out " + quote(out) + " " + extra;
}

void expect_cli_error(const CliResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("attnres: error: " + needle), std::string::npos) << "stderr: " << r.err;
}

TEST(DataPrepareCli, BadInputsNameFileAndLine) {
  TempDir tmp;
  write_file(tmp / "malformed.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "malformed.jsonl"), tmp / "o1")), (tmp / "malformed.jsonl") + ":2: malformed JSON");
  write_file(tmp / "notext.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"content\": \"x\"}\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "notext.jsonl"), tmp / "o2")), (tmp / "notext.jsonl") + ":3: missing \"text\" field");
  write_file(tmp / "utf8.jsonl", "{\"text\": \"caf\xC3\"}\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "utf8.jsonl"), tmp / "o3")), (tmp / "utf8.jsonl") + ":1: invalid UTF-8");
  write_file(tmp / "utf8.txt", "ok\nok\n\xFE\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "utf8.txt"), tmp / "o4")), (tmp / "utf8.txt") + ":3: invalid UTF-8");
  write_file(tmp / "empty.jsonl", "");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "empty.jsonl"), tmp / "o5")), (tmp / "empty.jsonl") + ": empty input");
  // Several problems: the first in input order is reported, even across a read error.
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "malformed.jsonl") + " " + quote(tmp / "empty.jsonl"), tmp / "o5")),
                   (tmp / "malformed.jsonl") + ":2: malformed JSON");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "nothere.jsonl"), tmp / "o6")), "input '" + (tmp / "nothere.jsonl") + "' does not exist");
  fs::create_symlink(tmp / "gone.jsonl", tmp / "dangling.jsonl");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "dangling.jsonl"), tmp / "o7")), "input '" + (tmp / "dangling.jsonl") + "' does not exist");
  write_file(tmp / "allempty.jsonl", "{\"text\": \"\"}\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "allempty.jsonl"), tmp / "o8")), "the inputs hold no non-empty documents (1 empty ones skipped)");
  write_file(tmp / "ok.jsonl", "{\"text\": \"ok\"}\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "ok.jsonl"), tmp / "o9", "--val-fraction 0.7 --test-fraction 0.5")),
                   "--val-fraction + --test-fraction must be below 1");
  expect_cli_error(run_cli("prepare --input " + quote(tmp / "ok.jsonl") + " --tokenizer gpt2:/nonexistent --out " + quote(tmp / "o10")),
                   "GPT-2 tokenizer directory '/nonexistent' does not exist");
  for (const char* out : {"o1", "o2", "o3", "o4", "o5", "o8"}) EXPECT_FALSE(fs::exists(tmp / (std::string(out) + "/manifest.json")));
}

TEST(DataPrepareCli, ReportsProgressAndSummary) {
  TempDir tmp;
  const Corpus c = make_corpus(tmp);
  const CliResult r = run_cli(prepare_cli(quote(c.paths[0]) + " " + quote(c.paths[1]) + " " + quote(c.paths[2]), tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("prepare: done: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("skipped 1 empty document"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("1 empty documents"), std::string::npos) << r.err;  // issue #47: the noun agrees
  EXPECT_EQ(r.err.find('\r'), std::string::npos) << "no carriage returns when stderr is not a terminal";
  EXPECT_TRUE(fs::exists(tmp / "out/manifest.json"));
}

// Issue #47: the summary gives the size of the text, not of the compressed files it came from
// (which it names as such), and counts agree with their nouns.
TEST(DataPrepareCli, TheSummaryGivesTheTextSizeOfCompressedInputs) {
  TempDir tmp;
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the same line of text, again and again\n";
  write_gzip(tmp / "one.txt.gz", text);
  const CliResult r = run_cli(prepare_cli(quote(tmp / "one.txt.gz"), tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string want = "prepare: done: " + format_bytes(double(text.size())) + " of text (" +
                           format_bytes(double(fs::file_size(tmp / "one.txt.gz"))) + " compressed), 1 document, ";
  EXPECT_NE(r.err.find(want), std::string::npos) << want << "\n" << r.err;
  // Uncompressed inputs: one size, the text's.
  write_file(tmp / "plain.txt", text);
  const CliResult plain = run_cli(prepare_cli(quote(tmp / "plain.txt"), tmp / "out2"));
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.err.find("prepare: done: " + format_bytes(double(text.size())) + ", 1 document, "), std::string::npos)
      << plain.err;
}

// Issue #47: JSONL whose text is under another field than "text" (--text-field NAME); a record
// without it is named by file and line.
TEST(DataPrepareCli, TheTextFieldCanBeNamed) {
  TempDir tmp;
  std::string jsonl;
  for (int i = 0; i < 40; ++i) {
    const std::string text = "document " + std::to_string(i) + " says something about depth";
    jsonl += "{\"id\": " + std::to_string(i) + ", \"content\": \"" + text + "\", \"text\": \"not this\"}\n";
  }
  write_file(tmp / "c.jsonl", jsonl);
  const CliResult r = run_cli(prepare_cli(quote(tmp / "c.jsonl"), tmp / "out", "--text-field content"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const TokenDataset train = TokenDataset::open(tmp / "out", "train");
  Ids ids(static_cast<std::size_t>(train.num_tokens()));
  train.copy_tokens(0, ids);
  std::string decoded;
  for (std::int32_t id : ids) decoded += id == 256 ? '|' : static_cast<char>(id);
  EXPECT_NE(decoded.find("says something about depth"), std::string::npos) << decoded;
  EXPECT_EQ(decoded.find("not this"), std::string::npos) << decoded;
  EXPECT_EQ(read_manifest(tmp / "out")["sources"][0]["text_field"], "content");
  write_file(tmp / "partial.jsonl", "{\"content\": \"one\"}\n{\"text\": \"two\"}\n");
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "partial.jsonl"), tmp / "o2", "--text-field content")),
                   (tmp / "partial.jsonl") + ":2: missing \"content\" field");
  // A field no record has: the first record is named.
  expect_cli_error(run_cli(prepare_cli(quote(tmp / "c.jsonl"), tmp / "o3", "--text-field body")),
                   (tmp / "c.jsonl") + ":1: missing \"body\" field");
}

TEST(DataPrepareCli, TrainsSentencePieceWhenNoTokenizerGiven) {
  TempDir tmp;
  std::string jsonl;
  for (int i = 0; i < 300; ++i)
    jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": \"line " + std::to_string(i) +
             " about residual streams\\nand depth attention in transformers " + std::to_string(i * 7) + "\"}\n";
  write_file(tmp / "c.jsonl", jsonl);
  const CliResult r = run_cli("prepare --quiet --vocab-size 320 --input " + quote(tmp / "c.jsonl") + " --out " + quote(tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // --quiet leaves only warnings (this corpus' validation split is shorter than a window).
  std::istringstream lines(r.err);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("prepare: warning: ", 0), 0u) << line;
  const TokenDataset data = TokenDataset::open(tmp / "out", "train");
  EXPECT_EQ(data.tokenizer_spec(), "sp:" + (tmp / "out/tokenizer.model"));
  EXPECT_EQ(data.vocab_size(), 320);
  const auto tok = open_dataset_tokenizer(data);
  Ids first(8);
  data.copy_tokens(0, first);
  EXPECT_EQ(first[0], tok->eot_id());
  EXPECT_TRUE(tok->decode(std::span(first).subspan(1)).starts_with("line 0 about")) << tok->decode(first);
}

TEST(DataPrepareCli, Gpt2OnASharedCorpusFile) {
  ATTNRES_REQUIRE_GPT2();
  ATTNRES_REQUIRE_CORPUS();
  TempDir tmp;
  const std::string input = shared_data() + "/corpus/fineweb-sample/fineweb_005.jsonl";
  const CliResult r = run_cli("prepare --quiet --input " + quote(input) + " --tokenizer " + quote("gpt2:" + gpt2_dir()) +
                              " --out " + quote(tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto tok = make_tokenizer("gpt2:" + gpt2_dir());
  std::uint64_t expected = 0, docs = 0;
  std::istringstream lines(read_file(input));
  for (std::string line; std::getline(lines, line);) {
    if (line.empty()) continue;
    expected += 1 + tok->encode(nlohmann::json::parse(line)["text"].get<std::string>()).size();
    ++docs;
  }
  const nlohmann::json m = read_manifest(tmp / "out");
  std::uint64_t tokens = 0, documents = 0;
  for (const char* split : {"train", "val", "test"}) {
    tokens += m["splits"][split]["tokens"].get<std::uint64_t>();
    documents += m["splits"][split]["documents"].get<std::uint64_t>();
  }
  EXPECT_EQ(tokens, expected);
  EXPECT_EQ(documents, docs);
  DatasetOpenOptions with_tokenizer;
  with_tokenizer.tokenizer = tok.get();
  EXPECT_EQ(TokenDataset::open(tmp / "out", "train", with_tokenizer).eot_id(), 50256);
}

TEST(DataPrepareCli, DefaultCorpusWithBytesTokenizer) {
  bool present = false;
  for (const auto& e : fs::directory_iterator("/usr/share/doc"))
    if (e.path().filename().string().starts_with("python3") && fs::is_directory(e.path() / "html/_sources")) present = true;
  if (!present) GTEST_SKIP() << "python3-doc is not installed";
  TempDir tmp;
  const CliResult r = run_cli("prepare --tokenizer bytes --out " + quote(tmp / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("using the Python documentation sources"), std::string::npos) << r.err;
  const nlohmann::json m = read_manifest(tmp / "out");
  EXPECT_GT(m["sources"].size(), 100u);
  EXPECT_GT(m["splits"]["train"]["tokens"].get<std::uint64_t>(), 5'000'000u);
}

}  // namespace
}  // namespace attnres::data
