#include "data/corpus.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "data/hash.hpp"
#include "data/unicode.hpp"
#include "util/error.hpp"
#include "util/json.hpp"

namespace attnres::data {
namespace fs = std::filesystem;
namespace {

constexpr std::size_t kReadBlock = 1 << 20;

bool classify(const std::string& name, InputFile& file) {
  std::string_view base = name;
  file.gzip = base.ends_with(".gz");
  if (file.gzip) base.remove_suffix(3);
  if (base.ends_with(".jsonl")) {
    file.format = InputFormat::kJsonl;
    return true;
  }
  if (base.ends_with(".txt")) {
    file.format = InputFormat::kText;
    return true;
  }
  return false;
}

bool is_blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; });
}

std::string where(const InputFile& input, std::uint64_t line) {
  return concat(input.path, ":", line);
}

}  // namespace

const char* split_name(Split split) {
  switch (split) {
    case Split::kTrain: return "train";
    case Split::kVal: return "val";
    case Split::kTest: return "test";
  }
  return "?";
}

void SplitFractions::validate() const {
  require(val >= 0 && val < 1, "--val-fraction must be in [0, 1), got ", val);
  require(test >= 0 && test < 1, "--test-fraction must be in [0, 1), got ", test);
  require(val + test < 1, "--val-fraction + --test-fraction must be below 1 (the rest is train), got ", val + test);
}

Split assign_split(std::string_view key, const SplitFractions& fractions) {
  const double u = static_cast<double>(hash64(key) >> 11) * 0x1.0p-53;
  if (u < fractions.test) return Split::kTest;
  if (u < fractions.test + fractions.val) return Split::kVal;
  return Split::kTrain;
}

std::string split_rule_text(std::size_t single_text_piece_bytes) {
  std::string single;
  if (single_text_piece_bytes != 0)
    single = concat(". The corpus is one text file of at most ", kLongDocumentBytes,
                    " bytes: its document is cut the same way, into pieces of at most max(", kMinPieceBytes,
                    ", ceil(bytes / ", kMinPieces, ")) = ", single_text_piece_bytes, " bytes");
  return concat("u = (hash64(key) >> 11) / 2^53 with key = the document's id (strings as is, other JSON values "
                "serialised compactly) or, without an id, its text; test if u < test_fraction, val if u < "
                "test_fraction + val_fraction, else train. A document over ", kLongDocumentBytes,
                " bytes is cut into pieces of at most ", kPieceBytes,
                " bytes (ending after a newline, else a space, in their second half); piece i is keyed "
                "hex64(hash64(key)) + \"#\" + i, and of its N pieces the round(test_fraction * N) of lowest u go to "
                "test, the next round(val_fraction * N) to val (at least 1 each for a positive fraction), the rest "
                "to train", single);
}

