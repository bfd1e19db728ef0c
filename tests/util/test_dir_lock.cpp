// util/dir_lock: one writer per directory, and a command's --out directory.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "util/dir_lock.hpp"
#include "util/error.hpp"

namespace attnres {
namespace {

namespace fs = std::filesystem;

class TempPath {
 public:
  explicit TempPath(const std::string& name)
      : path_(fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path_);
  }
  ~TempPath() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DirLock, OneHolderAtATimeNamedWhenRefused) {
  TempPath dir("attnres_dir_lock");
  fs::create_directories(dir.path());
  const fs::path file = dir.path() / ".lock";
  {
    const DirLock held(dir.path().string(), ".lock", "try later");
    EXPECT_TRUE(held.locked());
    EXPECT_EQ(lock_holder(file.string()), ::getpid());
    // flock locks belong to an open file: a second open in the same process is refused as well.
    const std::string e = error_of([&] { DirLock second(dir.path().string(), ".lock", "try later"); });
    EXPECT_NE(e.find("is in use by process " + std::to_string(::getpid())), std::string::npos) << e;
    EXPECT_NE(e.find("; try later"), std::string::npos) << e;
  }
  EXPECT_FALSE(fs::exists(file)) << "removed by its holder";
  std::ofstream(file) << "12345\n";  // left by a process that is gone: no obstacle
  const DirLock again(dir.path().string(), ".lock", "");
  EXPECT_EQ(lock_holder(file.string()), ::getpid());
}

OutputKind kind_of_runs() {
  OutputKind kind;
  kind.what = "run directory";
  kind.lock_name = ".lock";
  kind.recognised = [](const fs::path& dir) { return fs::exists(dir / "config.toml"); };
  kind.holds = "config.toml";
  return kind;
}

TEST(OutputDirectory, CreatesRefusesForeignAndRemovesWhatItLeftEmpty) {
  TempPath root("attnres_output_dir");
  const fs::path out = root.path() / "a" / "b";
  { const OutputDirectory claimed(out.string(), kind_of_runs()); EXPECT_TRUE(fs::exists(out / ".lock")); }
  EXPECT_FALSE(fs::exists(root.path())) << "created by it, left empty: removed with the parents it created";
  {
    const OutputDirectory claimed(out.string(), kind_of_runs());
    std::ofstream(out / "config.toml") << "x";
  }
  EXPECT_TRUE(fs::exists(out / "config.toml")) << "what was written stays";
  EXPECT_FALSE(fs::exists(out / ".lock"));
  std::ofstream(out / "notes.txt") << "x";
  EXPECT_NO_THROW(OutputDirectory(out.string(), kind_of_runs()));  // recognised: other files may be there too
  const fs::path foreign = root.path() / "corpus";
  fs::create_directories(foreign);
  std::ofstream(foreign / "a.txt") << "x";
  const std::string e = error_of([&] { OutputDirectory(foreign.string(), kind_of_runs()); });
  EXPECT_NE(e.find("is not empty and is not an attnres run directory: it holds a.txt"), std::string::npos) << e;
  EXPECT_EQ(fs::directory_iterator(foreign)->path().filename(), "a.txt");
}

}  // namespace
}  // namespace attnres
