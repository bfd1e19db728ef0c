// "Did you mean ...?" for a misspelt name: commands and options (cli/options.cpp), config keys
// and their values (util/config_key, train_config.cpp, model/config.cpp), experiment arms and
// tokenizer specs. The one edit distance and closeness rule behind every suggestion.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace attnres {

// Levenshtein distance (insertions, deletions, substitutions).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The name of `names` closest to `word` when it is close enough to be a misspelling of it (at most
// a third of the word's letters differ, or two); "" when none is.
std::string closest_name(std::string_view word, const std::vector<std::string>& names);

// "; did you mean 'GUESS'?", or "" for an empty guess: the tail of an "unknown ..." message.
std::string suggestion(const std::string& guess);

// suggestion(closest_name(word, names)).
std::string did_you_mean(std::string_view word, const std::vector<std::string>& names);

}  // namespace attnres
