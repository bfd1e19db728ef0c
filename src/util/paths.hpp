// Paths as users give them: checked for the kind the reader expects (a file or a directory), with
// one wording everywhere.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "util/error.hpp"

namespace attnres {

enum class PathKind { kFile, kDirectory };

// Fails unless `path` exists and is of the `want` kind: "WHAT 'PATH' does not exist", "WHAT 'PATH'
// is a directory, not a file" or "WHAT 'PATH' is a file, not a directory", then `hint` (e.g. what
// the directory should hold). `what` names the flag or role ("--config", "SentencePiece model");
// empty: the path alone. Every reader of a user-given path checks it here, so a directory given
// for a file (or the reverse) is named as such rather than read as empty or reported missing.
inline void require_path_kind(const std::string& path, PathKind want, std::string_view what,
                              std::string_view hint = {}) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  const std::string named = concat(what, what.empty() ? "" : " ", "'", path, "'");
  const auto tail = [&] { return hint.empty() ? std::string() : concat("; ", hint); };
  require(std::filesystem::exists(status), named, " does not exist", tail());
  if (want == PathKind::kFile)
    require(!std::filesystem::is_directory(status), named, " is a directory, not a file", tail());
  else
    require(std::filesystem::is_directory(status), named, " is a file, not a directory", tail());
}

}  // namespace attnres
