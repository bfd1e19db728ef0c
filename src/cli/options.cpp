// What every command's options share: range checks that name the flag, the check of a command
// line's command and option names against the app (with a suggestion for a misspelling), and the
// options of the commands that train (--preset/--config/--set, --tokens, --threads, --device)
// or read weights (--checkpoint).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "model/safetensors.hpp"
#include "train/checkpoint.hpp"
#include "train/train_config.hpp"
#include "util/error.hpp"
#include "util/paths.hpp"
#include "util/suggest.hpp"

namespace attnres::cli {

CLI::Validator at_least(double min) {
  const std::string bound = concat(min);
  return CLI::Validator(
      [min, bound](std::string& text) -> std::string {
        std::size_t used = 0;
        double value = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          return "must be a number of at least " + bound + " (got '" + text + "')";
        }
        if (used != text.size() || !std::isfinite(value)) return "must be a number of at least " + bound + " (got '" + text + "')";
        if (value < min) return "must be at least " + bound + " (got " + text + ")";
        return "";
      },
      ">= " + bound, "at_least");
}

namespace {

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) out.push_back(sub->get_name());
  return out;
}

std::vector<std::string> long_option_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& name : opt->get_lnames()) out.push_back("--" + name);
  return out;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

[[noreturn]] void unknown(const std::string& what, const std::string& word, const std::string& where,
                          const std::vector<std::string>& valid) {
  const std::string guess = did_you_mean(word, valid);
  if (!guess.empty()) fail("unknown ", what, " '", word, "'", where, guess);
  fail("unknown ", what, " '", word, "'", where, " (expected one of: ", joined(valid), ")");
}

}  // namespace

void check_command_line(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* current = &app;
  std::string path = "attnres";
  bool positional_seen = false;  // a command's own positional arguments end the command names
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") return;  // the rest are values
    if (arg.rfind("--", 0) == 0) {
      const std::string name = arg.substr(0, arg.find('='));
      if (current->get_option_no_throw(name) != nullptr || name == "--help-all" || name == "--version") continue;
      unknown("option", name, current == &app ? "" : " for '" + path + "'", long_option_names(*current));
    }
    if (arg.size() > 1 && arg[0] == '-') continue;  // a short flag or a negative number: CLI11 decides
    if (positional_seen) continue;
    const std::vector<std::string> commands = command_names(*current);
    if (std::find(commands.begin(), commands.end(), arg) != commands.end()) {
      current = current->get_subcommand(arg);
      path += " " + arg;
      continue;
    }
    // A value of the option before it, or a positional argument of the command.
    const std::string previous = i > 1 ? argv[i - 1] : "";
    const bool option_value = previous.rfind("--", 0) == 0 && previous.find('=') == std::string::npos;
    if (option_value) continue;
    const std::vector<const CLI::Option*> options = current->get_options();
    const bool takes_positionals =
        std::any_of(options.begin(), options.end(), [](const CLI::Option* o) { return o->get_positional(); });
    if (!commands.empty() && !takes_positionals)
      unknown("command", arg, current == &app ? "" : " for '" + path + "'", commands);
    positional_seen = true;
  }
}

std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e) {
  // The command the error belongs to: the deepest subcommand parsed.
  std::string command = "attnres";
  for (const CLI::App* current = &app; !current->get_subcommands().empty();) {
    current = current->get_subcommands().front();
    command += " " + current->get_name();
  }
  // CLI11's sentences, in the form of attnres's own messages ("--flag: what is wrong").
  std::string text = e.what();
  std::smatch m;
  if (std::regex_match(text, m, std::regex("(\\S+) is required"))) {
    text = concat(m[1].str(), ": required (no default)");
  } else if (std::regex_match(text, m, std::regex("Could not convert: (\\S+) = (.*)"))) {
    text = concat(m[1].str(), ": '", m[2].str(), "' is not a valid value");
  } else if (std::regex_match(text, m, std::regex("The value (.*) is not an allowed value for (\\S+)"))) {
    text = concat(m[2].str(), ": '", m[1].str(), "' is not an allowed value");
  } else if (std::regex_match(text, m, std::regex("The following arguments? (?:was|were) not expected: (.*)"))) {
    text = concat("unexpected argument(s): ", m[1].str());
  } else if (std::regex_match(text, m, std::regex("(\\S+): (.*) not in \\{(.*)\\}"))) {
    std::string choices = m[3].str();
    std::replace(choices.begin(), choices.end(), ',', ' ');
    std::vector<std::string> names;
    std::istringstream words(choices);
    for (std::string w; words >> w;) names.push_back(w);
    text = concat(m[1].str(), ": '", m[2].str(), "' is not one of ", m[3].str(), did_you_mean(m[2].str(), names));
  } else if (std::regex_match(text, m, std::regex("(\\S+) excludes (\\S+)"))) {
    text = concat(m[1].str(), ": cannot be given with ", m[2].str());
  }
  return concat(command, ": error: ", text, "\nRun '", command, " --help' for its options.");
}

