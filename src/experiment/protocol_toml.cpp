#include "experiment/protocol_toml.hpp"

#include <sstream>

namespace attnres::experiment {

std::string where(const std::string& path, const toml::node& node) {
  const auto line = node.source().begin.line;
  return line > 0 ? concat(path, ":", line) : path;
}

void apply_config_table(TrainConfig& config, const std::string& path, const toml::table& table,
                        const std::string& section) {
  for (const auto& [key, node] : table) {
    std::ostringstream value;
    if (const toml::array* a = node.as_array()) value << *a;
    else if (const toml::table* t = node.as_table()) fail(where(path, *t), ": '", section, ".", key.str(), "' must be a value, not a table");
    else node.visit([&](const auto& v) { value << v; });
    apply_setting(config, concat(section, ".", key.str(), "=", value.str()), where(path, node));
  }
}

std::vector<const toml::table*> tables_of(const std::string& path, const toml::table& root, const char* key) {
  std::vector<const toml::table*> out;
  const toml::node* n = root.get(key);
  if (n == nullptr) return out;
  if (const toml::table* t = n->as_table()) {
    out.push_back(t);
  } else if (const toml::array* a = n->as_array()) {
    for (const auto& e : *a) {
      const toml::table* t = e.as_table();
      require(t != nullptr, where(path, e), ": [[", key, "]] entries must be tables");
      out.push_back(t);
    }
  } else {
    fail(where(path, *n), ": '", key, "' must be a table ([", key, "]) or an array of tables ([[", key, "]])");
  }
  return out;
}

}  // namespace attnres::experiment
