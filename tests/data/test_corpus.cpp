// Corpus inputs: file discovery, readers (JSONL, text, gzip), record parsing and the split rule.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "data/corpus.hpp"
#include "data/hash.hpp"
#include "data_test_util.hpp"
#include "util/error.hpp"

namespace attnres::data {
namespace {

using namespace testing;

// Runs `fn` and checks it throws attnres::Error whose message contains `needle`.
template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

std::vector<std::string> names(const std::vector<InputFile>& files, const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& f : files) out.push_back(fs::relative(f.path, root).string());
  return out;
}

// All records of the inputs, as (file name, line, data).
std::vector<std::tuple<std::string, std::uint64_t, std::string>> read_all(const std::vector<InputFile>& inputs,
                                                                         std::size_t batch_bytes = 1 << 20) {
  CorpusReader reader(inputs);
  std::vector<RawRecord> batch;
  std::vector<std::tuple<std::string, std::uint64_t, std::string>> out;
  while (reader.next_batch(batch, batch_bytes))
    for (auto& r : batch) out.emplace_back(fs::path(inputs[r.source].path).filename().string(), r.line, r.data);
  return out;
}

TEST(DataExpandInputs, DirectoriesAreRecursiveSortedAndSkipHidden) {
  TempDir tmp;
  write_file(tmp / "d/b.jsonl", "{}\n");
  write_file(tmp / "d/a/z.txt", "x");
  write_file(tmp / "d/a/y.txt.gz", "");
  write_file(tmp / "d/c.jsonl.gz", "");
  write_file(tmp / "d/notes.md", "ignored");
  write_file(tmp / "d/.hidden.jsonl", "{}\n");
  write_file(tmp / "d/.git/x.jsonl", "{}\n");
  const std::string paths[] = {tmp / "d", tmp / "d/b.jsonl"};  // b.jsonl twice: read once
  const auto files = expand_inputs(paths);
  EXPECT_EQ(names(files, tmp.path()), (std::vector<std::string>{"d/a/y.txt.gz", "d/a/z.txt", "d/b.jsonl", "d/c.jsonl.gz"}));
  EXPECT_EQ(files[0].format, InputFormat::kText);
  EXPECT_TRUE(files[0].gzip);
  EXPECT_EQ(files[2].format, InputFormat::kJsonl);
  EXPECT_FALSE(files[2].gzip);
}

TEST(DataExpandInputs, Errors) {
  TempDir tmp;
  write_file(tmp / "notes.md", "x");
  fs::create_directories(tmp / "empty");
  const std::string missing[] = {tmp / "missing.jsonl"};
  expect_error([&] { expand_inputs(missing); }, "input '" + (tmp / "missing.jsonl") + "' does not exist");
  const std::string unsupported[] = {tmp / "notes.md"};
  expect_error([&] { expand_inputs(unsupported); }, "unsupported input '" + (tmp / "notes.md") + "'");
  const std::string empty[] = {tmp / "empty"};
  expect_error([&] { expand_inputs(empty); }, "no .jsonl, .jsonl.gz, .txt or .txt.gz files under '" + (tmp / "empty") + "'");
}

TEST(DataCorpusReader, JsonlTextAndGzip) {
  TempDir tmp;
  write_file(tmp / "a.jsonl", "{\"text\": \"one\"}\r\n\n  \n{\"text\": \"two\"}\n{\"text\": \"three\"}");
  write_gzip(tmp / "b.jsonl.gz", "{\"text\": \"four\"}\n");
  write_gzip(tmp / "b.jsonl.gz", "{\"text\": \"five\"}\n", /*append=*/true);  // a second gzip member
  write_file(tmp / "c.txt", "six\nlines\n");
  write_gzip(tmp / "d.txt.gz", "seven");
  const std::string paths[] = {tmp / "a.jsonl", tmp / "b.jsonl.gz", tmp / "c.txt", tmp / "d.txt.gz"};
  const auto inputs = expand_inputs(paths);
  for (std::size_t batch_bytes : {std::size_t{1}, std::size_t{1} << 20}) {
    const auto records = read_all(inputs, batch_bytes);
    using R = std::tuple<std::string, std::uint64_t, std::string>;
    EXPECT_EQ(records, (std::vector<R>{{"a.jsonl", 1, "{\"text\": \"one\"}"},
                                       {"a.jsonl", 4, "{\"text\": \"two\"}"},
                                       {"a.jsonl", 5, "{\"text\": \"three\"}"},
                                       {"b.jsonl.gz", 1, "{\"text\": \"four\"}"},
                                       {"b.jsonl.gz", 2, "{\"text\": \"five\"}"},
                                       {"c.txt", 1, "six\nlines\n"},
                                       {"d.txt.gz", 1, "seven"}}));
  }
  CorpusReader reader(inputs);
  std::vector<RawRecord> batch;
  while (reader.next_batch(batch, 1 << 20)) {
  }
  EXPECT_EQ(reader.stats()[0].hash, hash64(read_file(tmp / "a.jsonl")));
  EXPECT_EQ(reader.stats()[1].bytes, fs::file_size(tmp / "b.jsonl.gz"));
  EXPECT_EQ(reader.stats()[0].records, 3u);
}

TEST(DataCorpusReader, LargeJsonlAcrossReadBlocks) {
  TempDir tmp;
  std::string jsonl, gz;
  for (int i = 0; i < 3000; ++i) jsonl += "{\"id\": " + std::to_string(i) + ", \"text\": \"" + std::string(1000, 'x') + "\"}\n";
  write_file(tmp / "big.jsonl", jsonl);
  write_gzip(tmp / "big2.jsonl.gz", jsonl);
  for (const char* name : {"big.jsonl", "big2.jsonl.gz"}) {
    const std::string paths[] = {tmp / name};
    const auto records = read_all(expand_inputs(paths), 100000);
    ASSERT_EQ(records.size(), 3000u);
    EXPECT_EQ(std::get<1>(records[2999]), 3000u);
    EXPECT_EQ(std::get<2>(records[1234]).size(), std::string("{\"id\": 1234, \"text\": \"\"}").size() + 1000);
  }
}

TEST(DataCorpusReader, Errors) {
  TempDir tmp;
  write_file(tmp / "empty.jsonl", "");
  write_file(tmp / "blank.jsonl", "\n\n  \n");
  write_file(tmp / "empty.txt", "");
  write_file(tmp / "corrupt.jsonl.gz", "this is not gzip data at all");
  write_gzip(tmp / "full.jsonl.gz", std::string(5000, 'a') + "\n");
  const std::string gz = read_file(tmp / "full.jsonl.gz");
  write_file(tmp / "truncated.jsonl.gz", gz.substr(0, gz.size() / 2));
  for (const char* name : {"empty.jsonl", "blank.jsonl", "empty.txt"}) {
    const std::string paths[] = {tmp / name};
    expect_error([&] { read_all(expand_inputs(paths)); }, (tmp / name) + ": empty input");
  }
  const std::string corrupt[] = {tmp / "corrupt.jsonl.gz"};
  expect_error([&] { read_all(expand_inputs(corrupt)); }, (tmp / "corrupt.jsonl.gz") + ": corrupt gzip data");
  const std::string truncated[] = {tmp / "truncated.jsonl.gz"};
  expect_error([&] { read_all(expand_inputs(truncated)); }, (tmp / "truncated.jsonl.gz") + ": truncated gzip data");
  // A file that cannot be opened when its turn comes (here: gone since the inputs were listed).
  write_file(tmp / "vanishing.jsonl", "{\"text\": \"x\"}\n");
  const std::string vanishing[] = {tmp / "vanishing.jsonl"};
  const auto listed = expand_inputs(vanishing);
  fs::remove(tmp / "vanishing.jsonl");
  expect_error([&] { read_all(listed); }, "cannot read '" + (tmp / "vanishing.jsonl") + "': No such file or directory");
  if (::geteuid() != 0) {  // root reads anything: the permission check cannot fail there
    write_file(tmp / "locked.jsonl", "{\"text\": \"x\"}\n");
    fs::permissions(tmp / "locked.jsonl", fs::perms::none);
    const std::string locked[] = {tmp / "locked.jsonl"};
    expect_error([&] { read_all(expand_inputs(locked)); }, "cannot read '" + (tmp / "locked.jsonl") + "'");
  }
}

Document parse(const std::string& data, InputFormat format = InputFormat::kJsonl, std::uint64_t line = 7) {
  RawRecord r{0, line, data};
  InputFile input{"/data/in.jsonl", format, false};
  return parse_record(r, input, SplitFractions{});
}

TEST(DataParseRecord, Documents) {
  const Document d = parse("{\"text\": \"caf\\u00e9\\n\", \"id\": \"x1\", \"url\": null}");
  EXPECT_EQ(d.text, "caf\xC3\xA9\n");
  EXPECT_FALSE(d.empty);
  const auto whole = [](const Document& doc, Split split) {
    return doc.segments == std::vector<Segment>{Segment{split, 0, doc.text.size()}};
  };
  EXPECT_TRUE(whole(d, assign_split("x1", SplitFractions{})));
  EXPECT_TRUE(whole(parse("{\"text\": \"a\", \"id\": 12}"), assign_split("12", SplitFractions{})));
  EXPECT_TRUE(whole(parse("{\"text\": \"body\"}"), assign_split("body", SplitFractions{})));
  EXPECT_TRUE(parse("{\"text\": \"  \\n\\t\"}").empty);
  EXPECT_TRUE(parse("{\"text\": \"\"}").empty);
  EXPECT_EQ(parse("plain text\n", InputFormat::kText, 1).text, "plain text\n");
}

// Issue #47: a byte order mark opening a text file, a JSONL file or a JSONL document's text is not
// part of the document (it was tokenized as three byte tokens); one inside the text stays.
TEST(DataParseRecord, ALeadingByteOrderMarkIsNotText) {
  const std::string bom = "\xEF\xBB\xBF";
  EXPECT_EQ(parse(bom + "plain text\n", InputFormat::kText, 1).text, "plain text\n");
  EXPECT_EQ(parse(bom + "{\"text\": \"first\"}").text, "first");
  EXPECT_EQ(parse("{\"text\": \"\\ufeffsecond\"}").text, "second");
  EXPECT_EQ(parse("{\"text\": \"a" + bom + "b\"}").text, "a" + bom + "b");
  EXPECT_TRUE(parse(bom, InputFormat::kText, 1).empty);
  EXPECT_EQ(parse(bom + "body", InputFormat::kText, 1).segments, parse("body", InputFormat::kText, 1).segments);
}

TEST(DataParseRecord, Errors) {
  expect_error([] { parse("{\"text\": \"x\""); }, "/data/in.jsonl:7: malformed JSON");
  expect_error([] { parse("[1, 2]"); }, "/data/in.jsonl:7: expected a JSON object, got array");
  expect_error([] { parse("{\"body\": \"x\"}"); }, "/data/in.jsonl:7: missing \"text\" field");
  expect_error([] { parse("{\"text\": 5}"); }, "/data/in.jsonl:7: field \"text\" is a number, not a string");
  expect_error([] { parse("{\"text\": \"bad \xC3\x28\"}"); }, "/data/in.jsonl:7: invalid UTF-8 (byte 15 of the line)");
  expect_error([] { parse("line one\nline two \xFF\n", InputFormat::kText, 1); }, "/data/in.jsonl:2: invalid UTF-8");
}

TEST(DataSplit, LongDocumentsAreCutIntoPiecesOfEverySplit) {
  // Lines of 50 bytes and one long run without spaces or newlines (cut inside it, on a whole
  // UTF-8 character), then more lines: just over kLongDocumentBytes.
  std::string text;
  while (text.size() < kLongDocumentBytes / 2) text += "the depth attention of the residual stream routes.\n";
  for (int i = 0; i < 3000; ++i) text += "\xC3\xA9";
  while (text.size() <= kLongDocumentBytes) text += "the depth attention of the residual stream routes.\n";
  const SplitFractions f{};  // 1% each
  const std::vector<Segment> segments = split_document(text, "one.txt", f);
  EXPECT_EQ(segments, split_document(text, "one.txt", f));  // deterministic
  std::size_t at = 0, bytes[kNumSplits] = {};
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    EXPECT_EQ(s.begin, at) << i;  // contiguous, in text order, covering the text
    EXPECT_GT(s.end, s.begin) << i;
    if (i > 0) {
      EXPECT_NE(s.split, segments[i - 1].split) << i;  // runs of one split are merged
    }
    if (s.end < text.size()) {
      EXPECT_NE(static_cast<unsigned char>(text[s.end]) & 0xC0, 0x80) << "inside a character";
    }
    if (s.split != Split::kTrain) {
      EXPECT_LE(s.end - s.begin, 2 * kPieceBytes) << i;  // one or two pieces
    }
    bytes[static_cast<int>(s.split)] += s.end - s.begin;
    at = s.end;
  }
  EXPECT_EQ(at, text.size());
  // round(0.01 * 65 pieces) = 1 piece each for val and test.
  EXPECT_GT(bytes[1], 0u);
  EXPECT_GT(bytes[2], 0u);
  EXPECT_GT(bytes[0], text.size() * 9 / 10);
  // No fractions: all train, as one segment. A document at the threshold is not cut.
  EXPECT_EQ(split_document(text, "k", SplitFractions{0, 0}), (std::vector<Segment>{{Split::kTrain, 0, text.size()}}));
  const std::string at_threshold = text.substr(0, kLongDocumentBytes);
  EXPECT_EQ(split_document(at_threshold, "k", f).size(), 1u);
  EXPECT_EQ(split_document(at_threshold, "k", f).front().split, assign_split("k", f));
}

