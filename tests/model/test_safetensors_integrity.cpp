// Integrity of safetensors files: per-tensor and metadata digests written and verified, the first
// corrupt tensor named, files without digests still loading with a notice, non-finite weights
// refused, and headers whose tensors overlap, leave holes or overflow refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/model_util.hpp"
#include "model/model.hpp"
#include "model/safetensors.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"

using namespace attnres;
using namespace attnres::testing;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class SafetensorsIntegrity : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("attnres_integrity_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    model_.emplace(config_, 1, 4, false);
    randomize_weights(*model_, 5);
    path_ = (dir_ / "w.safetensors").string();
    save_weights<float>(path_, config_, model_->layout(), model_->params(), {{"step", "12"}});
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  std::string load_error(const std::string& path) {
    Model<float> m(config_, 1, 4, false);
    return error_of([&] { load_weights<float>(path, config_, m.layout(), m.params()); });
  }
  // The header of a file as JSON, and where its payload starts.
  static std::pair<json, std::size_t> header_of(const std::string& bytes) {
    std::uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    return {json::parse(bytes.substr(8, n)), 8 + n};
  }
  static std::string with_header(const json& header, std::string_view payload) {
    std::string text = header.dump();
    while (text.size() % 8 != 0) text.push_back(' ');
    const std::uint64_t n = text.size();
    std::string out(reinterpret_cast<const char*>(&n), 8);
    return out + text + std::string(payload);
  }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

  ModelConfig config_ = tiny_config(ResidualMode::rd);
  std::optional<Model<float>> model_;
  fs::path dir_;
  std::string path_;
};

}  // namespace

TEST(Checksum, IsXxh3OfTheBytes) {
  // Known answers of XXH3-64 (seed 0), as published with the reference implementation.
  EXPECT_EQ(checksum64("", 0), 0x2D06800538D394C2ULL);
  EXPECT_EQ(checksum_hex(0x2D06800538D394C2ULL), "2d06800538d394c2");
  EXPECT_NE(checksum64("a"), checksum64("b"));
}

TEST_F(SafetensorsIntegrity, EveryTensorAndTheMetadataCarryADigestOthersCanCheck) {
  const std::string bytes = read_text_file(path_);
  const auto [header, start] = header_of(bytes);
  const json meta = header.at("__metadata__");
  const json sums = json::parse(meta.at(kChecksumKey).get<std::string>());
  EXPECT_EQ(sums.at("algorithm"), "xxh3-64");
  std::size_t tensors = 0;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto begin = entry.at("data_offsets")[0].get<std::size_t>();
    const auto end = entry.at("data_offsets")[1].get<std::size_t>();
    EXPECT_EQ(sums.at("tensors").at(name), checksum_hex(checksum64(bytes.data() + start + begin, end - begin))) << name;
    ++tensors;
  }
  EXPECT_EQ(sums.at("tensors").size(), tensors);
  json rest = meta;
  rest.erase(kChecksumKey);
  EXPECT_EQ(sums.at("metadata"), checksum_hex(checksum64(rest.dump())));  // compact JSON, keys sorted
  const SafetensorsFile f = read_safetensors(path_);
  EXPECT_TRUE(f.checksummed);
  EXPECT_EQ(f.metadata.count(kChecksumKey), 0u);
}

