// What every command's options share: range checks that name the flag, and the check of a
// command line's command and option names against the app (with a suggestion for a misspelling).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "util/error.hpp"
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

}  // namespace attnres::cli
