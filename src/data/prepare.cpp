#include "data/prepare.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/hash.hpp"
#include "data/parallel.hpp"
#include "data/progress.hpp"
#include "data/shard.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::data {
namespace fs = std::filesystem;
namespace {

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

struct DocResult {
  std::vector<std::int32_t> tokens;
  Split split = Split::kTrain;
  bool empty = false;
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
        Document doc = parse_record(batch[i], options.inputs[batch[i].source], options.fractions);
        DocResult& r = results[i];
        r.split = doc.split;
        r.empty = doc.empty;
        r.tokens.clear();
        if (doc.empty) return;
        r.tokens.reserve(doc.text.size() / 3 + 8);
        r.tokens.push_back(eot);  // every document starts with end-of-text
        tokenizer.encode_append(doc.text, r.tokens);
      });
      // Appending in input order keeps the shards independent of the thread count.
      for (DocResult& r : results) {
        if (r.empty) {
          ++summary.skipped_empty;
          continue;
        }
        const auto s = static_cast<std::size_t>(r.split);
        writers[s]->append(r.tokens);
        ++summary.documents[s];
        summary.tokens[s] += r.tokens.size();
        ++total_docs;
        total_tokens += r.tokens.size();
        std::vector<std::int32_t>().swap(r.tokens);  // do not keep a huge document's buffer
      }
      progress.update(reader.raw_bytes_read(), total_docs, total_tokens);
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
    }
    nlohmann::ordered_json manifest = {
        {"format", "attnres-token-shards"},
        {"format_version", kManifestVersion},
        {"tokenizer",
         {{"spec", tokenizer.spec()},
          {"hash", tokenizer.content_hash()},
          {"vocab_size", tokenizer.vocab_size()},
          {"eot_id", tokenizer.eot_id()}}},
        {"token_bytes", token_bytes_for_vocab(tokenizer.vocab_size())},
        {"shard_max_tokens", options.shard_tokens},
        {"checksum", "hash64 of each shard's payload bytes (docs/data.md)"},
        {"documents_start_with_eot", true},
        {"split",
         {{"rule", split_rule_text()},
          {"val_fraction", options.fractions.val},
          {"test_fraction", options.fractions.test}}},
        {"sources", std::move(sources)},
        {"skipped", {{"empty_documents", summary.skipped_empty}}},
        {"splits", std::move(splits)},
    };
    // Written last, atomically: its presence is what marks the directory as prepared.
    write_text_atomically((out / kManifestName).string(), manifest.dump(2) + "\n");

    summary.raw_bytes = reader.raw_bytes_read();
    summary.seconds = progress.seconds();
    std::string message = concat(
        "done: ", format_bytes(static_cast<double>(summary.raw_bytes)), ", ", total_docs, " documents, ", total_tokens,
        " tokens (train ", summary.tokens[0], ", val ", summary.tokens[1], ", test ", summary.tokens[2], ") in ");
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", summary.seconds);
    message += secs;
    message += " (" + format_count(static_cast<double>(total_tokens) / std::max(summary.seconds, 1e-9)) + " tokens/s)";
    if (summary.skipped_empty != 0) message += concat("; skipped ", summary.skipped_empty, " empty documents");
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