TEST_F(SafetensorsIntegrity, AFlippedPayloadByteNamesTheFileAndTheFirstBadTensor) {
  const std::string bytes = read_text_file(path_);
  const auto [header, start] = header_of(bytes);
  std::vector<std::pair<std::size_t, std::string>> order;
  for (const auto& [name, entry] : header.items())
    if (name != "__metadata__") order.emplace_back(entry.at("data_offsets")[0].get<std::size_t>(), name);
  std::sort(order.begin(), order.end());
  ASSERT_GE(order.size(), 4u);
  for (const std::size_t k : {std::size_t(0), order.size() / 2, order.size() - 1}) {
    std::string bad = bytes;
    bad[start + order[k].first + 1] ^= 0x10;  // one bit of the tensor's second byte
    if (k + 1 < order.size()) bad[start + order.back().first] ^= 0x01;  // and a later tensor too
    const std::string p = write("flipped.safetensors", bad);
    const std::string msg = load_error(p);
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor '" + order[k].second + "' does not match its checksum"), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsIntegrity, AChangedMetadataValueIsCaught) {
  std::string bytes = read_text_file(path_);
  const std::size_t at = bytes.find("\"step\":\"12\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 9] = '3';  // step 13: still valid JSON, still the same size
  const std::string p = write("meta.safetensors", bytes);
  const std::string msg = error_of([&] { read_safetensors(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("metadata does not match its checksum"), std::string::npos) << msg;
}

TEST_F(SafetensorsIntegrity, BadChecksumRecordsAreErrors) {
  const std::string bytes = read_text_file(path_);
  // (Not a structured binding: clang 14 cannot capture one in the lambda below.)
  const auto parsed = header_of(bytes);
  const json& header = parsed.first;
  const std::string payload = bytes.substr(parsed.second);
  const json sums = json::parse(header["__metadata__"][kChecksumKey].get<std::string>());
  auto with_sums = [&](const json& s) {
    json h = header;
    h["__metadata__"][kChecksumKey] = s.dump();
    return write("sums.safetensors", with_header(h, payload));
  };
  json s = sums;
  s["algorithm"] = "md5";
  EXPECT_NE(error_of([&] { read_safetensors(with_sums(s)); }).find("algorithm 'md5' is not supported"),
            std::string::npos);
  s = sums;
  s["tensors"].erase("tok_emb.weight");
  EXPECT_NE(error_of([&] { read_safetensors(with_sums(s)); }).find("no valid digest for tensor 'tok_emb.weight'"),
            std::string::npos);
  s = sums;
  s["tensors"]["ghost"] = "0000000000000000";
  EXPECT_NE(error_of([&] { read_safetensors(with_sums(s)); }).find("names tensor 'ghost'"), std::string::npos);
  json h = header;
  h["__metadata__"][kChecksumKey] = "{not json";
  const std::string p = write("sums.safetensors", with_header(h, payload));
  EXPECT_NE(error_of([&] { read_safetensors(p); }).find("corrupt 'attnres.checksum'"), std::string::npos);
}

TEST_F(SafetensorsIntegrity, FilesWithoutDigestsLoadWithANotice) {
  const std::string bytes = read_text_file(path_);
  auto [header, start] = header_of(bytes);
  header["__metadata__"].erase(kChecksumKey);
  const std::string p = write("old.safetensors", with_header(header, bytes.substr(start)));
  ::testing::internal::CaptureStderr();
  Model<float> m(config_, 1, 4, false);
  load_weights<float>(p, config_, m.layout(), m.params());
  const std::string notice = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(std::equal(m.params().begin(), m.params().end(), model_->params().begin()));
  EXPECT_NE(notice.find(p), std::string::npos) << notice;
  EXPECT_NE(notice.find("no payload checksum"), std::string::npos) << notice;
  EXPECT_EQ(std::count(notice.begin(), notice.end(), '\n'), 1);
  EXPECT_FALSE(parse_safetensors(read_text_file(p), p).checksummed);
}

TEST_F(SafetensorsIntegrity, NonFiniteWeightsAreRefusedWithTheTensorName) {
  const auto& p = model_->layout().params()[2];
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    std::vector<float> params(model_->params().begin(), model_->params().end());
    params[static_cast<std::size_t>(p.offset + 3)] = bad;
    const std::string out = (dir_ / "nan.safetensors").string();
    save_weights<float>(out, config_, model_->layout(), params);  // valid digests: the values are the fault
    const std::string msg = load_error(out);
    EXPECT_NE(msg.find(out), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor '" + p.name + "' holds " + (std::isnan(bad) ? "a NaN" : "an infinity") +
                       " (element 3 of "),
              std::string::npos)
        << msg;
  }
}

TEST_F(SafetensorsIntegrity, TensorsMustTileThePayloadAndFitInMemory) {
  const std::string payload(16, '\0');
  auto entry = [](std::uint64_t a, std::uint64_t b, json shape) {
    return json{{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {a, b}}};
  };
  const std::string overlap = write("overlap.safetensors",
                                    with_header({{"a", entry(0, 8, {2})}, {"b", entry(4, 12, {2})}, {"c", entry(12, 16, {1})}}, payload));
  EXPECT_NE(error_of([&] { read_safetensors(overlap); }).find("overlaps another tensor"), std::string::npos);
  const std::string hole =
      write("hole.safetensors", with_header({{"a", entry(0, 4, {1})}, {"b", entry(8, 16, {2})}}, payload));
  EXPECT_NE(error_of([&] { read_safetensors(hole); }).find("leaves a hole"), std::string::npos);
  const std::string huge = write(
      "huge.safetensors",
      with_header({{"a", entry(0, 16, {std::int64_t(1) << 40, std::int64_t(1) << 40, 4})}}, payload));
  EXPECT_NE(error_of([&] { read_safetensors(huge); }).find("impossibly large"), std::string::npos);
  const std::string not_object = write("entry.safetensors", with_header({{"a", json::array({1, 2})}}, payload));
  EXPECT_NE(error_of([&] { read_safetensors(not_object); }).find("not an object"), std::string::npos);
}
