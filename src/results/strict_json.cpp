#include "results/strict_json.hpp"

#include <cmath>

#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/json.hpp"

namespace attnres::results {

using nlohmann::json;

json number_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json numbers_or_null(const std::vector<double>& v) {
  json out = json::array();
  for (double x : v) out.push_back(number_or_null(x));
  return out;
}

void JsonValue::bad(const std::string& what) const {
  fail(*file_, ": key '", key_.empty() ? "(top level)" : key_, "' ", what);
}

double JsonValue::number() const {
  if (!value_->is_number()) bad("must be a number");
  const double d = value_->get<double>();
  if (!std::isfinite(d)) bad("must be finite");
  return d;
}

double JsonValue::number_or_null() const { return is_null() ? kNotAvailable : number(); }

double JsonValue::non_negative() const {
  const double d = number();
  if (d < 0) bad("must not be negative");
  return d;
}

std::int64_t JsonValue::integer() const {
  if (value_->is_number_integer()) return value_->get<std::int64_t>();
  if (value_->is_number_float()) {
    const double d = value_->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e18) return static_cast<std::int64_t>(d);
  }
  bad("must be an integer");
}

std::string JsonValue::string() const {
  if (!value_->is_string()) bad("must be a string");
  return value_->get<std::string>();
}

bool JsonValue::boolean() const {
  if (!value_->is_boolean()) bad("must be true or false");
  return value_->get<bool>();
}

std::vector<JsonValue> JsonValue::array() const {
  if (!value_->is_array()) bad("must be an array");
  std::vector<JsonValue> out;
  out.reserve(value_->size());
  for (std::size_t i = 0; i < value_->size(); ++i) out.emplace_back(*file_, (*value_)[i], concat(key_, "[", i, "]"));
  return out;
}

std::vector<double> JsonValue::numbers_or_null() const {
  std::vector<double> out;
  for (const JsonValue& v : array()) out.push_back(v.number_or_null());
  return out;
}

JsonObject JsonValue::object() const { return JsonObject(*this); }

JsonObject::JsonObject(const JsonValue& value) : value_(value) {
  if (!value.raw().is_object()) value.bad("must be an object");
}

std::string JsonObject::path_of(const std::string& key) const {
  return value_.key().empty() ? key : value_.key() + "." + key;
}

std::optional<JsonValue> JsonObject::find(const std::string& key) {
  asked_.insert(key);
  const auto it = value_.raw().find(key);
  if (it == value_.raw().end()) return std::nullopt;
  return JsonValue(value_.file(), *it, path_of(key));
}

JsonValue JsonObject::get(const std::string& key) {
  if (std::optional<JsonValue> v = find(key)) return *v;
  JsonValue(value_.file(), value_.raw(), path_of(key)).bad("is missing");
}

void JsonObject::finish() const {
  for (const auto& [key, value] : value_.raw().items())
    if (!asked_.count(key))
      JsonValue(value_.file(), value, path_of(key))
          .bad("is not part of this file's format (misspelt, or written by a newer attnres?)");
}

int read_schema_version(JsonObject& in, int newest) {
  const std::optional<JsonValue> v = in.find("version");
  if (!v) return kUnversioned;
  const std::int64_t version = v->integer();
  if (version < 1 || version > newest)
    v->bad(concat("is ", version, "; this build reads ", newest == 1 ? "version 1" : concat("versions 1 to ", newest),
                  " (written by a newer attnres?)"));
  return static_cast<int>(version);
}

void put_schema_version(json& j, int version) {
  if (version != kUnversioned) j["version"] = version;
}

json parse_json_file(const std::string& path) {
  return parse_json(read_text_file(path), [&] { return concat(path, ": invalid JSON: "); });
}

}  // namespace attnres::results
