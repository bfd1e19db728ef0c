#include "data/prepare.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/hash.hpp"
#include "data/parallel.hpp"
#include "data/progress.hpp"
#include "data/shard.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"
#include "util/paths.hpp"
#include "util/text.hpp"

namespace attnres::data {

std::string manifest_path(const std::string& dir) {
  std::error_code ec;
  require(std::filesystem::exists(dir, ec), "prepared dataset '", dir, "' does not exist (make it with 'attnres prepare ",
          "--out ", shell_quote(dir), "')");
  require_path_kind(dir, PathKind::kDirectory, "prepared dataset",
                    concat("give the directory holding ", kManifestName, " (written by 'attnres prepare')"));
  const std::string path = (std::filesystem::path(dir) / kManifestName).string();
  require(std::filesystem::is_regular_file(path), "'", dir, "' is not a prepared dataset: no ", kManifestName,
          " (run 'attnres prepare', or it did not finish)");
  return path;
}

namespace fs = std::filesystem;
namespace {

// "12.3 MB" of text; with gzip-compressed inputs also what was read: "12.3 MB of text (4.1 MB
// compressed)".
std::string read_size(const PrepareSummary& s) {
  const std::string text = format_bytes(static_cast<double>(s.text_bytes));
  if (s.text_bytes == s.raw_bytes) return text;
  return concat(text, " of text (", format_bytes(static_cast<double>(s.raw_bytes)), " compressed)");
}

void clear_previous_output(const fs::path& dir) {
  std::error_code ec;
  fs::remove(dir / kManifestName, ec);
  require(!ec, "cannot remove '", (dir / kManifestName).string(), "': ", ec.message());
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    bool ours = is_shard_file_name(name);
    if (!ours && name.starts_with(".")) {
      const std::size_t tmp = name.find(".tmp.");
      ours = tmp != std::string::npos && is_shard_file_name(name.substr(1, tmp - 1));
    }
    if (ours) {
      fs::remove(entry.path(), ec);
      require(!ec, "cannot remove old shard '", entry.path().string(), "': ", ec.message());
    }
  }
}

// A document's segments, each as [eot, tokens...]: a cut document's runs of consecutive pieces of
// one split are separate documents of that split.
struct DocResult {
  std::vector<std::pair<Split, std::vector<std::int32_t>>> parts;
  bool empty = false;
  bool cut = false;
  std::size_t short_piece_bytes = 0;  // cut as a corpus's one text of at most kLongDocumentBytes
};

}  // namespace

void begin_output_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  require(!ec && fs::is_directory(dir), "cannot create output directory '", dir, "'",
          ec ? ": " + ec.message() : std::string());
  clear_previous_output(dir);
}

PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer) {
  options.fractions.validate();
  require(!options.inputs.empty(), "no input files");
  require(options.shard_tokens > 0, "--shard-tokens must be positive");
  require(!options.out_dir.empty(), "no output directory");
  const fs::path out(options.out_dir);
  begin_output_dir(options.out_dir);
  const SplitFractions fractions = split_for_corpus(options.fractions, options.inputs);

  try {
    std::vector<std::unique_ptr<ShardWriter>> writers;
    for (int s = 0; s < kNumSplits; ++s)
      writers.push_back(std::make_unique<ShardWriter>(out.string(), split_name(static_cast<Split>(s)),
                                                      tokenizer.vocab_size(), options.shard_tokens));
    PrepareSummary summary;
    CorpusReader reader(options.inputs);
    Progress progress("prepare", options.progress);
    const std::int32_t eot = tokenizer.eot_id();
    std::vector<RawRecord> batch;
    std::vector<DocResult> results;
    std::uint64_t total_docs = 0, total_tokens = 0;
    while (reader.next_batch(batch, options.batch_bytes)) {
      results.resize(batch.size());
      parallel_for_each(batch.size(), [&](std::size_t i) {
        Document doc = parse_record(batch[i], options.inputs[batch[i].source], fractions);
        DocResult& r = results[i];
        r.empty = doc.empty;
        r.cut = doc.segments.size() > 1 || doc.text.size() > kLongDocumentBytes;
        r.short_piece_bytes =
            r.cut && doc.text.size() <= kLongDocumentBytes ? split_piece_bytes(doc.text.size(), fractions) : 0;
        r.parts.clear();
        if (doc.empty) return;
        for (const Segment& segment : doc.segments) {
          const std::string_view text = doc.segment_text(segment);
          std::vector<std::int32_t> tokens;
          tokens.reserve(text.size() / 3 + 8);
          tokens.push_back(eot);  // every document starts with end-of-text
          tokenizer.encode_append(text, tokens);
          r.parts.emplace_back(segment.split, std::move(tokens));
        }
      });
      // Appending in input order keeps the shards independent of the thread count.
      for (DocResult& r : results) {
        if (r.empty) {
          ++summary.skipped_empty;
          continue;
        }
        summary.cut_documents += r.cut;
        if (r.short_piece_bytes != 0) summary.single_text_piece_bytes = r.short_piece_bytes;
        ++total_docs;
        for (auto& [split, tokens] : r.parts) {
          const auto s = static_cast<std::size_t>(split);
          writers[s]->append(tokens);
          ++summary.documents[s];
          summary.tokens[s] += tokens.size();
          total_tokens += tokens.size();
        }
        r.parts.clear();  // do not keep a huge document's buffers
      }
      progress.update(reader.text_bytes_read(), total_docs, total_tokens);
    }
    require(total_docs > 0, "the inputs hold no non-empty documents (", summary.skipped_empty, " empty ones skipped)");

    nlohmann::ordered_json splits = nlohmann::ordered_json::object();
    for (int s = 0; s < kNumSplits; ++s) {
      const std::vector<ShardInfo> shards = writers[static_cast<std::size_t>(s)]->finish();
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const ShardInfo& info : shards) {
        list.push_back({{"file", info.file}, {"tokens", info.tokens}, {"bytes", info.bytes},
                        {"checksum", hex64(info.checksum)}});
      }
      splits[split_name(static_cast<Split>(s))] = {{"documents", summary.documents[s]},
                                                   {"tokens", summary.tokens[s]},
                                                   {"shards", std::move(list)}};
    }
    nlohmann::ordered_json sources = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < options.inputs.size(); ++i) {
      const SourceStats& st = reader.stats()[i];
      sources.push_back({{"path", options.inputs[i].path},
                         {"bytes", st.bytes},
                         {"hash", hex64(st.hash)},
                         {"records", st.records}});
      if (options.inputs[i].format == InputFormat::kJsonl) sources.back()["text_field"] = options.inputs[i].text_field;
    }
    nlohmann::ordered_json split = {{"rule", split_rule_text(summary.single_text_piece_bytes)},
                                    {"val_fraction", options.fractions.val},
                                    {"test_fraction", options.fractions.test},
                                    {"long_document_bytes", kLongDocumentBytes},
                                    {"piece_bytes", kPieceBytes},
                                    {"cut_documents", summary.cut_documents}};
    // Only when the rule for a single short text cut it: the manifests of every other corpus are
    // what they were before that rule.
    if (summary.single_text_piece_bytes != 0) split["single_text_piece_bytes"] = summary.single_text_piece_bytes;
    nlohmann::ordered_json manifest = {
        {"format", "attnres-token-shards"},
        {"format_version", kManifestVersion},
        // Named relative to this directory (so it can be moved with the tokenizer inside), with the
        // absolute spec as a fallback; matched by content hash wherever the files are.
        {"tokenizer",
         {{"spec", spec_relative_to(tokenizer.spec(), options.out_dir)},
          {"spec_when_prepared", tokenizer.spec()},
          {"hash", tokenizer.content_hash()},
          {"hash_algorithm", kChecksumAlgorithm},
          {"vocab_size", tokenizer.vocab_size()},
          {"eot_id", tokenizer.eot_id()}}},
        {"token_bytes", token_bytes_for_vocab(tokenizer.vocab_size())},
        {"shard_max_tokens", options.shard_tokens},
        {"checksum", "hash64 of each shard's payload bytes (docs/data.md)"},
        {"documents_start_with_eot", true},
        {"split", std::move(split)},
        {"sources", std::move(sources)},
        {"skipped", {{"empty_documents", summary.skipped_empty}}},
        {"splits", std::move(splits)},
    };
    // Written last, atomically: its presence is what marks the directory as prepared.
    write_text_atomically((out / kManifestName).string(), manifest.dump(2) + "\n");

    summary.raw_bytes = reader.raw_bytes_read();
    summary.text_bytes = reader.text_bytes_read();
    summary.seconds = progress.seconds();
    std::string message = concat(
        "done: ", read_size(summary), ", ", counted(total_docs, "document"), ", ", counted(total_tokens, "token"),
        " (train ", summary.tokens[0], ", val ", summary.tokens[1], ", test ", summary.tokens[2], ") in ");
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", summary.seconds);
    message += secs;
    message += " (" + format_count(static_cast<double>(total_tokens) / std::max(summary.seconds, 1e-9)) + " tokens/s)";
    if (summary.single_text_piece_bytes != 0)
      message += concat("; its one text cut into pieces of at most ", summary.single_text_piece_bytes,
                        " bytes for the split");
    else if (summary.cut_documents != 0)
      message += concat("; ", counted(summary.cut_documents, "document"), " over ",
                        format_bytes(static_cast<double>(kLongDocumentBytes)), " cut into pieces for the split");
    if (summary.skipped_empty != 0) message += concat("; skipped ", counted(summary.skipped_empty, "empty document"));
    progress.finish(message);
    return summary;
  } catch (...) {
    // The writers are gone (their temporaries removed); drop the shards this run completed too.
    try {
      clear_previous_output(out);
    } catch (...) {
    }
    throw;
  }
}

}  // namespace attnres::data
