// What this binary is: attnres's version (project(VERSION) in CMakeLists.txt) and the commit it was
// built from, with whether tracked files differed from that commit. Captured at BUILD time (not at
// configure time) by cmake/build_info.cmake, which writes the one generated source defining
// build_info(); `attnres --version` and every result file's provenance (results/provenance.hpp)
// read it here.
#pragma once

#include <optional>
#include <string>

namespace attnres {

struct BuildInfo {
  std::string version;        // "0.9.0"
  std::string commit;         // `git rev-parse --short=12 HEAD`; "unknown" when built without git
  std::optional<bool> dirty;  // tracked files changed from the commit; nullopt: unknown (no git)
};

const BuildInfo& build_info();

}  // namespace attnres
