#include "util/dir_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "util/error.hpp"

namespace attnres {

namespace fs = std::filesystem;

namespace {

// `path` absolute, normalised, without a trailing separator.
fs::path normal_absolute(const fs::path& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return ec ? fs::path() : p;
}

// Removes `dir` and its parents up to `top` while they are empty (fs::remove refuses any other
// directory): what anyone wrote there is never lost.
void remove_if_empty(const fs::path& dir, const fs::path& top) {
  const fs::path last = normal_absolute(top);
  std::error_code ec;
  for (fs::path p = normal_absolute(dir); !p.empty(); p = p.parent_path()) {
    if (!fs::remove(p, ec) || ec || p == last || p == p.parent_path()) break;
  }
}

long holder_of(int fd) {
  char text[32] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return 0;
  char* end = nullptr;
  const long pid = std::strtol(text, &end, 10);
  return end != text && pid > 0 ? pid : 0;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& name, const std::string& hint)
    : path_((fs::path(dir) / name).string()) {
  // The holder before us removes the file before it lets go (the destructor), so the file we
  // opened may be gone or replaced by the time our lock is granted: then take the new one.
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot create the lock file '", path_, "': ", std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EINTR) {
        ::close(fd);
        continue;
      }
      if (err == EWOULDBLOCK) {
        const long pid = holder_of(fd);
        ::close(fd);
        fail("'", dir, "' is in use by ", pid > 0 ? concat("process ", pid) : std::string("another process"),
             " (it holds the lock '", path_, "')", hint.empty() ? "" : "; ", hint);
      }
      ::close(fd);
      std::fprintf(stderr,
                   "attnres: warning: cannot lock '%s' (%s): nothing keeps a second process from writing '%s' "
                   "at the same time\n",
                   path_.c_str(), std::strerror(err), dir.c_str());
      return;
    }
    struct stat held {}, named {};
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev) {
      fd_ = fd;
      break;
    }
    ::close(fd);
    require(attempt < 100, "cannot lock '", path_, "': it keeps being replaced");
  }
  // Who holds it, for the message of a process refused; informational, so a failure is ignored.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t ignored = ::pwrite(fd_, pid.data(), pid.size(), 0);
    (void)ignored;
  }
}

DirLock::~DirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // still holding the lock: a process that opened it now retries
  ::close(fd_);
}

long lock_holder(const std::string& lock_file) {
  const int fd = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const long pid = holder_of(fd);
  ::close(fd);
  return pid;
}

fs::path first_missing_directory(const std::string& path) {
  fs::path created;
  std::error_code ec;
  for (fs::path p = normal_absolute(path); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created = p;
    if (p == p.parent_path()) break;
  }
  return created;
}

fs::path make_output_directory(const std::string& dir, const std::string& what) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  fs::path created;
  if (fs::exists(status)) {
    require(fs::is_directory(status), "--out '", dir, "' exists and is not a directory");
  } else {
    created = first_missing_directory(dir);
    fs::create_directories(dir, ec);
    require(!ec, "cannot create ", what, " '", dir, "': ", ec.message());
  }
  require(::access(dir.c_str(), W_OK) == 0, what, " '", dir, "' is not writable");
  return created;
}

OutputDirectory::OutputDirectory(const std::string& dir, const OutputKind& kind) : dir_(dir) {
  created_ = make_output_directory(dir, "the " + kind.what);
  try {
    // Anything visible that is not of this kind: a folder of other files (a corpus) is no place
    // to write runs into, and what attnres wrote there would get in the way of their next use.
    std::vector<std::string> found;
    std::error_code ec;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!name.starts_with(".")) found.push_back(name + (it->is_directory() ? "/" : ""));
    }
    require(!ec, "cannot read ", kind.what, " '", dir, "': ", ec.message());
    if (!found.empty() && !kind.recognised(dir_)) {
      std::sort(found.begin(), found.end());
      std::string list;
      for (std::size_t i = 0; i < found.size() && i < 5; ++i) list += (i == 0 ? "" : ", ") + found[i];
      if (found.size() > 5) list += concat(" and ", found.size() - 5, " more");
      fail("--out '", dir, "' is not empty and is not an attnres ", kind.what, ": it holds ", list,
           " (what attnres writes there: ", kind.holds, "); choose a new or empty directory");
    }
    lock_.emplace(dir, kind.lock_name, kind.in_use);
  } catch (...) {
    if (!created_.empty()) remove_if_empty(dir_, created_);
    throw;
  }
}

OutputDirectory::~OutputDirectory() {
  lock_.reset();  // its file removed
  if (!created_.empty()) remove_if_empty(dir_, created_);
}

}  // namespace attnres
