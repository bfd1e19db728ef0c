#include "util/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.hpp"
#include "util/paths.hpp"

namespace attnres {

namespace fs = std::filesystem;

namespace {

fs::path parent_dir(const std::string& path) {
  const fs::path target(path);
  return target.has_parent_path() ? target.parent_path() : fs::path(".");
}

std::string temporary_prefix(const std::string& path) { return "." + fs::path(path).filename().string() + ".tmp."; }

}  // namespace

std::string temporary_path(const std::string& path) {
  return (parent_dir(path) / (temporary_prefix(path) + std::to_string(::getpid()))).string();
}

void remove_stale_temporaries(const std::string& path) {
  const std::string prefix = temporary_prefix(path);
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent_dir(path), ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) continue;
    const auto pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its writer may still run
    std::error_code ignored;
    fs::remove(entry.path(), ignored);
  }
}

void write_bytes(std::FILE* file, const void* data, std::size_t size, const std::string& path) {
  if (size != 0 && std::fwrite(data, 1, size, file) != size)
    fail("cannot write '", path, "': ", std::strerror(errno));
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  remove_stale_temporaries(path);
  const std::string tmp = temporary_path(path);
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (!file) fail("cannot write '", path, "': cannot create its temporary '", tmp, "': ", std::strerror(errno));
  try {
    write(file);
  } catch (...) {
    std::fclose(file);
    std::remove(tmp.c_str());
    throw;
  }
  commit_file(file, tmp, path);
}

void commit_file(std::FILE* file, const std::string& tmp, const std::string& path) {
  // Data written but not yet on disk surfaces here (ENOSPC, EIO), not at fwrite.
  if (std::fflush(file) != 0 || ::fsync(::fileno(file)) != 0) {
    const int err = errno;
    std::fclose(file);
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(err));
  }
  if (std::fclose(file) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot write '", path, "' (closing it failed): ", std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': cannot rename its temporary '", tmp, "' over it: ", std::strerror(err));
  }
  // Make the rename itself durable. File systems that cannot sync a directory say EINVAL.
  const std::string dir = parent_dir(path).string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail("wrote '", path, "' but cannot open its directory to sync it: ", std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL)
    fail("wrote '", path, "' but syncing its directory '", dir, "' failed, so the new file may not survive a crash: ",
         std::strerror(err));
}

void write_text_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size(), path); });
}

GuardedWrite write_text_guarded(const std::string& path, const std::string& text, bool replace,
                                std::string_view hint) {
  std::error_code ec;
  const bool exists = std::filesystem::exists(path, ec);
  if (exists) {
    if (read_text_file(path) == text) return GuardedWrite::kUnchanged;
    require(replace, "'", path, "' exists with other contents; not replaced: ", hint);
  }
  write_text_atomically(path, text);
  return exists ? GuardedWrite::kReplaced : GuardedWrite::kCreated;
}

std::string read_text_file(const std::string& path) {
  // An ifstream opens a directory and reads it as empty: say what it is.
  if (std::error_code ec; std::filesystem::is_directory(path, ec)) require_path_kind(path, PathKind::kFile, "");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) fail("cannot read '", path, "'");
  return out.str();
}

}  // namespace attnres
