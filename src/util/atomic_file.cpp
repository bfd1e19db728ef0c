#include "util/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "util/error.hpp"

namespace attnres {

void write_bytes(std::FILE* file, const void* data, std::size_t size, const std::string& path) {
  if (size != 0 && std::fwrite(data, 1, size, file) != size)
    fail("cannot write '", path, "': ", std::strerror(errno));
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& write) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  std::FILE* file = std::fopen(tmp.c_str(), "wb");
  if (!file) fail("cannot create '", tmp, "': ", std::strerror(errno));
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
  if (std::fflush(file) != 0 || ::fsync(::fileno(file)) != 0) {
    const int err = errno;
    std::fclose(file);
    std::remove(tmp.c_str());
    fail("cannot write '", path, "': ", std::strerror(err));
  }
  if (std::fclose(file) != 0) {
    std::remove(tmp.c_str());
    fail("cannot close '", path, "': ", std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
  // Make the rename itself durable.
  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_text_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, [&](std::FILE* f) { write_bytes(f, text.data(), text.size(), path); });
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) fail("cannot read '", path, "'");
  return out.str();
}

}  // namespace attnres
