// Strict reading of the result files, shared by every schema in src/results. Each value is checked
// as it is read and every error names the file and the key path, e.g.
//   DIR/runs/rd/seed-2/result.json: key 'milestones[1].val_nll' is missing
// A key the format does not have is an error too, so a misspelt key is never silently ignored.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace attnres::results {

// A number that could not be computed (too few seeds, ...): NaN in memory, null in the files.
inline constexpr double kNotAvailable = std::numeric_limits<double>::quiet_NaN();

// How a number is written: NaN and ±inf (not available) become null.
nlohmann::json number_or_null(double x);
nlohmann::json numbers_or_null(const std::vector<double>& v);

class JsonObject;

// One value of a file being read, with where it is (the file and the key path). The file name
// and the parsed document must outlive it.
class JsonValue {
 public:
  JsonValue(const std::string& file, const nlohmann::json& value, std::string key = "")
      : file_(&file), value_(&value), key_(std::move(key)) {}

  const std::string& file() const { return *file_; }
  const std::string& key() const { return key_; }  // "" at the top level
  const nlohmann::json& raw() const { return *value_; }

  // Throws "<file>: key '<key>' <what>".
  [[noreturn]] void bad(const std::string& what) const;

  bool is_null() const { return value_->is_null(); }
  double number() const;          // a finite number
  double number_or_null() const;  // null reads as kNotAvailable
  double non_negative() const;    // a finite number >= 0
  std::int64_t integer() const;   // integral floats (2e9) are accepted
  std::string string() const;
  bool boolean() const;
  std::vector<JsonValue> array() const;  // the elements, keyed "key[i]"
  std::vector<double> numbers_or_null() const;
  JsonObject object() const;  // "must be an object" unless it is one

 private:
  const std::string* file_;
  const nlohmann::json* value_;
  std::string key_;
};

// An object being read. get() and find() record the keys asked for; finish() makes any other key
// an error. read_object() below calls finish(), so a schema's from_json never has to.
class JsonObject {
 public:
  explicit JsonObject(const JsonValue& value);

  JsonValue get(const std::string& key);                  // "is missing" when absent
  std::optional<JsonValue> find(const std::string& key);  // nullopt when absent (a null is returned)
  void finish() const;

 private:
  std::string path_of(const std::string& key) const;  // "prefix.key"

  JsonValue value_;
  std::set<std::string> asked_;
};

// A schema struct T with `void from_json(JsonObject&, T&)` read from one object, strictly.
template <class T>
T read_object(const JsonValue& value) {
  JsonObject object = value.object();
  T out;
  from_json(object, out);
  object.finish();
  return out;
}

// A file's schema version, key "version": written by every writer since the key was introduced,
// absent (0) in files of earlier builds, which read as before and are written back without it
// (byte for byte). A version this build does not know is an error naming the file.
inline constexpr int kUnversioned = 0;
int read_schema_version(JsonObject& in, int newest);
void put_schema_version(nlohmann::json& j, int version);  // nothing for kUnversioned

// The parsed file; "<file>: invalid JSON: ..." when it does not parse.
nlohmann::json parse_json_file(const std::string& path);

// A whole file holding one T at its top level.
template <class T>
T read_json_file(const std::string& path) {
  const nlohmann::json document = parse_json_file(path);
  return read_object<T>(JsonValue(path, document));
}

}  // namespace attnres::results
