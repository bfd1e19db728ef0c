// Reading a protocol file's TOML (experiment/protocol.cpp, internal): every error names the file
// and line of the node at fault, and a table's unknown keys are errors.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "train/train_config.hpp"
#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres::experiment {

// "FILE:LINE" of a node, for messages.
std::string where(const std::string& path, const toml::node& node);

// The keys of one protocol table, read with their positions; unknown keys are errors.
class Section {
 public:
  Section(const std::string& path, const toml::table& table, std::string name)
      : path_(path), table_(table), name_(std::move(name)) {}

  const toml::node* find(const std::string& key) {
    seen_.insert(key);
    return table_.get(key);
  }
  const toml::node& get(const std::string& key) {
    const toml::node* n = find(key);
    require(n != nullptr, where(path_, table_), ": [", name_, "] needs '", key, "'");
    return *n;
  }
  [[noreturn]] void bad(const toml::node& node, const std::string& key, const std::string& what) const {
    fail(where(path_, node), ": '", name_, ".", key, "' ", what);
  }
  std::string string(const std::string& key, std::string fallback = "") {
    const toml::node* n = find(key);
    if (n == nullptr) return fallback;
    if (auto v = n->value<std::string>()) return *v;
    bad(*n, key, "must be a string");
  }
  std::vector<std::string> strings(const std::string& key) {
    const toml::node* n = find(key);
    std::vector<std::string> out;
    if (n == nullptr) return out;
    const toml::array* a = n->as_array();
    if (a == nullptr) bad(*n, key, "must be an array of strings, e.g. [\"a\", \"b\"]");
    for (const auto& e : *a) {
      auto v = e.value<std::string>();
      if (!v) bad(e, key, "must be an array of strings");
      out.push_back(*v);
    }
    return out;
  }
  double number(const std::string& key, double fallback) {
    const toml::node* n = find(key);
    if (n == nullptr) return fallback;
    if (auto v = n->value<double>()) return *v;
    bad(*n, key, "must be a number");
  }
  std::int64_t integer(const std::string& key, std::int64_t fallback) {
    const toml::node* n = find(key);
    if (n == nullptr) return fallback;
    if (auto v = n->value<std::int64_t>()) return *v;
    bad(*n, key, "must be an integer");
  }
  // Every key not asked for is unknown (with the closest known one, util/suggest.hpp).
  void finish(const std::vector<std::string>& tables = {}) const {
    std::vector<std::string> known(seen_.begin(), seen_.end());
    known.insert(known.end(), tables.begin(), tables.end());
    for (const auto& [key, node] : table_) {
      const std::string k(key.str());
      if (seen_.count(k) == 0 && std::find(tables.begin(), tables.end(), k) == tables.end()) {
        const std::string guess = closest_name(k, known);
        fail(where(path_, node), ": unknown key '", name_, ".", k, "'",
             suggestion(guess.empty() ? guess : concat(name_, ".", guess)));
      }
    }
  }

 private:
  const std::string& path_;
  const toml::table& table_;
  std::string name_;
  std::set<std::string> seen_;
};

// [model] and [train] go through the configuration's own key handling (--set syntax), each
// setting named by its file and line.
void apply_config_table(TrainConfig& config, const std::string& path, const toml::table& table,
                        const std::string& section);

// [controls] / [[controls]] and [[probe]]: one table or an array of them.
std::vector<const toml::table*> tables_of(const std::string& path, const toml::table& root, const char* key);

}  // namespace attnres::experiment