void parse_worker(const std::string& text, int& worker, int& workers) {
  if (text.empty()) return;
  const auto slash = text.find('/');
  require(slash != std::string::npos, "--worker must be K/N, e.g. 0/2 (got '", text, "')");
  try {
    worker = std::stoi(text.substr(0, slash));
    workers = std::stoi(text.substr(slash + 1));
  } catch (const std::exception&) {
    fail("--worker must be K/N, e.g. 0/2 (got '", text, "')");
  }
  require(workers >= 1 && worker >= 0 && worker < workers, "--worker K/N needs 0 <= K < N (got '", text, "')");
}

TrainConfig load_train_config(const std::string& preset_name, const std::string& config_file,
                              const std::vector<std::string>& settings) {
  require(preset_name.empty() != config_file.empty(), "give exactly one of --preset NAME or --config FILE");
  TrainConfig config = preset_name.empty() ? preset("tiny") : preset(preset_name);
  if (!config_file.empty()) {
    require_path_kind(config_file, PathKind::kFile, "--config");
    apply_toml_file(config, config_file);
  }
  for (const auto& s : settings) apply_setting(config, s, "--set " + s);
  return config;
}

std::vector<std::string> split_list(const std::string& text, std::string_view flag) {
  std::vector<std::string> out;
  if (text.empty()) return out;  // none (the caller's default, or its own "names no ..." error)
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    require(end > begin, flag, " '", text, "': empty item ", out.size() + 1,
            " (a comma too many); separate the items by one comma");
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

void add_device_option(CLI::App* cmd, std::string& device) {
  cmd->add_option("--device", device,
                  "cpu, or cuda / cuda:N for an NVIDIA GPU (builds with the CUDA backend; under MPI, 'cuda' "
                  "takes the GPU of the rank's local index). See docs/cuda.md")
      ->capture_default_str();
}

void add_config_options(CLI::App* cmd, std::string& preset_name, std::string& config_file,
                        std::vector<std::string>& settings) {
  cmd->add_option("--preset", preset_name, "tiny | small | S | M (see docs/training.md)");
  cmd->add_option("--config", config_file, "TOML file with [model] and [train] tables (over the tiny preset)");
  // The keys by section, wrapped: "  model: vocab_size d_model ...".
  std::string keys, line, section;
  for (const auto& k : train_config_keys()) {
    if (k.section != section) {
      if (!line.empty()) keys += line + "\n";
      section = k.section;
      line = "  " + section + ":";
    } else if (line.size() + 1 + k.name.size() > 72) {
      keys += line + "\n";
      line = std::string(section.size() + 3, ' ');
    }
    line += " " + k.name;
  }
  cmd->add_option("--set", settings,
                  "override one key (TOML syntax; bare words are strings), e.g.\n"
                  "--set model.residual=rd --set train.lr=1e-3. The keys (types, ranges,\n"
                  "defaults and meaning: 'attnres config --keys'):\n" +
                      keys + line)
      ->take_all();
}

void add_train_key_flags(CLI::App* cmd, TrainKeyFlags& flags) {
  flags.tokens_option = cmd->add_option("--tokens", flags.tokens,
                                        "training tokens per run, rounded down to whole steps of batch_size x "
                                        "seq_len (short for --set train.tokens=N; default: the preset's)")
                            ->check(at_least(1));
  flags.threads_option =
      cmd->add_option("--threads", flags.threads, "threads (short for --set train.threads=N; 0: all cores)")
          ->check(at_least(0));
}

std::vector<std::string> with_train_key_flags(std::vector<std::string> settings, const TrainKeyFlags& flags) {
  if (flags.tokens_option != nullptr && flags.tokens_option->count() > 0)
    settings.push_back(concat("train.tokens=", flags.tokens));
  if (flags.threads_option != nullptr && flags.threads_option->count() > 0)
    settings.push_back(concat("train.threads=", flags.threads));
  return settings;
}

SafetensorsFile read_model_weights(std::string& path) {
  namespace fs = std::filesystem;
  const std::string given = path;
  if (fs::is_directory(path)) {
    path = (fs::path(path) / "model.safetensors").string();
    require(fs::exists(path), "'", given, "' is a directory without model.safetensors (not a training run)");
  }
  SafetensorsFile file = read_safetensors(path);
  if (file.metadata.count("state") == 0) return file;
  // A training checkpoint (weights, AdamW moments, state): its own weights, of its step.
  if (std::optional<SafetensorsFile> weights = checkpoint_as_weights(file, path)) return std::move(*weights);
  // One written before checkpoints named their tokenizer (a run's only checkpoint): its run's
  // weights file holds the same step's weights with the tokenizer's name.
  const std::string weights = (fs::path(path).parent_path() / "model.safetensors").string();
  require(fs::exists(weights), "'", path, "' is a training checkpoint and '", weights,
          "' (its run's weights) is missing; pass the run's model.safetensors");
  path = weights;
  return read_safetensors(path);
}

}  // namespace attnres::cli
