#include "data/dataset_identity.hpp"

#include <filesystem>

#include "data/prepare.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"
#include "util/json.hpp"

namespace attnres::data {

nlohmann::json dataset_identity(const std::string& dir) {
  const std::string path = manifest_path(dir);
  const nlohmann::json m = parse_json(read_text_file(path), [&] { return concat(path, ": malformed JSON: "); });
  try {
    nlohmann::json identity = nlohmann::json::object();
    identity["tokenizer_hash"] = m.at("tokenizer").at("hash").get<std::string>();
    std::string shards;  // "train:c1,c2;val:...;test:...;"
    for (const char* split : {"train", "val", "test"}) {
      const nlohmann::json& s = m.at("splits").at(split);
      identity[std::string(split) + "_tokens"] = s.at("tokens").get<std::int64_t>();
      shards += std::string(split) + ":";
      for (const nlohmann::json& shard : s.at("shards")) shards += shard.at("checksum").get<std::string>() + ",";
      shards += ";";
    }
    identity["content_hash"] = checksum_hex(checksum64(shards));
    return identity;
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": not a readable dataset manifest (", e.what(), ")");
  }
}

std::vector<ConfigDifference> dataset_identity_differences(const nlohmann::json& recorded,
                                                           const nlohmann::json& current) {
  std::vector<ConfigDifference> out;
  if (!recorded.is_object()) return {{"dataset", recorded.dump(), current.dump()}};
  for (const auto& [key, value] : recorded.items()) {
    const auto now = current.find(key);
    if (now != current.end() && *now != value) out.push_back({key, value.dump(), now->dump()});
  }
  return out;
}

}  // namespace attnres::data
