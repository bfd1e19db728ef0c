// UTF-8 validation and decoding, and the few Unicode character classes the GPT-2
// pre-tokeniser needs (generated tables, see gen_unicode_tables.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace attnres::data {

// Offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed), or npos when `text` is valid.
std::size_t find_invalid_utf8(std::string_view text);

// 1-based line number of byte `offset` in `text` (for error messages).
std::uint64_t line_of_offset(std::string_view text, std::size_t offset);

enum class CharClass : std::uint8_t { kOther, kLetter, kNumber, kSpace };

struct CodeRange {
  char32_t first;
  char32_t last;
  CharClass cls;
};

// Letter = general category L*, Number = N*, Space = the White_Space property.
CharClass char_class(char32_t cp);

// The Unicode version the tables were generated from.
const char* unicode_tables_version();

struct DecodedChar {
  char32_t cp;
  std::uint32_t length;  // bytes consumed, >= 1
};

// Decodes the code point starting at text[i] (i < text.size()). An ill-formed byte decodes as
// the sentinel U+110000 (class Other) with length 1, so byte-level tokenisers still see every byte.
inline DecodedChar decode_utf8(std::string_view text, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return {b0, 1};
  const std::size_t n = text.size();
  auto cont = [&](std::size_t k) {
    return k < n && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80;
  };
  auto byte = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[k]) & 0x3F); };
  constexpr DecodedChar kBad{0x110000, 1};
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (!cont(i + 1)) return kBad;
    return {(static_cast<char32_t>(b0 & 0x1F) << 6) | byte(i + 1), 2};
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(i + 1) || !cont(i + 2)) return kBad;
    const char32_t cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (byte(i + 1) << 6) | byte(i + 2);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return kBad;
    return {cp, 3};
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return kBad;
    const char32_t cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (byte(i + 1) << 12) |
                        (byte(i + 2) << 6) | byte(i + 3);
    if (cp < 0x10000 || cp > 0x10FFFF) return kBad;
    return {cp, 4};
  }
  return kBad;
}

}  // namespace attnres::data