namespace {

// Where the piece of at most `piece_bytes` starting at `begin` ends (see kPieceBytes).
std::size_t piece_end(std::string_view text, std::size_t begin, std::size_t piece_bytes) {
  if (text.size() - begin <= piece_bytes) return text.size();
  const std::size_t limit = begin + piece_bytes;  // the piece is [begin, cut), cut <= limit
  const std::size_t half = begin + piece_bytes / 2;
  for (const char c : {'\n', ' '}) {
    const std::size_t at = text.rfind(c, limit - 1);
    if (at != std::string_view::npos && at >= half) return at + 1;
  }
  std::size_t cut = limit;
  while (cut > half && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return cut;
}

double split_u(std::string_view key) { return static_cast<double>(hash64(key) >> 11) * 0x1.0p-53; }

}  // namespace

std::size_t split_piece_bytes(std::size_t bytes, const SplitFractions& fractions) {
  if (bytes > kLongDocumentBytes) return kPieceBytes;
  if (!fractions.single_text) return 0;
  return std::max(kMinPieceBytes, (bytes + kMinPieces - 1) / kMinPieces);
}

SplitFractions split_for_corpus(SplitFractions fractions, std::span<const InputFile> inputs) {
  fractions.single_text = inputs.size() == 1 && inputs.front().format == InputFormat::kText;
  return fractions;
}

std::vector<Segment> split_document(std::string_view text, std::string_view key, const SplitFractions& fractions) {
  const std::size_t piece_bytes = split_piece_bytes(text.size(), fractions);
  if (piece_bytes == 0 || text.empty()) return {Segment{assign_split(key, fractions), 0, text.size()}};
  std::vector<Segment> pieces;
  for (std::size_t begin = 0; begin < text.size();) {
    const std::size_t end = piece_end(text, begin, piece_bytes);
    pieces.push_back(Segment{Split::kTrain, begin, end});
    begin = end;
  }
  const std::size_t n = pieces.size();
  const std::string prefix = hex64(hash64(key)) + "#";
  std::vector<std::pair<double, std::size_t>> ranked(n);
  for (std::size_t i = 0; i < n; ++i) ranked[i] = {split_u(prefix + std::to_string(i)), i};
  std::sort(ranked.begin(), ranked.end());
  auto share = [n](double fraction) -> std::size_t {
    if (fraction <= 0) return 0;
    return std::max<std::size_t>(1, static_cast<std::size_t>(std::llround(fraction * static_cast<double>(n))));
  };
  // At least one piece stays in train (a single short text may have only one piece).
  const std::size_t n_test = std::min(share(fractions.test), n - 1);
  const std::size_t n_val = std::min(share(fractions.val), n - 1 - n_test);
  for (std::size_t r = 0; r < n_test + n_val; ++r)
    pieces[ranked[r].second].split = r < n_test ? Split::kTest : Split::kVal;
  std::vector<Segment> segments;
  for (const Segment& piece : pieces) {
    if (!segments.empty() && segments.back().split == piece.split) segments.back().end = piece.end;
    else segments.push_back(piece);
  }
  return segments;
}

std::vector<InputFile> expand_inputs(std::span<const std::string> paths) {
  std::vector<InputFile> out;
  std::set<std::string> seen;
  auto add = [&](InputFile file) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(file.path, ec);
    if (seen.insert(ec ? file.path : canonical.string()).second) out.push_back(std::move(file));
  };
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status status = fs::status(path, ec);
    require(!ec || ec == std::errc::no_such_file_or_directory, "cannot access input '", path, "': ", ec.message());
    require(fs::exists(status), "input '", path, "' does not exist");
    if (fs::is_directory(status)) {
      std::vector<InputFile> found;
      try {
        for (auto it = fs::recursive_directory_iterator(path); it != fs::recursive_directory_iterator(); ++it) {
          const std::string name = it->path().filename().string();
          if (name.starts_with(".")) {
            if (it->is_directory()) it.disable_recursion_pending();
            continue;
          }
          InputFile file{it->path().string()};
          if (it->is_regular_file() && classify(name, file)) found.push_back(std::move(file));
        }
      } catch (const fs::filesystem_error& e) {
        fail("cannot read directory '", path, "': ", e.code().message(), " (", e.path1().string(), ")");
      }
      require(!found.empty(), "no .jsonl, .jsonl.gz, .txt or .txt.gz files under '", path, "'");
      std::sort(found.begin(), found.end(), [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
      for (InputFile& f : found) add(std::move(f));
    } else if (fs::is_regular_file(status)) {
      InputFile file{path};
      require(classify(fs::path(path).filename().string(), file), "unsupported input '", path,
              "': expected a .jsonl, .jsonl.gz, .txt or .txt.gz file or a directory of them");
      add(std::move(file));
    } else {
      fail("input '", path, "' is neither a regular file nor a directory");
    }
  }
  return out;
}

std::vector<InputFile> default_corpus() {
  const fs::path doc_root = "/usr/share/doc";
  std::set<std::string> roots;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(doc_root, ec)) {
    if (!entry.path().filename().string().starts_with("python3")) continue;
    const fs::path sources = entry.path() / "html" / "_sources";
    std::error_code ec2;
    if (fs::is_directory(sources, ec2)) roots.insert(fs::canonical(sources, ec2).string());
  }
  require(!roots.empty(), "no --input given and the default corpus is missing: install Debian's python3-doc "
          "(it provides /usr/share/doc/python3*/html/_sources), or pass --input");
  const std::string root = *roots.rbegin();
  const std::string root_arg[] = {root};
  std::vector<InputFile> files = expand_inputs(root_arg);
  std::erase_if(files, [](const InputFile& f) { return !f.path.ends_with(".rst.txt"); });
  require(!files.empty(), "the default corpus directory '", root, "' has no .rst.txt files");
  return files;
}

