#include "fuzz/targets.hpp"

#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "data/corpus.hpp"
#include "data/gpt2_tokenizer.hpp"
#include "data/hash.hpp"
#include "data/loader.hpp"
#include "data/prepare.hpp"
#include "data/shard.hpp"
#include "data/tokenizer.hpp"
#include "analysis/summary.hpp"
#include "results/experiment_spec.hpp"
#include "results/run_result.hpp"
#include "results/summary.hpp"
#include "results/train_result.hpp"
#include "model/param_layout.hpp"
#include "model/safetensors.hpp"
#include "train/train_config.hpp"
#include "util/atomic_file.hpp"
#include "util/checksum.hpp"
#include "util/error.hpp"

namespace attnres::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One scratch directory per process for the parsers that read files.
const fs::path& scratch() {
  struct Dir {
    fs::path path = fs::temp_directory_path() / ("attnres_fuzz_" + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

void write_bytes_to(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + path.string());
}

std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

[[noreturn]] void oracle_failed(const std::string& what) { throw std::logic_error("fuzz oracle: " + what); }

// Runs `parse`; an attnres::Error must name `where`. Returns whether the input was accepted.
template <class F>
bool rejected_cleanly_or(const std::string& where, F&& parse) {
  try {
    parse();
    return true;
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (msg.find(where) == std::string::npos) oracle_failed("error does not name '" + where + "': " + msg);
    return false;
  }
}

// ---- safetensors ----------------------------------------------------------------------------

bool run_safetensors(const std::uint8_t* data, std::size_t size) {
  const std::string path = "fuzz.safetensors";
  return rejected_cleanly_or(path, [&] {
    const SafetensorsFile f = parse_safetensors(as_text(data, size), path);
    for (const auto& [name, t] : f.tensors) {
      require_finite(t, name, path);
      if (t.dtype == DType::F32 || t.dtype == DType::F64) (void)t.values<double>();
      else (void)t.values<std::int64_t>();
    }
    if (f.metadata.count("config")) {
      const ModelConfig c = weights_config(f, path);
      const ParamLayout layout(c);
      if (layout.total() < (1 << 22)) {
        std::vector<float> params(static_cast<std::size_t>(layout.total()));
        load_weights<float>(f, path, c, layout, params);
      }
    }
  });
}

std::vector<std::string> seeds_safetensors() {
  const fs::path dir = scratch() / "seeds_safetensors";
  fs::create_directories(dir);
  std::vector<std::string> out;
  ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.mlp_hidden = 12;
  c.max_seq_len = 8;
  for (const ResidualMode mode : {ResidualMode::prenorm, ResidualMode::block, ResidualMode::rd}) {
    c.residual = mode;
    c.n_blocks = 2;
    const ParamLayout layout(c);
    std::vector<float> params(static_cast<std::size_t>(layout.total()));
    for (std::size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i % 7) * 0.25f - 0.5f;
    const std::string path = (dir / "w.safetensors").string();
    save_weights<float>(path, c, layout, params, {{"step", "3"}, {"tokenizer", "bytes"}});
    out.push_back(read_text_file(path));
  }
  // A checkpoint-like file: flat tensors of every dtype, no config.
  const std::vector<double> f64 = {1.5, -2.25};
  const std::vector<std::int32_t> i32 = {1, 2, 3};
  const std::vector<std::int64_t> i64 = {-4};
  const std::vector<float> f32 = {0.5f, 1.0f, 2.0f, 4.0f};
  const std::vector<TensorRef> refs = {{"adam.m", DType::F32, {2, 2}, f32.data()},
                                       {"f64", DType::F64, {2}, f64.data()},
                                       {"i32", DType::I32, {3}, i32.data()},
                                       {"i64", DType::I64, {1}, i64.data()},
                                       {"empty", DType::F32, {0}, nullptr}};
  const std::string path = (dir / "c.safetensors").string();
  write_safetensors(path, {{"state", "{\"step\":1}"}}, refs);
  out.push_back(read_text_file(path));
  return out;
}

// ---- corpus reader (JSONL, text, gzip) --------------------------------------------------------

// The first byte picks the input kind (so one target covers all four); the rest is the file.
constexpr const char* kCorpusNames[] = {"in.jsonl", "in.txt", "in.jsonl.gz", "in.txt.gz"};

bool run_corpus(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return false;
  const fs::path file = scratch() / "corpus" / kCorpusNames[data[0] % 4];
  write_bytes_to(file, as_text(data + 1, size - 1));
  return rejected_cleanly_or(file.string(), [&] {
    const std::string arg[] = {file.string()};
    std::vector<data::InputFile> inputs = data::expand_inputs(arg);
    data::CorpusReader reader(inputs);
    const data::SplitFractions fractions{0.1, 0.1};
    std::vector<data::RawRecord> batch;
    while (reader.next_batch(batch, 1 << 12))
      for (auto& record : batch) (void)data::parse_record(record, inputs[record.source], fractions);
  });
}

std::string gzip(std::string_view bytes) {
  z_stream zs{};
  if (deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) throw std::runtime_error("zlib");
  std::string out(deflateBound(&zs, static_cast<uLong>(bytes.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::vector<std::string> seeds_corpus() {
  const std::string jsonl =
      "{\"id\": \"a1\", \"text\": \"the depth of a residual\\nstream\"}\n"
      "{\"text\": \"no id: split by text \\u00e9\\u4e2d\"}\r\n"
      "\n"
      "{\"id\": 7, \"text\": \"   \"}\n"
      "{\"id\": null, \"text\": \"last line without a newline\"}";
  const std::string text = "A text file is one document.\nIt keeps its lines, \xc3\xa9 included.\n";
  return {std::string(1, '\0') + jsonl, std::string(1, '\1') + text, std::string(1, '\2') + gzip(jsonl),
          std::string(1, '\3') + gzip(text) + gzip("a second gzip member\n")};
}

// ---- TOML training configs ------------------------------------------------------------------

bool run_toml(const std::uint8_t* data, std::size_t size) {
  const std::string where = "fuzz.toml";
  const std::string text(as_text(data, size));
  TrainConfig c;
  bool ok = rejected_cleanly_or(where, [&] { c = parse_toml_config(text, where); });
  if (ok) {
    try {
      c.validate();  // its errors name the key ("train.lr must be ..."), which is what a user needs
    } catch (const Error&) {
      ok = false;
    }
  }
  if (ok) {
    // What validates is written to the run directory as config.toml and read back on resume.
    const std::string once = to_toml(c);
    TrainConfig again;
    try {
      again = parse_toml_config(once, "config.toml");
    } catch (const Error& e) {
      oracle_failed(std::string("to_toml wrote a config it cannot read back: ") + e.what() + "\n" + once);
    }
    if (to_toml(again) != once) oracle_failed("to_toml does not round-trip:\n" + once + "\nvs\n" + to_toml(again));
  }
  // The same bytes as one --set KEY=VALUE.
  TrainConfig s = preset("tiny");
  return rejected_cleanly_or("--set", [&] { apply_setting(s, text, "--set"); }) || ok;
}

std::vector<std::string> seeds_toml() {
  std::vector<std::string> out;
  for (const std::string& name : preset_names()) out.push_back(to_toml(preset(name)));
  out.push_back(
      "# a comment\n[model]\nresidual = \"rd\"\nvalue_route = \"average\"\nn_blocks = 2\n\n[train]\n"
      "lr = 1e-3\ndecay = \"wsd\"\nmilestones = [0.25, 0.5, 1.0]\nprecision = \"bf16\"\nmicro_batches = 2\n");
  out.push_back("model.residual=block");
  out.push_back("train.milestones=[0.5, 1.0]");
  return out;
}

// ---- prepared data: manifest and shards -----------------------------------------------------

// A small prepared dataset (bytes tokenizer) made once per process.
const fs::path& prepared() {
  static const fs::path dir = [] {
    const fs::path root = scratch() / "prepared";
    fs::create_directories(root / "corpus");
    std::string jsonl;
    for (int i = 0; i < 40; ++i)
      jsonl += concat("{\"id\": ", i, ", \"text\": \"document ", i, " about depth, routes and blocks\"}\n");
    write_bytes_to(root / "corpus" / "docs.jsonl", jsonl);
    data::PrepareOptions o;
    o.inputs = data::expand_inputs(std::vector<std::string>{(root / "corpus").string()});
    o.out_dir = (root / "data").string();
    o.fractions = {0.2, 0.2};
    o.shard_tokens = 700;
    o.progress = false;
    data::prepare_dataset(o, *data::make_tokenizer("bytes"));
    return root / "data";
  }();
  return dir;
}

void read_split(const data::TokenDataset& d) {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(std::min<std::int64_t>(d.num_tokens(), 64)));
  d.copy_tokens(d.num_tokens() - static_cast<std::int64_t>(tokens.size()), tokens);
  if (d.num_tokens() > 9) {
    data::BatchLoader loader(d, 1, 8, 1);
    std::vector<std::int32_t> batch(9);
    loader.next(batch);
  }
}

bool run_manifest(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "manifest";
  if (!fs::exists(dir)) fs::copy(prepared(), dir);
  write_bytes_to(dir / data::kManifestName, as_text(data, size));
  bool any = false;
  for (const char* split : {"train", "val", "test"})
    any |= rejected_cleanly_or(dir.string(), [&] { read_split(data::TokenDataset::open(dir.string(), split)); });
  return any;
}

std::vector<std::string> seeds_manifest() { return {read_text_file((prepared() / data::kManifestName).string())}; }

// The input is one shard file; a manifest describing what its header claims lets the loader
// read it as the train split (header, size, checksum and id checks).
bool run_shard(const std::uint8_t* data, std::size_t size) {
  const fs::path dir = scratch() / "shard";
  const fs::path file = dir / "train-00000.bin";
  write_bytes_to(file, as_text(data, size));
  return rejected_cleanly_or(file.string(), [&] {
    const data::ShardHeader h = data::decode_shard_header(data, size, file.string());
    const std::uint64_t vocab = h.vocab_size;
    json manifest = {{"format", "attnres-token-shards"},
                     {"format_version", data::kManifestVersion},
                     {"tokenizer",
                      {{"spec", "bytes"},
                       {"spec_when_prepared", "bytes"},
                       {"hash", "x"},
                       {"hash_algorithm", kChecksumAlgorithm},
                       {"vocab_size", vocab},
                       {"eot_id", 0}}},
                     {"token_bytes", h.token_bytes},
                     {"splits",
                      {{"train",
                        {{"tokens", h.num_tokens},
                         {"shards", {{{"file", "train-00000.bin"}, {"tokens", h.num_tokens},
                                      {"checksum", data::hex64(h.checksum)}}}}}}}}};
    write_bytes_to(dir / data::kManifestName, manifest.dump());
    try {
      read_split(data::TokenDataset::open(dir.string(), "train"));
    } catch (const Error& e) {
      // The manifest is the harness's: an error about it (rather than the shard) is fine.
      const std::string msg = e.what();
      if (msg.find(data::kManifestName) == std::string::npos && msg.find(dir.string()) == std::string::npos) throw;
      throw Error(file.string() + ": " + msg);
    }
  });
}

std::vector<std::string> seeds_shard() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(prepared()))
    if (data::is_shard_file_name(e.path().filename().string())) out.push_back(read_text_file(e.path().string()));
  std::sort(out.begin(), out.end());
  return out;
}

// ---- GPT-2 tokenizer files ------------------------------------------------------------------

// Input: encoder.json, a NUL byte, vocab.bpe, a NUL byte, then text to encode.
bool run_gpt2(const std::uint8_t* data, std::size_t size) {
  const std::string_view all = as_text(data, size);
  const std::size_t a = all.find('\0');
  const std::size_t b = a == std::string_view::npos ? a : all.find('\0', a + 1);
  const fs::path dir = scratch() / "gpt2";
  write_bytes_to(dir / "encoder.json", all.substr(0, a));
  write_bytes_to(dir / "vocab.bpe", a == std::string_view::npos ? std::string_view() : all.substr(a + 1, b - a - 1));
  const std::string_view text = b == std::string_view::npos ? std::string_view() : all.substr(b + 1);
  return rejected_cleanly_or(dir.string(), [&] {
    const data::Gpt2Tokenizer tok(dir.string(), "gpt2:" + dir.string());
    const std::vector<std::int32_t> ids = tok.encode(text);
    for (const std::int32_t id : ids)
      if (id < 0 || id >= tok.vocab_size() || id == tok.eot_id()) oracle_failed("encode gave id " + std::to_string(id));
    if (tok.decode(ids) != text) oracle_failed("decode(encode(text)) != text");
  });
}

std::vector<std::string> seeds_gpt2() {
  // A byte-level vocabulary: the 256 byte tokens, end-of-text, and a few merges.
  const auto map = data::gpt2_byte_to_codepoint();
  auto utf8 = [](char32_t cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  auto token = [&](std::string_view bytes) {
    std::string s;
    for (const char c : bytes) s += utf8(map[static_cast<unsigned char>(c)]);
    return s;
  };
  json encoder = json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) encoder[token(std::string(1, static_cast<char>(b)))] = next++;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {" ", "d"}, {" d", "e"}, {" de", "p"}, {"t", "h"}, {"i", "n"}, {" ", "the"}};
  std::string bpe = "#version: 0.2\n";
  for (const auto& [l, r] : merges) {
    if (!encoder.contains(token(l + r))) encoder[token(l + r)] = next++;
    bpe += token(l) + " " + token(r) + "\n";
  }
  encoder[std::string(data::kEndOfText)] = next++;
  const std::string text = "the depth of the net's 12 layers,\n\n   in   theory\t\xc3\xa9\xe4\xb8\xad!";
  const std::string base = encoder.dump() + '\0' + bpe + '\0';
  return {base + text, base + std::string(200, 'e') + " the" + std::string(60, ' ') + "x"};
}

// ---- result JSON (src/results) ---------------------------------------------------------------

results::ExperimentSpec example_spec() {
  results::ExperimentSpec s;
  s.arms = {"block", "rd"};
  s.baseline = "block";
  s.seeds = {1, 2};
  s.tokens = 8000;
  s.milestones = {1000, 8000};
  s.preset = "tiny";
  s.model = {{"d_model", 64}, {"residual", "block"}};
  s.train = {{"lr", 0.003}};
  return s;
}

// With a spike and gradient norms, so every key of the object has a value to mutate.
results::Instability example_instability() {
  results::Instability s;
  s.tested_steps = 14;
  s.spike_events = 1;
  s.sustained_spike_events = 1;  // two consecutive spike steps
  s.spike_steps = 2;
  s.largest_spike_step = 60;
  s.largest_spike_nats = 0.9;
  s.grad_norm_steps = 63;
  s.clipped_fraction = 0.25;
  s.max_grad_norm = 4.5;
  s.max_grad_norm_step = 3;
  s.unstable = true;
  return s;
}

results::TrainResult example_train_result() {
  results::TrainResult t;
  t.params = 1064;
  t.steps = 64;
  t.milestones = {{8, 1000, 6.0}, {64, 8000, 5.1}};
  t.curve = {{125, 8.5, 2.25}, {250, 7.0}};
  t.instability = example_instability();
  t.tokens_per_sec = 900;
  t.step_time_ms = 11;
  t.peak_rss_bytes = 1 << 20;
  return t;
}

results::RunResult example_run_result() {
  results::RunResult r;
  r.arm = "rd";
  r.seed = 1;
  r.params = 1064;
  r.milestones = {{std::nullopt, 1000, 6.0}, {std::nullopt, 8000, 5.1}};
  r.test_nll = 5.2;
  r.tokens_per_sec = 900;
  r.step_time_ms = 11;
  r.peak_rss_bytes = 1 << 20;
  r.curve = {{125, 8.5, 2.25}, {250, 7.0}};
  r.instability = example_instability();
  r.routing = {{0, 1, {1.0}, {1.0}, 0.0, {}, results::kNotAvailable},
               {1, 2, {0.3, 0.7}, {0.8, 0.2}, 0.1, {}, results::kNotAvailable}};
  return r;
}

// Writes `bytes` as DIR/NAME in the scratch directory and returns its path.
std::string scratch_file(const std::string& dir, const std::string& name, std::string_view bytes) {
  const fs::path file = scratch() / dir / name;
  write_bytes_to(file, bytes);
  return file.string();
}

bool run_experiment_spec(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_file("spec", "experiment.json", as_text(data, size));
  return rejected_cleanly_or(path, [&] { (void)results::read_experiment_spec(path); });
}

std::vector<std::string> seeds_experiment_spec() { return {results::to_json(example_spec()).dump(1)}; }

bool run_run_result(const std::uint8_t* data, std::size_t size) {
  static const results::ExperimentSpec spec = example_spec();
  const std::string path = scratch_file("result", "result.json", as_text(data, size));
  return rejected_cleanly_or(path, [&] { (void)analysis::read_run_result(path, spec, "rd", 1); });
}

std::vector<std::string> seeds_run_result() {
  results::RunResult plain = example_run_result();
  plain.routing.clear();
  plain.curve.clear();
  return {results::to_json(example_run_result()).dump(1), results::to_json(plain).dump()};
}

bool run_train_result(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_file("train_result", "train_result.json", as_text(data, size));
  return rejected_cleanly_or(path, [&] { (void)results::read_train_result(path); });
}

std::vector<std::string> seeds_train_result() { return {results::to_json(example_train_result()).dump(1)}; }

bool run_summary(const std::uint8_t* data, std::size_t size) {
  const std::string path = scratch_file("summary", "summary.json", as_text(data, size));
  return rejected_cleanly_or(path, [&] { (void)results::read_summary(path); });
}

// A summary.json as `attnres report` writes it, of an experiment with one finished run.
std::vector<std::string> seeds_summary() {
  const fs::path dir = scratch() / "seeds_summary";
  fs::remove_all(dir);
  for (const char* arm : {"block", "rd"})
    fs::create_directories(fs::path(results::run_result_path(dir.string(), arm, 1)).parent_path());
  results::write_experiment_spec(results::experiment_spec_path(dir.string()), example_spec());
  results::write_run_result(results::run_result_path(dir.string(), "rd", 1), example_run_result());
  results::RunResult block = example_run_result();
  block.arm = "block";
  block.routing.clear();
  results::write_run_result(results::run_result_path(dir.string(), "block", 1), block);
  analysis::summarize(dir.string());
  return {read_text_file(results::summary_path(dir.string()))};
}

const Target kTargets[] = {
    {"safetensors", run_safetensors, seeds_safetensors},
    {"corpus", run_corpus, seeds_corpus},
    {"toml", run_toml, seeds_toml},
    {"manifest", run_manifest, seeds_manifest},
    {"shard", run_shard, seeds_shard},
    {"gpt2", run_gpt2, seeds_gpt2},
    {"experiment_spec", run_experiment_spec, seeds_experiment_spec},
    {"run_result", run_run_result, seeds_run_result},
    {"train_result", run_train_result, seeds_train_result},
    {"summary", run_summary, seeds_summary},
};

}  // namespace

std::span<const Target> targets() { return kTargets; }

const Target* find_target(const std::string& name) {
  for (const Target& t : kTargets)
    if (name == t.name) return &t;
  return nullptr;
}

}  // namespace attnres::fuzz
