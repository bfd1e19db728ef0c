#include "data/tokenizer_train.hpp"

#include <algorithm>

#include "data/hash.hpp"
#include "data/parallel.hpp"
#include "data/progress.hpp"
#include "data/sp_tokenizer.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"
#include "util/text.hpp"

namespace attnres::data {
namespace {

constexpr std::uint64_t kSentenceSeed = 0x73656e74656e6365ULL;  // separate from the split hash

struct Sentence {
  std::uint64_t hash;
  std::uint64_t ordinal;
  std::string text;
  bool operator<(const Sentence& o) const { return hash != o.hash ? hash < o.hash : ordinal < o.ordinal; }
};

}  // namespace

SpTrainSummary train_sp_tokenizer(const std::vector<InputFile>& inputs, const std::string& out_file,
                                  const SpTrainOptions& options) {
  options.fractions.validate();
  require(!inputs.empty(), "no input files");
  require(options.vocab_size >= kMinSpVocab, "--vocab-size must be at least ", kMinSpVocab, ", got ", options.vocab_size);
  require(options.max_sentences > 0, "--max-sentences must be positive");
  require(!out_file.empty(), "no output file");

  // The split prepare makes of these inputs, so no val or test text shapes the vocabulary.
  const SplitFractions fractions = split_for_corpus(options.fractions, inputs);
  SpTrainSummary summary;
  Progress progress("tokenizer train", options.progress, "training documents");
  CorpusReader reader(inputs);
  std::vector<RawRecord> batch;
  struct DocLines {
    std::vector<std::string> lines;
    std::vector<std::uint64_t> hashes;
    bool train = false;
  };
  std::vector<DocLines> results;
  // A max-heap of the kept sentences: the front is the first to drop when a smaller hash arrives.
  std::vector<Sentence> kept;
  const auto limit = static_cast<std::size_t>(options.max_sentences);
  while (reader.next_batch(batch, options.batch_bytes)) {
    results.resize(batch.size());
    parallel_for_each(batch.size(), [&](std::size_t i) {
      const Document doc = parse_record(batch[i], inputs[batch[i].source], fractions);
      DocLines& r = results[i];
      r.lines.clear();
      r.hashes.clear();
      r.train = false;
      if (doc.empty) return;
      for (const Segment& segment : doc.segments) {
        if (segment.split != Split::kTrain) continue;
        r.train = true;
        std::string_view text = doc.segment_text(segment);
        while (!text.empty()) {
          const std::size_t nl = text.find('\n');
          std::string_view line = text.substr(0, nl);
          text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
          if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
          if (line.size() > kMaxSentenceBytes || line.find_first_not_of(" \t\f\v") == std::string_view::npos)
            continue;
          r.lines.emplace_back(line);
          r.hashes.push_back(hash64(line, kSentenceSeed));
        }
      }
    });
    for (DocLines& r : results) {
      if (!r.train) continue;
      ++summary.documents;
      for (std::size_t k = 0; k < r.lines.size(); ++k) {
        Sentence s{r.hashes[k], summary.sentences++, std::move(r.lines[k])};
        if (kept.size() < limit) {
          kept.push_back(std::move(s));
          std::push_heap(kept.begin(), kept.end());
        } else if (s < kept.front()) {
          std::pop_heap(kept.begin(), kept.end());
          kept.back() = std::move(s);
          std::push_heap(kept.begin(), kept.end());
        }
      }
    }
    progress.update(reader.text_bytes_read(), summary.documents, 0);
  }
  require(summary.sentences > 0, "no training text: the training split of the inputs is empty");

  std::sort(kept.begin(), kept.end(), [](const Sentence& a, const Sentence& b) { return a.ordinal < b.ordinal; });
  std::vector<std::string> sentences;
  sentences.reserve(kept.size());
  for (Sentence& s : kept) sentences.push_back(std::move(s.text));
  kept.clear();
  summary.sentences_used = sentences.size();
  if (options.progress)
    progress.finish(concat("training a ", options.vocab_size, "-piece BPE model on ", summary.sentences_used, " of ",
                           counted(summary.sentences, "line"), " from ", counted(summary.documents, "training document")));

  const std::string model = train_sentencepiece(sentences, options.vocab_size);
  write_file_atomically(out_file, [&](std::FILE* f) { write_bytes(f, model.data(), model.size(), out_file); });
  SpTokenizer check(out_file, "sp:" + out_file);  // fails loudly if the model is unusable
  summary.seconds = progress.seconds();
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", summary.seconds);
  progress.finish(concat("wrote ", out_file, " (", check.vocab_size(), " pieces) in ", secs));
  return summary;
}

}  // namespace attnres::data
