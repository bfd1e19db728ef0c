// Small pieces of the messages attnres prints, each written once: a count with its noun ("1
// document", "3 documents") and a word quoted for a shell (paths in the commands hints suggest).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/error.hpp"

namespace attnres {

// "1 document", "0 documents", "2 documents"; `plural` defaults to the noun with an s.
inline std::string counted(std::uint64_t n, std::string_view noun, std::string_view plural = {}) {
  if (n == 1) return concat(n, " ", noun);
  return plural.empty() ? concat(n, " ", noun, "s") : concat(n, " ", plural);
}

// `text` as one word of a POSIX shell: unchanged when it holds only characters no shell treats
// specially (letters, digits, and _-./:=@%+,), else in single quotes (a ' inside as '\''). For the
// commands and paths printed in hints, to be pasted as they are.
inline std::string shell_quote(std::string_view text) {
  constexpr std::string_view kPlain =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=@%+,";
  if (!text.empty() && text.find_first_not_of(kPlain) == std::string_view::npos) return std::string(text);
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace attnres
