// The key table of a configuration struct: one entry per key with its section and name, type,
// range, one line of help and the accessors that read and write the field. Every reader and
// writer of a configuration (TOML files, `--set`, the model's JSON, the comparison on resume,
// `--help` and the key table of docs/training.md) is a loop over the table, so adding a key is
// one entry (and the struct field).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres {

// A key's value as readers and writers see it; which alternative is fixed by the key's type.
using ConfigValue = std::variant<bool, std::int64_t, double, std::string, std::vector<double>>;

// boolean: bool; integer: std::int64_t; number: double; choice: std::string (one of the key's
// choices); numbers: std::vector<double>.
enum class ConfigType { boolean, integer, number, choice, numbers };

// What a value of `type` must be, for messages: "true or false", "an integer", ...
std::string type_phrase(ConfigType type);

// Bounds of an integer or number (of each element of a list), parsed from the text the docs
// show: "" (none), ">= 1", "> 0", "<= 4", "[0, 1)", "(0, 1]", ...
class ConfigRange {
 public:
  ConfigRange() = default;
  explicit ConfigRange(std::string text);  // a malformed text is a programming error (InternalError)

  bool empty() const { return text_.empty(); }
  bool contains(double v) const;  // false for NaN
  const std::string& text() const { return text_; }
  std::string requirement() const;  // for messages: "at least 1", "in (0, 1]"

 private:
  std::string text_;
  std::optional<double> lo_, hi_;
  bool lo_open_ = false, hi_open_ = false;
};

// A value as a TOML literal, for files and people alike (config.toml, `attnres config`, messages,
// the docs' key table): numbers in the shortest text that reads back as the same double.
std::string toml_literal(const ConfigValue& value);
nlohmann::json to_json_value(const ConfigValue& value);
// The value of a JSON node as `type`; empty when the node has another type.
std::optional<ConfigValue> from_json_value(const nlohmann::json& node, ConfigType type);

template <class Config>
struct ConfigKey {
  std::string section;  // the TOML table: "model" or "train"
  std::string name;     // the key in it (and in the model's JSON)
  ConfigType type = ConfigType::integer;
  std::vector<std::string> choices;  // type choice: the valid values
  ConfigRange range;                 // checked by validate(), shown in the docs
  std::string help;                  // one line
  std::function<ConfigValue(const Config&)> get;
  // Takes a value of the key's type. Throws Error (without the key's name: callers add it and
  // the source) for an integer outside the field's C++ type or an unknown choice.
  std::function<void(Config&, const ConfigValue&)> set;

  std::string path() const { return section + "." + name; }  // "model.d_model"
};

template <class Config>
using ConfigKeys = std::vector<ConfigKey<Config>>;

// A key reading and writing `member` directly: bool, an integer type (checked against its
// range on set), double or std::vector<double>.
template <class Config, class T>
ConfigKey<Config> config_field(std::string name, T Config::*member, std::string range, std::string help) {
  ConfigKey<Config> k;
  k.name = std::move(name);
  k.range = ConfigRange(std::move(range));
  k.help = std::move(help);
  k.get = [member](const Config& c) {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      return ConfigValue(static_cast<std::int64_t>(c.*member));
    else
      return ConfigValue(c.*member);
  };
  if constexpr (std::is_same_v<T, bool>) {
    k.type = ConfigType::boolean;
    k.set = [member](Config& c, const ConfigValue& v) { c.*member = std::get<bool>(v); };
  } else if constexpr (std::is_integral_v<T>) {
    k.type = ConfigType::integer;
    k.set = [member](Config& c, const ConfigValue& v) {
      const std::int64_t x = std::get<std::int64_t>(v);
      require(std::in_range<T>(x), "must be an integer from ", +std::numeric_limits<T>::min(), " to ",
              +std::numeric_limits<T>::max(), " (got ", x, ")");
      c.*member = static_cast<T>(x);
    };
  } else if constexpr (std::is_same_v<T, double>) {
    k.type = ConfigType::number;
    k.set = [member](Config& c, const ConfigValue& v) { c.*member = std::get<double>(v); };
  } else {
    static_assert(std::is_same_v<T, std::vector<double>>, "config_field: unsupported field type");
    k.type = ConfigType::numbers;
    k.set = [member](Config& c, const ConfigValue& v) { c.*member = std::get<std::vector<double>>(v); };
  }
  return k;
}

// "a, b or c".
std::string join_choices(const std::vector<std::string>& names);

