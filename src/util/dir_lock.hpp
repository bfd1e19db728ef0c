// Directories that one process at a time may write (a training run's directory, one worker's
// share of an experiment), and the --out directories of the commands that write them
// (docs/reliability.md, "One writer per directory").
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace attnres {

// An exclusive flock(2) on a lock file inside a directory, held from construction to destruction.
// The kernel releases it when the process ends, however it ends (SIGKILL, a crash), so a lock file
// left behind by a dead process never blocks: only a running holder does.
class DirLock {
 public:
  // Locks `dir`/`name` without waiting (creating the file) and writes this process' id into it.
  // When another process holds it, throws an Error naming the directory, the holder's process id
  // and the lock file, followed by `hint`. On a file system without locks (flock fails with
  // ENOLCK, EOPNOTSUPP, ...) it warns on stderr and goes on unlocked.
  DirLock(const std::string& dir, const std::string& name, const std::string& hint);
  // Removes the lock file, then releases the lock.
  ~DirLock();
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  const std::string& path() const { return path_; }
  bool locked() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

// The process id a lock file records (0 when it records none).
long lock_holder(const std::string& lock_file);

// Creates `dir` with its parents unless it exists. Errors (attnres::Error) name the directory as
// `what` ("the run directory"): it exists and is not a directory, it cannot be created (the
// system's reason), it is not writable. Returns the topmost directory it created (empty when
// `dir` existed).
std::filesystem::path make_output_directory(const std::string& dir, const std::string& what);

// The topmost of `path` and its parents that does not exist yet (empty when `path` exists): what
// creating `path` with its parents would create.
std::filesystem::path first_missing_directory(const std::string& path);

// What a command writes into --out, for OutputDirectory.
struct OutputKind {
  std::string what;       // "run directory"
  std::string lock_name;  // the lock file inside it, e.g. ".lock"
  std::string in_use;     // said after "is in use by process N (...)": who that is, what to do
  // True when the directory holds what a directory of this kind holds (attnres' own files).
  std::function<bool(const std::filesystem::path&)> recognised;
  std::string holds;  // what such a directory holds, for the message: "config.toml, metrics.jsonl, checkpoints"
};

// A command's --out directory, claimed for the life of the object: created if missing (with its
// parents), refused when it is not empty (entries whose name starts with '.' aside) and not
// recognised as one of `kind` (the message names what was found), then locked (DirLock). On
// destruction the lock is released, and a directory this process created and left empty (it
// failed before writing anything) is removed again, with the parents it created.
class OutputDirectory {
 public:
  OutputDirectory(const std::string& dir, const OutputKind& kind);
  ~OutputDirectory();
  OutputDirectory(const OutputDirectory&) = delete;
  OutputDirectory& operator=(const OutputDirectory&) = delete;

 private:
  std::filesystem::path dir_;
  std::filesystem::path created_;  // the topmost directory this process created; empty if none
  std::optional<DirLock> lock_;
};

}  // namespace attnres