// One input file's bytes: raw blocks are hashed as read, then inflated when gzip-compressed.
class CorpusReader::Stream {
 public:
  Stream(const InputFile& input, SourceStats& stats) : input_(input), stats_(stats), block_(kReadBlock) {
    file_ = std::fopen(input.path.c_str(), "rb");
    if (!file_) fail("cannot read '", input.path, "': ", std::strerror(errno));
    if (input.gzip) {
      std::memset(&zs_, 0, sizeof zs_);
      if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) fail("cannot start gzip decoding of '", input.path, "'");
      z_open_ = true;
    }
  }
  ~Stream() {
    if (z_open_) inflateEnd(&zs_);
    if (file_) std::fclose(file_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Appends up to about one block of file content to `out`; false once the file is exhausted.
  // Adds the bytes read from the file to raw_total, the bytes appended to text_total.
  bool read(std::string& out, std::uint64_t& raw_total, std::uint64_t& text_total) {
    if (!input_.gzip) {
      const std::size_t got = fill(raw_total);
      out.append(reinterpret_cast<const char*>(block_.data()), got);
      text_total += got;
      return got != 0;
    }
    std::size_t produced = 0;
    while (produced < kReadBlock) {
      if (zs_.avail_in == 0 && !eof_) {
        zs_.avail_in = static_cast<uInt>(fill(raw_total));
        zs_.next_in = block_.data();
      }
      if (zs_.avail_in == 0) {
        require(member_done_ || stats_.bytes == 0, input_.path, ": truncated gzip data");
        break;
      }
      if (member_done_) {  // concatenated gzip members form one stream, as gzip -d reads them
        inflateReset(&zs_);
        member_done_ = false;
      }
      const std::size_t old = out.size();
      out.resize(old + (kReadBlock << 1));
      zs_.next_out = reinterpret_cast<Bytef*>(out.data() + old);
      zs_.avail_out = static_cast<uInt>(kReadBlock << 1);
      const int rc = inflate(&zs_, Z_NO_FLUSH);
      const std::size_t got = (kReadBlock << 1) - zs_.avail_out;
      out.resize(old + got);
      produced += got;
      text_total += got;
      if (rc == Z_STREAM_END) member_done_ = true;
      else if (rc != Z_OK && rc != Z_BUF_ERROR)
        fail(input_.path, ": corrupt gzip data (", zs_.msg ? zs_.msg : "zlib error", ")");
    }
    return produced != 0;
  }

 private:
  std::size_t fill(std::uint64_t& raw_total) {
    if (eof_) return 0;
    const std::size_t got = std::fread(block_.data(), 1, block_.size(), file_);
    if (got < block_.size()) {
      if (std::ferror(file_)) fail("cannot read '", input_.path, "': ", std::strerror(errno));
      eof_ = true;
    }
    hasher_.update(block_.data(), got);
    stats_.bytes += got;
    stats_.hash = hasher_.digest();
    raw_total += got;
    return got;
  }

  const InputFile& input_;
  SourceStats& stats_;
  std::FILE* file_ = nullptr;
  z_stream zs_{};
  bool z_open_ = false;
  bool eof_ = false;
  bool member_done_ = false;
  std::vector<unsigned char> block_;
  Hasher64 hasher_;
};

CorpusReader::CorpusReader(std::vector<InputFile> inputs) : inputs_(std::move(inputs)), stats_(inputs_.size()) {}

CorpusReader::~CorpusReader() = default;

bool CorpusReader::open_next_file() {
  if (stream_) {
    SourceStats& done = stats_[current_];
    done.finished = true;
    require(done.records != 0, inputs_[current_].path, ": empty input (no documents)");
    stream_.reset();
    ++current_;
  }
  if (current_ >= inputs_.size()) return false;
  stats_[current_] = SourceStats{};
  stream_ = std::make_unique<Stream>(inputs_[current_], stats_[current_]);
  pending_.clear();
  pending_pos_ = 0;
  line_ = 0;
  stream_done_ = false;
  return true;
}

bool CorpusReader::next_record(RawRecord& record) {
  for (;;) {
    if (!stream_ && !open_next_file()) return false;
    const InputFile& input = inputs_[current_];
    if (input.format == InputFormat::kText) {
      if (!stream_done_) {
        while (stream_->read(pending_, raw_bytes_read_, text_bytes_read_)) {}
        stream_done_ = true;
        if (!pending_.empty()) {
          record.source = static_cast<std::uint32_t>(current_);
          record.line = 1;
          record.data = std::move(pending_);
          pending_.clear();
          ++stats_[current_].records;
          return true;
        }
      }
      if (!open_next_file()) return false;
      continue;
    }
    const std::size_t nl = pending_.find('\n', pending_pos_);
    std::string_view line;
    if (nl != std::string::npos) {
      line = std::string_view(pending_).substr(pending_pos_, nl - pending_pos_);
      pending_pos_ = nl + 1;
    } else if (!stream_done_) {
      pending_.erase(0, pending_pos_);  // keep the partial line, read on
      pending_pos_ = 0;
      if (!stream_->read(pending_, raw_bytes_read_, text_bytes_read_)) stream_done_ = true;
      continue;
    } else if (pending_pos_ < pending_.size()) {  // a last line without a newline
      line = std::string_view(pending_).substr(pending_pos_);
      pending_pos_ = pending_.size();
    } else {
      if (!open_next_file()) return false;
      continue;
    }
    ++line_;
    if (is_blank(line)) continue;
    if (line.back() == '\r') line.remove_suffix(1);
    record.source = static_cast<std::uint32_t>(current_);
    record.line = line_;
    record.data.assign(line);
    ++stats_[current_].records;
    return true;
  }
}

bool CorpusReader::next_batch(std::vector<RawRecord>& batch, std::size_t max_bytes) {
  batch.clear();
  if (deferred_error_) std::rethrow_exception(std::exchange(deferred_error_, nullptr));
  std::size_t bytes = 0;
  while (bytes < max_bytes) {
    RawRecord record;
    try {
      if (!next_record(record)) break;
    } catch (const Error&) {
      // Hand out the records before the failure first: errors in them come earlier in the input.
      if (batch.empty()) throw;
      deferred_error_ = std::current_exception();
      break;
    }
    bytes += record.data.size() + 64;
    batch.push_back(std::move(record));
  }
  return !batch.empty();
}

namespace {

// A byte order mark opening a document (editors on Windows write one) is no text of it: else it
// is tokenized as three byte tokens at every document's start and scored by eval --text.
void strip_byte_order_mark(std::string& text) {
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
}

}  // namespace

Document parse_record(RawRecord& record, const InputFile& input, const SplitFractions& fractions) {
  Document doc;
  const std::size_t bad = find_invalid_utf8(record.data);
  if (input.format == InputFormat::kText) {
    if (bad != std::string_view::npos)
      fail(where(input, line_of_offset(record.data, bad)), ": invalid UTF-8 (byte offset ", bad, " of the file)");
    doc.text = std::move(record.data);
    strip_byte_order_mark(doc.text);
    doc.segments = split_document(doc.text, doc.text, fractions);
  } else {
    if (bad != std::string_view::npos)
      fail(where(input, record.line), ": invalid UTF-8 (byte ", bad + 1, " of the line)");
    nlohmann::json object =
        parse_json(record.data, [&] { return concat(where(input, record.line), ": malformed JSON: "); });
    require(object.is_object(), where(input, record.line), ": expected a JSON object, got ", object.type_name());
    const std::string& field = input.text_field;
    const auto text = object.find(field);
    require(text != object.end(), where(input, record.line), ": missing \"", field, "\" field",
            field == "text" ? " (a document's text; another field: --text-field NAME)" : "");
    require(text->is_string(), where(input, record.line), ": field \"", field, "\" is a ", text->type_name(),
            ", not a string");
    doc.text = std::move(text->get_ref<std::string&>());
    strip_byte_order_mark(doc.text);
    const auto id = object.find("id");
    if (id != object.end() && !id->is_null()) {
      doc.segments =
          split_document(doc.text, id->is_string() ? id->get_ref<const std::string&>() : id->dump(), fractions);
    } else {
      doc.segments = split_document(doc.text, doc.text, fractions);
    }
    record.data.clear();
  }
  doc.empty = is_blank(doc.text);
  return doc;
}

}  // namespace attnres::data