TEST(DataSplit, DeterministicFractionsAndNesting) {
  const SplitFractions f{0.1, 0.05};
  std::map<Split, int> counts;
  for (int i = 0; i < 100000; ++i) {
    const std::string key = "doc" + std::to_string(i);
    const Split s = assign_split(key, f);
    EXPECT_EQ(s, assign_split(key, f));
    ++counts[s];
    // Test membership depends only on the test fraction; val grows without moving test documents.
    if (s == Split::kTest) {
      EXPECT_EQ(assign_split(key, SplitFractions{0.3, 0.05}), Split::kTest);
    }
    if (s == Split::kVal) {
      EXPECT_NE(assign_split(key, SplitFractions{0.2, 0.05}), Split::kTrain);
    }
  }
  EXPECT_NEAR(counts[Split::kVal], 10000, 400);
  EXPECT_NEAR(counts[Split::kTest], 5000, 300);
  EXPECT_EQ(assign_split("anything", SplitFractions{0, 0}), Split::kTrain);
  EXPECT_THROW((SplitFractions{-0.1, 0}).validate(), Error);
  EXPECT_THROW((SplitFractions{0.6, 0.5}).validate(), Error);
  EXPECT_THROW((SplitFractions{0, 1.0}).validate(), Error);
  EXPECT_NO_THROW((SplitFractions{}).validate());
}

TEST(DataDefaultCorpus, FindsPythonDocsOnce) {
  bool present = false;
  for (const auto& e : fs::directory_iterator("/usr/share/doc"))
    if (e.path().filename().string().starts_with("python3") && fs::is_directory(e.path() / "html/_sources")) present = true;
  if (!present) GTEST_SKIP() << "python3-doc is not installed";
  const auto files = default_corpus();
  EXPECT_GT(files.size(), 100u);
  std::set<std::string> seen;
  for (const auto& f : files) {
    EXPECT_TRUE(f.path.ends_with(".rst.txt")) << f.path;
    EXPECT_TRUE(seen.insert(fs::canonical(f.path).string()).second) << "twice: " << f.path;
  }
}

}  // namespace
}  // namespace attnres::data
