#include "data/unicode.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

namespace attnres::data {
namespace {

#include "data/unicode_tables.inc"

constexpr std::array<CharClass, 128> make_ascii_table() {
  std::array<CharClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    for (const CodeRange& r : kCodeRanges) {
      if (static_cast<char32_t>(c) >= r.first && static_cast<char32_t>(c) <= r.last) t[c] = r.cls;
    }
  }
  return t;
}
constexpr std::array<CharClass, 128> kAscii = make_ascii_table();

}  // namespace

CharClass char_class(char32_t cp) {
  if (cp < 128) return kAscii[cp];
  const auto* end = std::end(kCodeRanges);
  const auto* it = std::upper_bound(std::begin(kCodeRanges), end, cp,
                                    [](char32_t c, const CodeRange& r) { return c < r.first; });
  if (it == std::begin(kCodeRanges)) return CharClass::kOther;
  --it;
  return cp <= it->last ? it->cls : CharClass::kOther;
}

const char* unicode_tables_version() { return kUnicodeVersion; }

std::size_t find_invalid_utf8(std::string_view text) {
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    // Skip ASCII eight bytes at a time: most text is mostly ASCII.
    while (i + 8 <= n) {
      std::uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const DecodedChar d = decode_utf8(text, i);
    if (d.cp == 0x110000) return i;
    i += d.length;
  }
  return std::string_view::npos;
}

std::uint64_t line_of_offset(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<std::uint64_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(offset), '\n'));
}

}  // namespace attnres::data
