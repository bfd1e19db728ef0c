#include "data/gpt2_tokenizer.hpp"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "data/hash.hpp"
#include "data/unicode.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"
#include "util/paths.hpp"
#include "util/json.hpp"

namespace attnres::data {
namespace {

struct CharInfo {
  CharClass cls;
  std::uint32_t length;
};

inline CharInfo char_at(std::string_view text, std::size_t i) {
  const auto b = static_cast<unsigned char>(text[i]);
  if (b < 0x80) return {char_class(b), 1};
  const DecodedChar d = decode_utf8(text, i);
  return {d.cp == 0x110000 ? CharClass::kOther : char_class(d.cp), d.length};
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) starting at text[i] == '\'', or 0.
inline std::size_t contraction_at(std::string_view text, std::size_t i) {
  if (i + 1 >= text.size()) return 0;
  const char c1 = text[i + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (i + 2 >= text.size()) return 0;
  const char c2 = text[i + 2];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// The pattern's alternatives are tried in order at each position, as a backtracking regex
// engine would; the comments name the alternative each branch reproduces.
template <class Emit>
void pretokenize(std::string_view text, Emit&& emit) {
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    if (text[i] == '\'') {  // 's|'t|'re|'ve|'m|'ll|'d
      if (const std::size_t len = contraction_at(text, i)) {
        emit(text.substr(i, len));
        i += len;
        continue;
      }
    }
    // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+": an optional ASCII space, then a run of one class.
    std::size_t start = i;
    CharInfo first = char_at(text, i);
    if (text[i] == ' ' && i + 1 < n) {
      const CharInfo next = char_at(text, i + 1);
      if (next.cls != CharClass::kSpace) {
        start = i + 1;
        first = next;
      }
    }
    if (first.cls != CharClass::kSpace) {
      std::size_t end = start + first.length;
      while (end < n) {
        const CharInfo c = char_at(text, end);
        if (c.cls != first.cls) break;
        end += c.length;
      }
      emit(text.substr(i, end - i));
      i = end;
      continue;
    }
    // "\s+(?!\S)" then "\s+": a whitespace run, less its last character when a non-space follows
    // (that character then prefixes the next piece or stands alone).
    std::size_t end = i;
    std::size_t last = i;
    std::size_t count = 0;
    while (end < n) {
      const CharInfo c = char_at(text, end);
      if (c.cls != CharClass::kSpace) break;
      last = end;
      end += c.length;
      ++count;
    }
    const std::size_t stop = (end < n && count >= 2) ? last : end;
    emit(text.substr(i, stop - i));
    i = stop;
  }
}

// Decodes a byte-level token string (UTF-8 of mapped code points) back to raw bytes.
bool unmap_token(std::string_view token, const std::unordered_map<char32_t, unsigned char>& inverse,
                 std::string& bytes) {
  bytes.clear();
  for (std::size_t i = 0; i < token.size();) {
    const DecodedChar d = decode_utf8(token, i);
    const auto it = inverse.find(d.cp);
    if (d.cp == 0x110000 || it == inverse.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
    i += d.length;
  }
  return true;
}

}  // namespace

std::array<char32_t, 256> gpt2_byte_to_codepoint() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& pieces) {
  pretokenize(text, [&](std::string_view piece) { pieces.push_back(piece); });
}

void Gpt2Tokenizer::PairTable::reserve(std::size_t n) {
  std::size_t capacity = 16;
  shift_ = 60;
  while (capacity < 2 * n) {
    capacity *= 2;
    --shift_;
  }
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Merge{0, 0});
  mask_ = capacity - 1;
}

void Gpt2Tokenizer::PairTable::insert(std::int32_t left, std::int32_t right, Merge merge) {
  const std::uint64_t key = pack(left, right);
  for (std::uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> shift_;; slot = (slot + 1) & mask_) {
    if (keys_[slot] == key) return;  // a repeated merge keeps its first (lowest) rank
    if (keys_[slot] == kEmpty) {
      keys_[slot] = key;
      values_[slot] = merge;
      return;
    }
  }
}

Gpt2Tokenizer::Gpt2Tokenizer(const std::string& dir, std::string spec) : spec_(std::move(spec)) {
  namespace fs = std::filesystem;
  const std::string encoder_path = (fs::path(dir) / "encoder.json").string();
  const std::string merges_path = (fs::path(dir) / "vocab.bpe").string();
  require_path_kind(dir, PathKind::kDirectory, "GPT-2 tokenizer directory", "give the directory holding encoder.json and vocab.bpe");
  const std::string encoder_text = read_text_file(encoder_path);
  const std::string merges_text = read_text_file(merges_path);
  // The content hash covers both files (each hashed, then the pair of hex digests), in a fixed order.
  content_hash_ = checksum_hex(checksum64(checksum_hex(checksum64(encoder_text)) + checksum_hex(checksum64(merges_text))));
  legacy_content_hash_ = hex64(hash64(hex64(hash64(encoder_text)) + hex64(hash64(merges_text))));

  const std::array<char32_t, 256> forward = gpt2_byte_to_codepoint();
  std::unordered_map<char32_t, unsigned char> inverse;
  for (int b = 0; b < 256; ++b) inverse[forward[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);

  const nlohmann::json encoder = parse_json(encoder_text, [&] { return concat(encoder_path, ": malformed JSON: "); });
  require(encoder.is_object() && !encoder.empty(), encoder_path, ": expected a JSON object of token -> id");
  id_bytes_.assign(encoder.size(), std::string());
  std::vector<bool> seen(encoder.size(), false);
  std::unordered_map<std::string, std::int32_t> bytes_to_id;
  bytes_to_id.reserve(encoder.size());
  std::string bytes;
  for (const auto& [token, value] : encoder.items()) {
    require(value.is_number_integer(), encoder_path, ": id of token '", token, "' is not an integer");
    const auto id = value.get<std::int64_t>();
    require(id >= 0 && id < static_cast<std::int64_t>(encoder.size()) && !seen[static_cast<std::size_t>(id)],
            encoder_path, ": ids must be 0..", encoder.size() - 1, " without repeats (token '", token, "' has ", id, ")");
    seen[static_cast<std::size_t>(id)] = true;
    if (token == kEndOfText) {
      eot_id_ = static_cast<std::int32_t>(id);
      id_bytes_[static_cast<std::size_t>(id)] = std::string(kEndOfText);
      continue;
    }
    require(unmap_token(token, inverse, bytes), encoder_path, ": token '", token, "' is not a byte-level token");
    id_bytes_[static_cast<std::size_t>(id)] = bytes;
    bytes_to_id.emplace(bytes, static_cast<std::int32_t>(id));
  }
  require(eot_id_ >= 0, encoder_path, ": no '", kEndOfText, "' token");
  for (int b = 0; b < 256; ++b) {
    const auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    require(it != bytes_to_id.end(), encoder_path, ": no token for byte ", b);
    byte_id_[static_cast<std::size_t>(b)] = it->second;
  }

  // vocab.bpe: a "#version" line, then one merge "LEFT RIGHT" per line; rank = order.
  struct Rule {
    std::int32_t left, right, merged;
  };
  std::vector<Rule> rules;
  std::size_t pos = 0;
  std::uint64_t line_no = 0;
  std::string left_bytes, right_bytes;
  while (pos < merges_text.size()) {
    std::size_t eol = merges_text.find('\n', pos);
    if (eol == std::string::npos) eol = merges_text.size();
    std::string_view line(merges_text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const std::size_t space = line.find(' ');
    require(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                line.find(' ', space + 1) == std::string_view::npos,
            merges_path, ":", line_no, ": expected 'LEFT RIGHT'");
    require(unmap_token(line.substr(0, space), inverse, left_bytes) &&
                unmap_token(line.substr(space + 1), inverse, right_bytes),
            merges_path, ":", line_no, ": not a byte-level merge");
    const auto l = bytes_to_id.find(left_bytes);
    const auto r = bytes_to_id.find(right_bytes);
    const auto m = bytes_to_id.find(left_bytes + right_bytes);
    require(l != bytes_to_id.end() && r != bytes_to_id.end() && m != bytes_to_id.end(), merges_path, ":",
            line_no, ": merge of tokens missing from encoder.json");
    rules.push_back({l->second, r->second, m->second});
  }
  require(rules.size() < static_cast<std::size_t>(INT32_MAX), merges_path, ": too many merges");
  merges_.reserve(rules.size());
  // bpe_heap applies merges in global rank order, bpe_reference in rounds; they agree when every
  // merge ranks after the merges that create its parts (true of any learned BPE). Check it.
  std::vector<std::int64_t> created_at(id_bytes_.size(), -1);
  for (std::size_t rank = 0; rank < rules.size(); ++rank) {
    const Rule& rule = rules[rank];
    merges_.insert(rule.left, rule.right, Merge{static_cast<std::int32_t>(rank), rule.merged});
    auto& c = created_at[static_cast<std::size_t>(rule.merged)];
    c = std::max(c, static_cast<std::int64_t>(rank));
  }
  for (std::size_t rank = 0; rank < rules.size(); ++rank) {
    const Rule& rule = rules[rank];
    if (created_at[static_cast<std::size_t>(rule.left)] >= static_cast<std::int64_t>(rank) ||
        created_at[static_cast<std::size_t>(rule.right)] >= static_cast<std::int64_t>(rank))
      heap_exact_ = false;
  }
}

void Gpt2Tokenizer::bpe_reference(std::string_view piece, std::vector<std::int32_t>& out) const {
  std::vector<std::int32_t> word(piece.size());
  for (std::size_t i = 0; i < piece.size(); ++i) word[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  std::vector<std::int32_t> next;
  while (word.size() > 1) {
    const Merge* best = nullptr;
    std::int32_t best_left = 0, best_right = 0;
    for (std::size_t k = 0; k + 1 < word.size(); ++k) {
      const Merge* m = merges_.find(word[k], word[k + 1]);
      if (m && (!best || m->rank < best->rank)) {
        best = m;
        best_left = word[k];
        best_right = word[k + 1];
      }
    }
    if (!best) break;
    next.clear();
    for (std::size_t k = 0; k < word.size();) {
      if (k + 1 < word.size() && word[k] == best_left && word[k + 1] == best_right) {
        next.push_back(best->merged);
        k += 2;
      } else {
        next.push_back(word[k]);
        ++k;
      }
    }
    word.swap(next);
  }
  out.insert(out.end(), word.begin(), word.end());
}

void Gpt2Tokenizer::bpe_heap(std::string_view piece, std::vector<std::int32_t>& out) const {
  struct Symbol {
    std::int32_t id, prev, next;
  };
  struct Candidate {
    std::int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<std::int32_t>(piece.size());
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i)
    sym[static_cast<std::size_t>(i)] = {byte_id_[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])],
                                        i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](std::int32_t pos) {
    if (pos < 0) return;
    const std::int32_t nx = sym[static_cast<std::size_t>(pos)].next;
    if (nx < 0) return;
    const std::int32_t l = sym[static_cast<std::size_t>(pos)].id, r = sym[static_cast<std::size_t>(nx)].id;
    if (const Merge* m = merges_.find(l, r)) heap.push({m->rank, pos, l, r});
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = sym[static_cast<std::size_t>(c.pos)];
    // Stale entries: a merge since this was pushed changed the left or right symbol.
    if (s.id != c.left || s.next < 0 || sym[static_cast<std::size_t>(s.next)].id != c.right) continue;
    Symbol& right = sym[static_cast<std::size_t>(s.next)];
    s.id = merges_.find(c.left, c.right)->merged;
    right.id = -1;
    s.next = right.next;
    if (s.next >= 0) sym[static_cast<std::size_t>(s.next)].prev = c.pos;
    consider(s.prev);
    consider(c.pos);
  }
  for (std::int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[static_cast<std::size_t>(i)].next)
    out.push_back(sym[static_cast<std::size_t>(i)].id);
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<std::int32_t>& out) const {
  if (piece.size() >= kHeapMinPiece && heap_exact_) bpe_heap(piece, out);
  else bpe_reference(piece, out);
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  pretokenize(text, [&](std::string_view piece) {
    if (piece.size() == 1) {
      out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    } else {
      cache_.encode(piece, out, [this](std::string_view p, std::vector<std::int32_t>& o) { bpe(p, o); });
    }
  });
}

std::vector<std::int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, out);
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string text;
  for (const std::int32_t id : ids) {
    require(id >= 0 && id < vocab_size(), "token id ", id, " is outside the GPT-2 vocabulary (", vocab_size(), ")");
    text += id_bytes_[static_cast<std::size_t>(id)];
  }
  return text;
}

}  // namespace attnres::data
