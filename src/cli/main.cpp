// attnres: pretraining and paired comparison of depth-attention residual Transformers.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cblas.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "cli/commands.hpp"
#include "util/error.hpp"

namespace {

// OpenBLAS 0.3.21 (Debian 12) does not recognise recent Intel cores and falls back to its
// slowest kernels (Prescott, SSE3), several times slower for fp32 GEMMs. It reads
// OPENBLAS_CORETYPE only at load time, so when the user has not chosen a core type and the CPU
// has AVX2, the process restarts itself once with the conservative Haswell kernels.
void choose_openblas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = openblas_get_corename();
  if (core == nullptr || std::strcmp(core, "Prescott") != 0 || !__builtin_cpu_supports("avx2")) return;
  ::setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on with the slow kernels
}

}  // namespace

int main(int argc, char** argv) {
  choose_openblas_kernels(argv);
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
  attnres::cli::register_bench_command(app);

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
