// What identifies a prepared dataset wherever its directory is (docs/data.md, "Dataset identity"):
// recorded in every training checkpoint (so `train --resume` on other data is refused) and in a
// protocol experiment's experiment.json (so the study resumes anywhere, on the same data only).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "util/config_key.hpp"

namespace attnres::data {

// From the directory's manifest.json: the tokenizer's content hash ("tokenizer_hash"), each split's
// token count ("train_tokens", "val_tokens", "test_tokens") and "content_hash", the XXH3-64 of the
// shard checksums the manifest records, split by split (so two corpora of the same sizes differ).
// Throws attnres::Error naming the manifest when it is missing or malformed.
nlohmann::json dataset_identity(const std::string& dir);

// The keys of an identity recorded earlier whose value `current` does not share, each with both
// values (ConfigDifference: key, recorded, current). Keys either side lacks (it was written by an
// attnres that did not record them yet) are not compared, so the check is symmetric: an experiment
// recorded before content_hash existed is the same experiment whichever side is asked first.
std::vector<ConfigDifference> dataset_identity_differences(const nlohmann::json& recorded,
                                                           const nlohmann::json& current);

}  // namespace attnres::data
