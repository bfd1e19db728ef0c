// Parsing JSON from files: nesting is bounded. nlohmann::json parses and destroys any depth
// iteratively, but copying, comparing or printing a value recurses once per level, so a file
// nested a hundred thousand levels deep (`{"id": [[[[...`) would overflow the stack in the first
// dump() or copy. No format attnres reads nests deeper than a handful of levels.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "util/error.hpp"

namespace attnres {

inline constexpr int kMaxJsonDepth = 256;

// Parses `text`; on malformed JSON or nesting deeper than kMaxJsonDepth throws an Error whose
// message is where() (e.g. "FILE:LINE: malformed JSON: ") followed by the detail. `where` is
// only called on failure, so hot loops pay nothing for building it.
template <class Where>
nlohmann::json parse_json(std::string_view text, Where&& where) {
  struct TooDeep {};
  try {
    return nlohmann::json::parse(text, [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    fail(where(), e.what());
  } catch (const TooDeep&) {
    fail(where(), "nested deeper than ", kMaxJsonDepth, " levels");
  }
}

}  // namespace attnres
