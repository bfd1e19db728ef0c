// Helpers shared by the data tests: scratch directories, files, gzip, and running the CLI.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace attnres::data::testing {

namespace fs = std::filesystem;

inline std::string shared_data() { return ATTNRES_SHARED_DATA; }
inline std::string gpt2_dir() { return shared_data() + "/tokenizers/gpt2"; }
inline bool have_gpt2() { return fs::exists(gpt2_dir() + "/encoder.json") && fs::exists(gpt2_dir() + "/vocab.bpe"); }
inline bool have_corpus() { return fs::is_directory(shared_data() + "/corpus/openstax"); }

#define ATTNRES_REQUIRE_GPT2()                                                                            \
  do {                                                                                                    \
    if (!::attnres::data::testing::have_gpt2())                                                           \
      GTEST_SKIP() << "shared data absent: no GPT-2 tokenizer under " << ::attnres::data::testing::gpt2_dir(); \
  } while (0)

#define ATTNRES_REQUIRE_CORPUS()                                                                         \
  do {                                                                                                   \
    if (!::attnres::data::testing::have_corpus())                                                        \
      GTEST_SKIP() << "shared data absent: no corpus under " << ::attnres::data::testing::shared_data(); \
  } while (0)

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "attnres_data_test_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) throw std::runtime_error("cannot write " + path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `bytes` gzip-compressed (one member per call; append=true adds another member).
inline void write_gzip(const std::string& path, const std::string& bytes, bool append = false) {
  fs::create_directories(fs::path(path).parent_path());
  gzFile f = gzopen(path.c_str(), append ? "ab" : "wb");
  if (!f) throw std::runtime_error("gzopen " + path);
  if (!bytes.empty()) gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs the attnres binary with `args` (a shell fragment), capturing stdout and stderr.
inline CliResult run_cli(const std::string& args, const std::string& env = "") {
  TempDir tmp;
  const std::string out = tmp / "stdout", err = tmp / "stderr";
  const std::string command = env + " '" + std::string(ATTNRES_BINARY) + "' " + args + " >'" + out + "' 2>'" + err + "'";
  const int status = std::system(command.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

inline std::string quote(const std::string& s) { return "'" + s + "'"; }

}  // namespace attnres::data::testing
