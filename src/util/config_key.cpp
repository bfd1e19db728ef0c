#include "util/config_key.hpp"

#include <charconv>
#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace attnres {

std::string type_phrase(ConfigType type) {
  switch (type) {
    case ConfigType::boolean: return "true or false";
    case ConfigType::integer: return "an integer";
    case ConfigType::number: return "a number";
    case ConfigType::choice: return "a string";
    case ConfigType::numbers: return "an array of numbers, e.g. [0.5, 1.0]";
  }
  return "?";
}

namespace {

std::string trim(std::string_view s) {
  const auto a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

double parse_bound(const std::string& text, const std::string& range) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ATTNRES_CHECK(used != 0 && used == text.size(), "malformed config range '", range, "'");
  return v;
}

// The shortest text that reads back as the same double (0.003, not 0.0030000000000000001), as
// a TOML number. Digits alone are a TOML integer, so an integral value that would not fit one
// (|v| >= 1e15 printed without an exponent, e.g. 123456789012345680000) is written with one.
std::string shortest(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  if (std::abs(v) >= 1e15 && std::string_view(buf, static_cast<std::size_t>(r.ptr - buf)).find('e') == std::string_view::npos)
    r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  return std::string(buf, r.ptr);
}

}  // namespace

ConfigRange::ConfigRange(std::string text) : text_(trim(text)) {
  if (text_.empty()) return;
  const char first = text_.front();
  if (first == '[' || first == '(') {
    const auto comma = text_.find(',');
    const char last = text_.back();
    if (comma == std::string::npos || (last != ']' && last != ')'))
      ATTNRES_UNREACHABLE("malformed config range '", text_, "'");
    lo_ = parse_bound(trim(text_.substr(1, comma - 1)), text_);
    hi_ = parse_bound(trim(text_.substr(comma + 1, text_.size() - comma - 2)), text_);
    lo_open_ = first == '(';
    hi_open_ = last == ')';
    return;
  }
  const bool or_equal = text_.size() > 1 && text_[1] == '=';
  const std::string bound = trim(text_.substr(or_equal ? 2 : 1));
  if (first == '>') {
    lo_ = parse_bound(bound, text_);
    lo_open_ = !or_equal;
  } else if (first == '<') {
    hi_ = parse_bound(bound, text_);
    hi_open_ = !or_equal;
  } else {
    ATTNRES_UNREACHABLE("malformed config range '", text_, "'");
  }
}

bool ConfigRange::contains(double v) const {
  if (std::isnan(v)) return false;
  if (lo_ && (lo_open_ ? !(v > *lo_) : !(v >= *lo_))) return false;
  if (hi_ && (hi_open_ ? !(v < *hi_) : !(v <= *hi_))) return false;
  return true;
}

std::string ConfigRange::requirement() const {
  if (lo_ && hi_) return "in " + text_;
  if (lo_) return (lo_open_ ? "greater than " : "at least ") + shortest(*lo_);
  if (hi_) return (hi_open_ ? "less than " : "at most ") + shortest(*hi_);
  return "anything";
}

std::string toml_literal(const ConfigValue& value) {
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::int64_t>) return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>) return shortest(v);
        else if constexpr (std::is_same_v<T, std::string>) return "\"" + v + "\"";
        else {
          std::string s = "[";
          for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + shortest(v[i]);
          return s + "]";
        }
      },
      value);
}

nlohmann::json to_json_value(const ConfigValue& value) {
  return std::visit([](const auto& v) { return nlohmann::json(v); }, value);
}

std::optional<ConfigValue> from_json_value(const nlohmann::json& node, ConfigType type) {
  switch (type) {
    case ConfigType::boolean:
      if (node.is_boolean()) return node.get<bool>();
      break;
    case ConfigType::integer:
      if (node.is_number_integer() && !node.is_number_unsigned()) return node.get<std::int64_t>();
      if (node.is_number_unsigned() && node.get<std::uint64_t>() <= std::uint64_t(INT64_MAX))
        return static_cast<std::int64_t>(node.get<std::uint64_t>());
      break;
    case ConfigType::number:
      if (node.is_number()) return node.get<double>();
      break;
    case ConfigType::choice:
      if (node.is_string()) return node.get<std::string>();
      break;
    case ConfigType::numbers:
      if (node.is_array()) {
        std::vector<double> list;
        for (const auto& e : node) {
          if (!e.is_number()) return std::nullopt;
          list.push_back(e.get<double>());
        }
        return list;
      }
      break;
  }
  return std::nullopt;
}

std::string join_choices(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

std::string describe_differences(const std::vector<ConfigDifference>& differences, const std::string& a_name,
                                 const std::string& b_name) {
  std::string s;
  for (const auto& d : differences)
    s += (s.empty() ? "" : "; ") + d.key + " = " + d.a + " (" + a_name + ") vs " + d.b + " (" + b_name + ")";
  return s;
}

}  // namespace attnres
