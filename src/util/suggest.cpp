#include "util/suggest.hpp"

#include <algorithm>

namespace attnres {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

std::string closest_name(std::string_view word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t best_distance = 0;
  for (const std::string& name : names) {
    const std::size_t d = edit_distance(word, name);
    if (best.empty() || d < best_distance) {
      best = name;
      best_distance = d;
    }
  }
  // Close enough to be a misspelling: a third of the word's letters, at least two.
  return best_distance <= std::max<std::size_t>(2, word.size() / 3) ? best : std::string();
}

std::string suggestion(const std::string& guess) { return guess.empty() ? std::string() : "; did you mean '" + guess + "'?"; }

std::string did_you_mean(std::string_view word, const std::vector<std::string>& names) {
  return suggestion(closest_name(word, names));
}

}  // namespace attnres