// The value of `values` (an enum's values, each named by to_string(value), found by
// argument-dependent lookup) whose name is `text`. Otherwise an Error: "unknown WHAT 'text'
// (expected a, b or c); did you mean 'b'?" (the suggestion when one is close).
template <class Values>
auto parse_choice(const std::string& text, const Values& values, std::string_view what) {
  std::vector<std::string> names;
  for (const auto e : values) {
    if (to_string(e) == text) return e;
    names.emplace_back(to_string(e));
  }
  fail("unknown ", what, " '", text, "' (expected ", join_choices(names), ")", did_you_mean(text, names));
}

// A key whose field is an enum: `values` lists every value, named by to_string(value), so the
// enum's names are written once.
template <class Config, class E, class Values>
ConfigKey<Config> config_choice(std::string name, E Config::*member, const Values& values, std::string help) {
  ConfigKey<Config> k;
  k.name = std::move(name);
  k.type = ConfigType::choice;
  k.help = std::move(help);
  for (E e : values) k.choices.emplace_back(to_string(e));
  k.get = [member](const Config& c) { return ConfigValue(std::string(to_string(c.*member))); };
  k.set = [member, values](Config& c, const ConfigValue& v) {
    c.*member = parse_choice(std::get<std::string>(v), values, "value");
  };
  return k;
}

// `key` with `effect(config)` run after every set (a key that adjusts another).
template <class Config, class Effect>
ConfigKey<Config> with_effect(ConfigKey<Config> key, Effect effect) {
  key.set = [set = std::move(key.set), effect](Config& c, const ConfigValue& v) {
    set(c, v);
    effect(c);
  };
  return key;
}

// Puts `keys` in one section.
template <class Config>
ConfigKeys<Config> config_section(const std::string& section, ConfigKeys<Config> keys) {
  for (auto& k : keys) k.section = section;
  return keys;
}

// The keys of a nested struct (e.g. ModelConfig inside TrainConfig) as keys of the outer one.
template <class Outer, class Inner>
ConfigKeys<Outer> nested_config_keys(const ConfigKeys<Inner>& inner, Inner Outer::*member) {
  ConfigKeys<Outer> out;
  for (const auto& k : inner)
    out.push_back({k.section, k.name, k.type, k.choices, k.range, k.help,
                   [get = k.get, member](const Outer& c) { return get(c.*member); },
                   [set = k.set, member](Outer& c, const ConfigValue& v) { set(c.*member, v); }});
  return out;
}

template <class Config>
const ConfigKey<Config>* find_config_key(const ConfigKeys<Config>& keys, std::string_view section,
                                         std::string_view name) {
  for (const auto& k : keys)
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

// Checks the range of one key: "<key> must be <range> (got v)".
template <class Config>
void check_config_range(const ConfigKey<Config>& k, const Config& c) {
  if (k.range.empty()) return;
  const ConfigValue v = k.get(c);
  if (const auto* list = std::get_if<std::vector<double>>(&v)) {
    for (double x : *list)
      require(k.range.contains(x), k.path(), ": every element must be ", k.range.requirement(), " (got ",
              toml_literal(ConfigValue(x)), ")");
  } else {
    const double x = std::holds_alternative<double>(v) ? std::get<double>(v) : double(std::get<std::int64_t>(v));
    require(k.range.contains(x), k.path(), " must be ", k.range.requirement(), " (got ", toml_literal(v), ")");
  }
}

// Sets `key` from `value`; errors name `where` and the key ("FILE:LINE: 'train.lr': ...").
template <class Config>
void set_config_value(Config& c, const ConfigKey<Config>& key, const ConfigValue& value, const std::string& where) {
  try {
    key.set(c, value);
  } catch (const Error& e) {
    fail(where, ": '", key.path(), "': ", e.what());
  }
  // Checked here too (not only by validate()), so the error names the file and line or --set.
  try {
    check_config_range(key, c);
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
}

// Checks the range of every key.
template <class Config>
void check_config_ranges(const ConfigKeys<Config>& keys, const Config& c) {
  for (const auto& k : keys) check_config_range(k, c);
}

// A key whose value differs between two configurations, both values displayed.
struct ConfigDifference {
  std::string key;  // "train.lr"
  std::string a, b;
};

template <class Config>
std::vector<ConfigDifference> config_differences(const ConfigKeys<Config>& keys, const Config& a, const Config& b) {
  std::vector<ConfigDifference> out;
  for (const auto& k : keys) {
    const ConfigValue va = k.get(a), vb = k.get(b);
    if (va != vb) out.push_back({k.path(), toml_literal(va), toml_literal(vb)});
  }
  return out;
}

// "model.residual = "rd" (<a_name>) vs "block" (<b_name>); ...".
std::string describe_differences(const std::vector<ConfigDifference>& differences, const std::string& a_name,
                                 const std::string& b_name);

}  // namespace attnres
