// attnres: pretraining and paired comparison of depth-attention residual Transformers.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "cli/commands.hpp"
#include "util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "attnres: train and compare decoder-only Transformers whose residual stream is a learned\n"
      "attention over depth (pre-norm, Full/Block AttnRes, RD-AttnRes and its controls).\n"
      "Run 'attnres COMMAND --help' for the options of a command."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every command");

  attnres::cli::register_prepare_command(app);
  attnres::cli::register_tokenizer_command(app);
  attnres::cli::register_train_commands(app);
  attnres::cli::register_experiment_command(app);
  attnres::cli::register_model_commands(app);
  attnres::cli::register_report_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const attnres::Error& e) {
    std::fprintf(stderr, "attnres: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnres: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
