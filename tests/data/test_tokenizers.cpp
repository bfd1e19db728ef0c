// Tokenizers: bytes, GPT-2 BPE (against reference ids), SentencePiece training and use.
#include <gtest/gtest.h>
#include <omp.h>

#include <random>

#include "data/corpus.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/hash.hpp"
#include "data/sp_tokenizer.hpp"
#include "data/tokenizer.hpp"
#include "data/tokenizer_train.hpp"
#include "data/unicode.hpp"
#include "data_test_util.hpp"
#include "util/error.hpp"
#include "util/rng.hpp"

namespace attnres::data {
namespace {

using namespace testing;
using Ids = std::vector<std::int32_t>;

TEST(DataUnicode, Classes) {
  EXPECT_EQ(char_class(U'a'), CharClass::kLetter);
  EXPECT_EQ(char_class(U'Z'), CharClass::kLetter);
  EXPECT_EQ(char_class(U'中'), CharClass::kLetter);
  EXPECT_EQ(char_class(U'ǅ'), CharClass::kLetter);  // Lt
  EXPECT_EQ(char_class(U'7'), CharClass::kNumber);
  EXPECT_EQ(char_class(U'①'), CharClass::kNumber);  // No
  EXPECT_EQ(char_class(U'Ⅻ'), CharClass::kNumber);  // Nl
  EXPECT_EQ(char_class(U' '), CharClass::kSpace);
  EXPECT_EQ(char_class(U'\n'), CharClass::kSpace);
  EXPECT_EQ(char_class(0x3000), CharClass::kSpace);
  EXPECT_EQ(char_class(0x85), CharClass::kSpace);
  EXPECT_EQ(char_class(0x1C), CharClass::kOther);  // isspace() in Python's re, but not White_Space
  EXPECT_EQ(char_class(0x200B), CharClass::kOther);  // zero-width space is not White_Space
  EXPECT_EQ(char_class(U'!'), CharClass::kOther);
  EXPECT_EQ(char_class(0x1F600), CharClass::kOther);
  EXPECT_EQ(char_class(0x10FFFF), CharClass::kOther);
}

TEST(DataUnicode, Utf8Validation) {
  EXPECT_EQ(find_invalid_utf8(""), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("plain ascii text that is long enough"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("h\xC3\xA9 \xE4\xB8\xAD \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xC0\xAF"), 2u);             // overlong '/'
  EXPECT_EQ(find_invalid_utf8("abcdefgh\xED\xA0\x80"), 8u);   // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);       // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xE4\xB8"), 2u);             // truncated
  EXPECT_EQ(find_invalid_utf8("x\x80"), 1u);                  // lone continuation byte
  EXPECT_EQ(find_invalid_utf8("\xFF"), 0u);
  EXPECT_EQ(line_of_offset("a\nb\nc", 4), 3u);
}

TEST(DataHash, PinnedValuesAndStreaming) {
  // Pinned: manifests and shard headers depend on this exact function (docs/data.md).
  EXPECT_EQ(hex64(hash64("")), "b3ad7693273db7bd");
  EXPECT_EQ(hex64(hash64("attnres")), "feed334cd86b5d67");
  EXPECT_EQ(hex64(hash64(std::string(100, 'a'))), "4973df4185bf8df9");
  EXPECT_NE(hash64(std::string("ab")), hash64(std::string("ab\0", 3)));
  std::mt19937 gen(1);
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(gen());
  for (std::size_t cut1 : {0u, 1u, 31u, 32u, 33u, 500u}) {
    for (std::size_t cut2 : {0u, 7u, 64u}) {
      Hasher64 h;
      const std::size_t b = std::min(cut1 + cut2, data.size());
      h.update(std::string_view(data).substr(0, cut1));
      h.update(std::string_view(data).substr(cut1, b - cut1));
      h.update(std::string_view(data).substr(b));
      EXPECT_EQ(h.digest(), hash64(data));
    }
  }
}

TEST(DataBytesTokenizer, EncodesUtf8Bytes) {
  const auto tok = make_tokenizer("bytes");
  EXPECT_EQ(tok->vocab_size(), 257);
  EXPECT_EQ(tok->eot_id(), 256);
  EXPECT_EQ(tok->spec(), "bytes");
  EXPECT_EQ(tok->encode("h\xC3\xA9"), (Ids{104, 0xC3, 0xA9}));
  const Ids ids{104, 105, 256, 0xC3, 0xA9};
  EXPECT_EQ(tok->decode(ids), "hi<|endoftext|>\xC3\xA9");
  EXPECT_EQ(tok->content_hash(), make_tokenizer("bytes")->content_hash());
  const Ids bad{257};
  EXPECT_THROW(tok->decode(bad), Error);
}

TEST(DataMakeTokenizer, BadSpecs) {
  try {
    make_tokenizer("wordpiece:/x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown tokenizer spec 'wordpiece:/x'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tokenizer("gpt2:"), Error);
  EXPECT_THROW(make_tokenizer("gpt2:/nonexistent/attnres/dir"), Error);
  EXPECT_THROW(make_tokenizer("sp:/nonexistent/attnres.model"), Error);
  TempDir tmp;
  write_file(tmp / "junk.model", "not a model");
  EXPECT_THROW(make_tokenizer("sp:" + (tmp / "junk.model")), Error);
  write_file(tmp / "g/encoder.json", "{\"a\": 0,");
  write_file(tmp / "g/vocab.bpe", "#version: 0.2\n");
  try {
    make_tokenizer("gpt2:" + (tmp / "g"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.json: malformed JSON"), std::string::npos) << e.what();
  }
}

std::vector<std::string> split_gpt2(std::string_view text) {
  std::vector<std::string_view> pieces;
  gpt2_pretokenize(text, pieces);
  return {pieces.begin(), pieces.end()};
}

// Expected pieces and ids below come from the reference (Python `regex` + GPT-2's encoder.py algorithm).
TEST(DataGpt2, PreTokenizerMatchesPattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_gpt2("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split_gpt2("I'm  here\n\nok "), (V{"I", "'m", " ", " here", "\n", "\n", "ok", " "}));
  EXPECT_EQ(split_gpt2("They'll've 'S  \t x"), (V{"They", "'ll", "'ve", " '", "S", "  \t", " x"}));
  EXPECT_EQ(split_gpt2("  123abc\u2460\u00bd \u4e2d\u6587!!?\u3000\u3000end"),
            (V{" ", " 123", "abc", "\u2460\u00bd", " \u4e2d\u6587", "!!?", "\u3000", "\u3000", "end"}));
  EXPECT_EQ(split_gpt2("a\u00a0b\u2028c   "), (V{"a", "\u00a0", "b", "\u2028", "c", "   "}));
  EXPECT_EQ(split_gpt2("\x1cX\x1cY"), (V{"\x1c", "X", "\x1c", "Y"}));
  EXPECT_EQ(split_gpt2(""), V{});
  // Ill-formed bytes are "other" characters; nothing is lost.
  EXPECT_EQ(split_gpt2("a\xFF\xFEz"), (V{"a", "\xFF\xFE", "z"}));
}

TEST(DataGpt2, MatchesReferenceIds) {
  ATTNRES_REQUIRE_GPT2();
  const auto tok = make_tokenizer("gpt2:" + gpt2_dir());
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eot_id(), 50256);
  EXPECT_EQ(tok->encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok->encode("I'm  here\n\nok "), (Ids{40, 1101, 220, 994, 198, 198, 482, 220}));
  EXPECT_EQ(tok->encode("They'll've 'S  \t x"), (Ids{2990, 1183, 1053, 705, 50, 220, 220, 197, 2124}));
  EXPECT_EQ(tok->encode("  123abc\u2460\u00bd \u4e2d\u6587!!?\u3000\u3000end"),
            (Ids{220, 17031, 39305, 158, 239, 254, 23141, 220, 40792, 23877, 229, 3228, 30, 5099, 222, 5099, 222, 437}));
  EXPECT_EQ(tok->encode("a\u00a0b\u2028c   "), (Ids{64, 1849, 65, 447, 101, 66, 220, 220, 220}));
  EXPECT_EQ(tok->encode("don't stop\u2014\u00fcn\u00efc\u00f6d\u00e9 \U0001F600\U0001F44D\U0001F3FD"),
            (Ids{9099, 470, 2245, 960, 9116, 77, 26884, 66, 9101, 67, 2634, 30325, 222, 41840, 235, 8582, 237, 121}));
  // The literal end-of-text string in a document is ordinary text.
  EXPECT_EQ(tok->encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  const Ids eot{50256};
  EXPECT_EQ(tok->decode(eot), "<|endoftext|>");
}

TEST(DataGpt2, TinyShakespeareCountAndRoundTrip) {
  ATTNRES_REQUIRE_GPT2();
  const std::string path = shared_data() + "/smoke/tinyshakespeare.txt";
  if (!fs::exists(path)) GTEST_SKIP() << "shared data absent: " << path;
  const auto tok = make_tokenizer("gpt2:" + gpt2_dir());
  const std::string text = read_file(path);
  const Ids ids = tok->encode(text);
  EXPECT_EQ(ids.size(), 338025u);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST(DataGpt2, HeapAndReferenceBpeAgree) {
  ATTNRES_REQUIRE_GPT2();
  const Gpt2Tokenizer tok(gpt2_dir(), "gpt2:test");
  Rng rng(42);
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n = 2 + rng.below(300);
    std::string word = trial % 3 == 0 ? " " : "";
    for (std::size_t i = 0; i < n; ++i) {
      word.push_back(trial % 4 == 3 ? static_cast<char>(rng.below(256)) : letters[rng.below(trial % 2 ? 26 : 6)]);
    }
    Ids a, b;
    tok.bpe_reference(word, a);
    tok.bpe_heap(word, b);
    ASSERT_EQ(a, b) << "piece of " << word.size() << " bytes";
    EXPECT_EQ(tok.decode(a), word);
  }
}

TEST(DataGpt2, ConcurrentEncodingIsConsistent) {
  ATTNRES_REQUIRE_GPT2();
  const auto tok = make_tokenizer("gpt2:" + gpt2_dir());
  std::vector<std::string> texts;
  Rng rng(3);
  for (int i = 0; i < 64; ++i) {
    std::string t;
    for (int w = 0; w < 400; ++w) t += " word" + std::to_string(rng.below(500)) + (w % 7 ? "" : ",\n");
    texts.push_back(t);
  }
  const auto fresh = make_tokenizer("gpt2:" + gpt2_dir());  // its own cache
  std::vector<Ids> serial;
  for (const auto& t : texts) serial.push_back(fresh->encode(t));
  std::vector<Ids> parallel(texts.size());
#pragma omp parallel for num_threads(2) schedule(dynamic, 1)
  for (int i = 0; i < static_cast<int>(texts.size()); ++i) parallel[static_cast<std::size_t>(i)] = tok->encode(texts[static_cast<std::size_t>(i)]);
  EXPECT_EQ(serial, parallel);
}

// A small JSONL corpus; documents whose id falls in the validation split hold a marker word.
std::string write_sp_corpus(const TempDir& tmp, const std::string& marker, int* val_docs) {
  std::string jsonl;
  const SplitFractions fractions{0.2, 0.0};
  *val_docs = 0;
  Rng rng(11);
  const char* words[] = {"the", "model", "reads", "tokens", "from", "shards", "and", "learns", "depth", "attention",
                         "residual", "stream", "layers", "of", "a", "transformer", "with", "données", "über", "naïve"};
  for (int d = 0; d < 200; ++d) {
    const std::string id = "doc-" + std::to_string(d);
    const bool val = assign_split(id, fractions) == Split::kVal;
    std::string text;
    for (int line = 0; line < 6; ++line) {
      for (int w = 0; w < 12; ++w) text += std::string(w ? " " : "") + words[rng.below(20)];
      if (val) text += " " + marker + " " + marker;
      text += "\\n";
    }
    *val_docs += val;
    jsonl += "{\"id\": \"" + id + "\", \"text\": \"" + text + "\"}\n";
  }
  const std::string path = tmp / "corpus.jsonl";
  write_file(path, jsonl);
  return path;
}

TEST(DataSentencePiece, TrainsDeterministicallyOnTrainSplitOnly) {
  TempDir tmp;
  const std::string marker = "qzvxqzvxqzvx";
  int val_docs = 0;
  const std::string corpus_path = write_sp_corpus(tmp, marker, &val_docs);
  ASSERT_GT(val_docs, 10);
  const std::string paths[] = {corpus_path};
  SpTrainOptions options;
  options.vocab_size = 400;
  options.fractions = SplitFractions{0.2, 0.0};
  options.progress = false;
  const SpTrainSummary summary = train_sp_tokenizer(expand_inputs(paths), tmp / "a.model", options);
  EXPECT_EQ(summary.documents, 200u - static_cast<unsigned>(val_docs));
  const int saved = omp_get_max_threads();
  omp_set_num_threads(saved == 1 ? 2 : 1);  // the model bytes must not depend on the thread count
  train_sp_tokenizer(expand_inputs(paths), tmp / "b.model", options);
  omp_set_num_threads(saved);
  EXPECT_EQ(read_file(tmp / "a.model"), read_file(tmp / "b.model"));

  const auto tok = make_tokenizer("sp:" + (tmp / "a.model"));
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(tok->decode(Ids{tok->eot_id()}), "<|endoftext|>");
  // Had validation text been used, the marker (frequent there) would be a few pieces at most.
  EXPECT_GE(tok->encode(marker).size(), 6u);
  // Lossless on text (including bytes outside the vocabulary), and end-of-text is not special.
  const std::string text = "the  model\n\tlearns 12345 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80 <|endoftext|>  ";
  const Ids ids = tok->encode(text);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok->eot_id()), 0);
  EXPECT_NE(tok->content_hash(), make_tokenizer("bytes")->content_hash());
}

TEST(DataSentencePiece, ChunkedEncodingMatchesWholeText) {
  TempDir tmp;
  int val_docs = 0;
  const std::string paths[] = {write_sp_corpus(tmp, "marker", &val_docs)};
  SpTrainOptions options;
  options.vocab_size = 500;
  options.progress = false;
  train_sp_tokenizer(expand_inputs(paths), tmp / "m.model", options);
  const SpTokenizer tok(tmp / "m.model", "sp:m");
  ASSERT_TRUE(tok.chunks_lines());
  ASSERT_TRUE(tok.chunks_words());
  std::vector<std::string> texts = {
      "the model  reads\n\n   tokens\r\nfrom shards ",
      "   leading and trailing   ",
      "\xE2\x96\x81 literal\xE2\x96\x81\xE2\x96\x81 space marks \xE2\x96\x81\xE2\x96\x81  x",
      "\t tabs\t\tand \xC3\xBC\xC3\xA9 d\xC3\xB6nn\xC3\xA9" "es \xE4\xB8\xAD\xE6\x96\x87 12345 \n"};
  Rng rng(5);
  const char* parts[] = {" ", "  ", "\n", "the", "model", "s", "\xE2\x96\x81", "\t", "\xC3\xA9", "7", "reads", "."};
  for (int t = 0; t < 200; ++t) {
    std::string s;
    for (int k = 0; k < 30; ++k) s += parts[rng.below(12)];
    texts.push_back(s);
  }
  const std::string shakespeare = shared_data() + "/smoke/tinyshakespeare.txt";
  if (fs::exists(shakespeare)) texts.push_back(read_file(shakespeare).substr(0, 200000));
  for (const std::string& text : texts) {
    Ids whole;
    tok.encode_whole(text, whole);
    ASSERT_EQ(tok.encode(text), whole) << text.substr(0, 200);
  }
}

TEST(DataSentencePiece, TrainErrors) {
  TempDir tmp;
  write_file(tmp / "c.jsonl", "{\"text\": \"only a little text\"}\n");
  const std::string paths[] = {tmp / "c.jsonl"};
  SpTrainOptions options;
  options.progress = false;
  options.vocab_size = 100;
  EXPECT_THROW(train_sp_tokenizer(expand_inputs(paths), tmp / "m.model", options), Error);
  options.vocab_size = 5000;  // far more pieces than the text allows
  EXPECT_THROW(train_sp_tokenizer(expand_inputs(paths), tmp / "m.model", options), Error);
  EXPECT_FALSE(fs::exists(tmp / "m.model"));
}

TEST(DataTokenizerCli, EncodeCountAndIds) {
  ATTNRES_REQUIRE_GPT2();
  TempDir tmp;
  write_file(tmp / "hello.txt", "Hello world");
  const std::string spec = quote("gpt2:" + gpt2_dir());
  CliResult r = run_cli("tokenizer encode --tokenizer " + spec + " " + quote(tmp / "hello.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 995\n");
  const std::string shakespeare = shared_data() + "/smoke/tinyshakespeare.txt";
  r = run_cli("tokenizer encode --count --tokenizer " + spec + " " + quote(shakespeare) + " " + quote(tmp / "hello.txt"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "338025\n2\n");
}

TEST(DataTokenizerCli, Errors) {
  TempDir tmp;
  write_file(tmp / "bad.txt", "fine\nstill fine\nbad \xC3\x28 here\n");
  CliResult r = run_cli("tokenizer encode --tokenizer bytes " + quote(tmp / "bad.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("attnres: error: " + (tmp / "bad.txt") + ":3: invalid UTF-8"), std::string::npos) << r.err;
  r = run_cli("tokenizer encode --tokenizer nope " + quote(tmp / "bad.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown tokenizer spec 'nope'"), std::string::npos) << r.err;
  r = run_cli("tokenizer encode --tokenizer bytes " + quote(tmp / "missing.txt"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.txt"), std::string::npos) << r.err;
}

TEST(DataTokenizerCli, TrainWritesUsableModel) {
  TempDir tmp;
  int val_docs = 0;
  const std::string corpus = write_sp_corpus(tmp, "marker", &val_docs);
  const CliResult r = run_cli("tokenizer train --quiet --vocab-size 320 --input " + quote(corpus) + " --out " +
                              quote(tmp / "t.model"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto tok = make_tokenizer("sp:" + (tmp / "t.model"));
  EXPECT_EQ(tok->vocab_size(), 320);
  const CliResult info = run_cli("tokenizer info --tokenizer " + quote("sp:" + (tmp / "t.model")));
  EXPECT_NE(info.out.find("hash: " + tok->content_hash()), std::string::npos) << info.out;
}

}  // namespace
}  // namespace attnres::data
