// attnres: pretraining and paired comparison of depth-attention residual Transformers.
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cblas.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli/commands.hpp"
#include "model/config.hpp"
#include "util/build_info.hpp"
#include "util/error.hpp"

namespace {

// Settings the OpenMP and OpenBLAS runtimes read only when they load, so when the user has not
// chosen them the process sets them and restarts itself once:
// - OMP_WAIT_POLICY=PASSIVE: threads sleep at barriers instead of spinning. A training step runs
//   hundreds of parallel loops; with the default spinning, any other busy process on the machine
//   makes every barrier wait out a time slice (measured: 2 threads at 600 tok/s instead of 2,700
//   beside a compiler; no cost when the machine is idle).
// - OPENBLAS_CORETYPE=Haswell: OpenBLAS 0.3.21 (Debian 12) does not recognise recent Intel cores
//   and falls back to its slowest kernels (Prescott, SSE3); Haswell's AVX2 kernels are safe there.
void configure_runtimes(char** argv) {
  if (std::getenv("ATTNRES_RUNTIME_CONFIGURED") != nullptr) return;
  bool restart = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    restart = true;
  }
  const char* core = openblas_get_corename();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && core != nullptr && std::strcmp(core, "Prescott") == 0 &&
      __builtin_cpu_supports("avx2")) {
    ::setenv("OPENBLAS_CORETYPE", "Haswell", 1);
    restart = true;
  }
  if (!restart) return;
  ::setenv("ATTNRES_RUNTIME_CONFIGURED", "1", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: carry on as configured
}

// `attnres --version`: what this binary is (util/build_info.hpp) and what it was built with.
std::string version_text() {
  const attnres::BuildInfo& build = attnres::build_info();
  std::string text = "attnres " + build.version + " (commit " + build.commit +
                     (!build.dirty ? "" : *build.dirty ? ", with changes to tracked files" : "") + ")\ncompiler: ";
#if defined(__clang__)
  text += "clang " __clang_version__;
#elif defined(__GNUC__)
  text += "gcc " __VERSION__;
#else
  text += "unknown";
#endif
  text += std::string("\nblas: ") + openblas_get_config();
  text += "\ncuda: " ATTNRES_CUDA_BUILD;
#ifdef ATTNRES_WITH_MPI
  text += "\nmpi: on";
#else
  text += "\nmpi: off";
#endif
  return text;
}

// The app's description. The residual modes come from the key that sets them (its choices, from
// the families' records), so a new mode is listed without touching this text.
std::string residual_modes_help() {
  const auto* key = attnres::find_config_key(attnres::model_config_keys(), "model", "residual");
  return "attnres: train and compare decoder-only Transformers whose residual stream is a learned\n"
         "attention over depth, against matched baselines (docs/model.md).\n"
         "Residual modes (" + key->path() + "): " + attnres::join_choices(key->choices) + ";\n"
         "any of them with ResFormer's value residual (model.value_residual).\n"
         "Run 'attnres COMMAND --help' for the options of a command.";
}

}  // namespace

// Exit codes (docs/training.md, "Exit codes"): 0 done; 1 a user error (a bad flag, config, file or
// input; the message names it); 2 an internal error (a bug: please report it); 128 + N stopped by
// signal N, work saved and resumable (130: Ctrl-C, 143: SIGTERM).
int main(int argc, char** argv) {
  configure_runtimes(argv);
  CLI::App app{residual_modes_help()};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show the help of every command");
  app.set_version_flag("--version", version_text(), "Print the version, the commit built, the compiler, BLAS and CUDA/MPI support");
  app.footer("Exit codes: 0 done, 1 user error (named in the message), 2 internal error,\n"
             "130/143 stopped by SIGINT/SIGTERM with the work saved (rerun with --resume or the same command).");

  attnres::cli::register_prepare_command(app);
  attnres::cli::register_tokenizer_command(app);
  attnres::cli::register_train_command(app);
  attnres::cli::register_inference_commands(app);
  attnres::cli::register_config_command(app);
  attnres::cli::register_experiment_command(app);
  attnres::cli::register_plan_command(app);
  attnres::cli::register_model_commands(app);
  attnres::cli::register_report_command(app);
  attnres::cli::register_bench_command(app);

  try {
    attnres::cli::check_command_line(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and --version: CLI11 prints the text, exit 0. Any failure to parse is a user error,
    // reported as attnres reports the others (naming the command and the flag).
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "%s\n", attnres::cli::parse_error_message(app, e).c_str());
    return 1;
  } catch (const attnres::cli::Interrupted& stopped) {
    return 128 + stopped.signal;
  } catch (const attnres::Error& e) {
    std::fprintf(stderr, "attnres: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "attnres: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attnres: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
