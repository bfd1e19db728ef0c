#include "data/tokenizer.hpp"

#include <filesystem>

#include "data/gpt2_tokenizer.hpp"
#include "data/hash.hpp"
#include "data/sp_tokenizer.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"
#include "util/suggest.hpp"

namespace attnres::data {
namespace {

class BytesTokenizer final : public Tokenizer {
 public:
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> out;
    encode_append(text, out);
    return out;
  }
  void encode_append(std::string_view text, std::vector<std::int32_t>& out) const override {
    out.reserve(out.size() + text.size());
    for (const char c : text) out.push_back(static_cast<unsigned char>(c));
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (const std::int32_t id : ids) {
      if (id == kEot) {
        text += kEndOfText;
        continue;
      }
      require(id >= 0 && id < kEot, "token id ", id, " is outside the bytes vocabulary (257)");
      text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    }
    return text;
  }
  int vocab_size() const override { return 257; }
  std::int32_t eot_id() const override { return kEot; }
  const std::string& spec() const override { return spec_; }
  // No files: the hash names the fixed scheme, so it still changes if the scheme ever does.
  std::string content_hash() const override { return checksum_hex(checksum64(kScheme)); }
  std::string legacy_content_hash() const override { return hex64(hash64(kScheme)); }

 private:
  static constexpr std::int32_t kEot = 256;
  static constexpr std::string_view kScheme = "attnres bytes tokenizer v1";
  std::string spec_ = "bytes";
};

// "gpt2:rel/dir/" -> "/abs/rel/dir": a spec means the same whatever the working directory.
std::string absolute_path(const std::string& spec, std::string_view path) {
  require(!path.empty(), "tokenizer spec '", spec, "' names no path");
  std::filesystem::path p = std::filesystem::absolute(std::filesystem::path(path)).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// "; did you mean ...?" for an unknown spec: a misspelt kind ('spp:tok.model', 'byte'), or a bare
// path of an existing tokenizer (a file: sp:, a directory: gpt2:).
std::string spec_suggestion(const std::string& spec) {
  const std::size_t colon = spec.find(':');
  if (colon == std::string::npos && !spec.empty() && std::filesystem::exists(spec))
    return suggestion((std::filesystem::is_directory(spec) ? "gpt2:" : "sp:") + spec);
  const std::string kind = colon == std::string::npos ? spec : spec.substr(0, colon + 1);
  std::string guess = closest_name(kind, {"bytes", "gpt2:", "sp:"});
  if (guess.ends_with(':'))
    guess += colon != std::string::npos && colon + 1 < spec.size() ? spec.substr(colon + 1) : guess == "sp:" ? "FILE" : "DIR";
  return suggestion(guess);
}

}  // namespace

void Tokenizer::encode_append(std::string_view text, std::vector<std::int32_t>& out) const {
  const std::vector<std::int32_t> ids = encode(text);
  out.insert(out.end(), ids.begin(), ids.end());
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& spec) {
  if (spec == "bytes") return std::make_unique<BytesTokenizer>();
  if (spec.starts_with("gpt2:")) {
    const std::string dir = absolute_path(spec, std::string_view(spec).substr(5));
    return std::make_unique<Gpt2Tokenizer>(dir, "gpt2:" + dir);
  }
  if (spec.starts_with("sp:")) {
    const std::string file = absolute_path(spec, std::string_view(spec).substr(3));
    return std::make_unique<SpTokenizer>(file, "sp:" + file);
  }
  fail("unknown tokenizer spec '", spec, "' (expected 'bytes', 'gpt2:DIR' or 'sp:FILE')", spec_suggestion(spec));
}

namespace {

// "gpt2:" or "sp:" and the path after it; no prefix for a spec without a path ("bytes").
std::pair<std::string, std::string> spec_parts(const std::string& spec) {
  for (const char* prefix : {"gpt2:", "sp:"})
    if (spec.starts_with(prefix)) return {prefix, spec.substr(std::string_view(prefix).size())};
  return {"", ""};
}

}  // namespace

std::string spec_relative_to(const std::string& spec, const std::string& dir) {
  namespace fs = std::filesystem;
  const auto [prefix, path] = spec_parts(spec);
  if (prefix.empty()) return spec;
  const fs::path base = fs::absolute(dir).lexically_normal();
  const fs::path relative = fs::absolute(path).lexically_normal().lexically_relative(base);
  return relative.empty() ? spec : prefix + relative.string();
}

std::string spec_resolved_from(const std::string& spec, const std::string& dir) {
  namespace fs = std::filesystem;
  const auto [prefix, path] = spec_parts(spec);
  if (prefix.empty()) return spec;
  const fs::path p(path);
  return prefix + absolute_path(spec, (p.is_absolute() ? p : fs::path(dir) / p).lexically_normal().string());
}

}  // namespace attnres::data
