// Checksums and finiteness end to end: a flipped byte in a weights file stops eval and sample,
// in every kept checkpoint --resume, with the file and tensor named; NaN weights or a NaN loss never
// print a result with exit 0; files written without checksums still load, with a notice.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>

#include "reliability/reliability_util.hpp"
#include "train/checkpoint.hpp"
#include "util/atomic_file.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;

namespace {

class Integrity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new TempDir("attnres_integrity_cli"); }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path run() { return TinyRun::get().run; }
  static const std::string& data() { return TinyRun::get().data; }

  // A copy of `from` with one bit flipped `from_end` bytes before its end (in the last tensor).
  static std::string flipped_copy(const fs::path& from, const std::string& name, std::size_t from_end) {
    std::string bytes = read_file(from);
    bytes[bytes.size() - from_end] ^= 0x04;
    const std::string out = dir_->str(name);
    std::ofstream(out, std::ios::binary) << bytes;
    return out;
  }
  // A copy of the run's weights, rewritten with every value changed by `f` (valid checksums).
  static std::string rewritten_weights(const std::string& name, float (*f)(float)) {
    SafetensorsFile w = read_safetensors((run() / "model.safetensors").string());
    std::vector<TensorRef> refs;
    for (auto& [tensor, t] : w.tensors) {
      for (std::size_t i = 0; i + 4 <= t.bytes.size(); i += 4) {
        float v;
        std::memcpy(&v, t.bytes.data() + i, 4);
        v = f(v);
        std::memcpy(t.bytes.data() + i, &v, 4);
      }
      refs.push_back({tensor, t.dtype, t.shape, t.bytes.data()});
    }
    const std::string out = dir_->str(name);
    write_safetensors(out, w.metadata, refs);
    return out;
  }
  static std::string eval(const std::string& weights) {
    return "eval --checkpoint " + weights + " --data " + data() + " --max-tokens 256";
  }
  static TempDir* dir_;
};
TempDir* Integrity::dir_ = nullptr;

}  // namespace

TEST_F(Integrity, AFlippedByteStopsEvalAndSampleNamingFileAndTensor) {
  ASSERT_EQ(run_cli(eval((run() / "model.safetensors").string())).exit_code, 0);
  const std::string bad = flipped_copy(run() / "model.safetensors", "flipped.safetensors", 3);
  for (const std::string& cmd : {eval(bad), "sample --checkpoint " + bad + " --prompt the --max-tokens 4"}) {
    const CliResult r = run_cli(cmd);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(bad), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("does not match its checksum"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("nll"), std::string::npos) << r.output;
  }
}

TEST_F(Integrity, AFlippedByteInEveryCheckpointStopsResumeNamingEachFileAndTensor) {
  TempDir runs("attnres_flipped_ckpt");
  const fs::path copy = runs.path() / "run";
  fs::copy(run(), copy);
  // The last tensor of a checkpoint is adam.v (file order: params, adam.m, adam.v). A flip in
  // only the newest makes --resume take the one before (tests/reliability/test_checkpoints.cpp).
  std::map<std::string, std::string> bad;
  for (const CheckpointFile& c : list_checkpoints(copy.string())) {
    std::string bytes = read_file(c.path);
    bytes[bytes.size() - 5] ^= 0x01;
    std::ofstream(c.path, std::ios::binary) << bytes;
    bad[c.path] = bytes;
  }
  ASSERT_EQ(bad.size(), 2u);
  fs::remove(copy / "train_result.json");  // unfinished: --resume reads the checkpoints
  const CliResult r = run_cli(TinyRun::get().train(copy) + " --resume");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  for (const auto& [path, bytes] : bad) {
    EXPECT_NE(r.output.find("'" + path + "': tensor 'adam.v' does not match its checksum"), std::string::npos)
        << r.output;
    EXPECT_EQ(read_file(path), bytes);  // nothing written over it
  }
}

TEST_F(Integrity, NonFiniteWeightsOrLossesAreErrorsNotResults) {
  const std::string nan = rewritten_weights("nan.safetensors", [](float v) {
    return v == v ? std::numeric_limits<float>::quiet_NaN() : v;
  });
  CliResult r = run_cli(eval(nan));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(nan), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("holds a NaN"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nll"), std::string::npos) << r.output;

  // Finite weights so large that the loss overflows: the evaluation itself refuses the result.
  const std::string huge = rewritten_weights("huge.safetensors", [](float v) { return v * 3e37f; });
  r = run_cli(eval(huge) + " --json");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("not usable"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("\"nll\""), std::string::npos) << r.output;

  // Nothing to score is an error too, not "nll nan": a text of blanks, or an empty file (which
  // --text, reading inputs as prepare does, refuses as such).
  const std::string blank = dir_->str("blank.txt");
  std::ofstream(blank) << " \n\n";
  r = run_cli("eval --checkpoint " + (run() / "model.safetensors").string() + " --text " + blank);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("nothing to score"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
  const std::string empty = dir_->str("empty.txt");
  std::ofstream(empty).flush();
  r = run_cli("eval --checkpoint " + (run() / "model.safetensors").string() + " --text " + empty);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(empty + ": empty input"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nan"), std::string::npos) << r.output;
}

TEST_F(Integrity, CheckpointsWithNonFiniteMomentsAreRefused) {
  TempDir runs("attnres_nan_moments");
  const fs::path copy = runs.path() / "run";
  fs::copy(run(), copy);
  const std::string ckpt = newest_checkpoint(copy).string();
  SafetensorsFile f = read_safetensors(ckpt);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(f.tensors.at("adam.m").bytes.data() + 8, &inf, 4);
  std::vector<TensorRef> refs;
  for (const auto& [name, t] : f.tensors) refs.push_back({name, t.dtype, t.shape, t.bytes.data()});
  write_safetensors(ckpt, f.metadata, refs);
  fs::remove(copy / "train_result.json");  // unfinished: --resume reads the checkpoint
  // Skipped, naming the file, tensor and element: the run resumes from the checkpoint before.
  const CliResult r = run_cli(TinyRun::get().train(copy) + " --resume");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skipping checkpoint '" + ckpt + "' (it does not verify): '" + ckpt +
                          "': tensor 'adam.m' holds an infinity (element 2 of"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("at step 6/8"), std::string::npos) << r.output;
  expect_same_weights(run() / "model.safetensors", copy / "model.safetensors");
}

TEST_F(Integrity, FilesWithoutChecksumsStillLoadWithANotice) {
  // As written before checksums existed: the same header without the attnres.checksum entry.
  const std::string bytes = read_file(run() / "model.safetensors");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  header["__metadata__"].erase(kChecksumKey);
  std::string text = header.dump();
  while (text.size() % 8 != 0) text.push_back(' ');
  const std::uint64_t size = text.size();
  const std::string old = dir_->str("old.safetensors");
  std::ofstream(old, std::ios::binary) << std::string(reinterpret_cast<const char*>(&size), 8) << text
                                       << bytes.substr(8 + n);
  const CliResult r = run_cli(eval(old) + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("'" + old + "' carries no payload checksum"), std::string::npos) << r.output;
  const auto notice = r.output.find("no payload checksum");
  EXPECT_EQ(r.output.find("no payload checksum", notice + 1), std::string::npos) << "one notice, not one per read";
  // The same score as the checksummed original.
  const CliResult original = run_cli(eval((run() / "model.safetensors").string()) + " --json");
  EXPECT_EQ(r.output.substr(r.output.find('\n') + 1), original.output) << r.output;
}
