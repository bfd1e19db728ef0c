// `attnres config`: the configuration keys, and the configuration a command would run with.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.hpp"
#include "train/train_config.hpp"
#include "util/atomic_file.hpp"
#include "util/error.hpp"

namespace attnres::cli {

namespace {

struct ConfigArgs {
  std::string preset, config, update_docs;
  std::vector<std::string> settings;
  bool keys = false, markdown = false;
};

void run_config(const ConfigArgs& a) {
  if (!a.update_docs.empty()) {
    const std::string before = read_text_file(a.update_docs);
    const std::string after = with_config_key_table(before, a.update_docs);
    if (after != before) write_text_atomically(a.update_docs, after);
    std::printf("%s: the config key table is %s\n", a.update_docs.c_str(), after == before ? "up to date" : "updated");
    return;
  }
  if (a.keys) {
    std::printf("%s", (a.markdown ? config_key_table_markdown() : config_key_table_text()).c_str());
    return;
  }
  const TrainConfig config = load_train_config(a.preset, a.config, a.settings);
  config.validate();
  std::printf("%s", to_toml(config).c_str());
}

}  // namespace

void register_config_command(CLI::App& app) {
  auto a = std::make_shared<ConfigArgs>();
  auto* cmd = app.add_subcommand(
      "config",
      "Print the configuration that --preset/--config/--set resolve to (a complete config file, as\n"
      "OUT/config.toml records it), or with --keys every configuration key: type and range, default,\n"
      "value in the tiny preset, meaning.");
  add_config_options(cmd, a->preset, a->config, a->settings);
  cmd->add_flag("--keys", a->keys, "print the table of configuration keys");
  cmd->add_flag("--markdown", a->markdown, "with --keys: as the Markdown table of docs/training.md");
  cmd->add_option("--update-docs", a->update_docs,
                  "rewrite the key table of this Markdown file (docs/training.md; 'make docs') from the keys");
  cmd->callback([a] { run_config(*a); });
}

}  // namespace attnres::cli
