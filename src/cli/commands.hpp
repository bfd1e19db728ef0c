// Each subcommand of the `attnres` executable registers itself on the app.
// A command's callback throws attnres::Error for anything the user got wrong.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/communicator.hpp"
#include "train/train_config.hpp"

namespace CLI {
class App;
class Option;
class Validator;
class ParseError;
}  // namespace CLI

namespace attnres {
struct SafetensorsFile;
}

namespace attnres::cli {

void register_prepare_command(CLI::App& app);    // prepare_command.cpp: corpora -> token shards
void register_tokenizer_command(CLI::App& app);  // tokenizer_command.cpp: train / encode tokenizers
void register_model_commands(CLI::App& app);     // model_commands.cpp: info
void register_train_command(CLI::App& app);       // train_command.cpp: train
void register_inference_commands(CLI::App& app);  // inference_commands.cpp: eval, sample
void register_config_command(CLI::App& app);     // config_command.cpp: the keys, a resolved config
void register_report_command(CLI::App& app);     // report_command.cpp: experiment summary and report

void register_experiment_command(CLI::App& app);  // experiment_command.cpp: paired multi-seed runs
void register_plan_command(CLI::App& app);        // plan_command.cpp: the pilot that plans a study
void register_bench_command(CLI::App& app);       // bench_command.cpp: training-step benchmark vs PyTorch

// Shared by the commands that take a training configuration (options.cpp): --preset / --config / --set.
void add_config_options(CLI::App* cmd, std::string& preset_name, std::string& config_file,
                        std::vector<std::string>& settings);
TrainConfig load_train_config(const std::string& preset_name, const std::string& config_file,
                              const std::vector<std::string>& settings);
// How a command runs (job.cpp). SIGINT/SIGTERM handlers that request a clean stop: the first
// signal sets the returned flag, a second ends the process (and a training child) at once.
const std::atomic<bool>* install_stop_handlers();
// The first stop signal received (SIGINT, SIGTERM), 0 if none.
int stop_signal();

// Thrown by a command that stopped early because of a signal, its work saved and resumable:
// main exits with 128 + the signal (130 for Ctrl-C).
struct Interrupted {
  int signal;
};

// Option checks, names and the options several commands share (options.cpp).
// A CLI11 check "must be at least MIN (got X)"; CLI11 prefixes the option's name.
CLI::Validator at_least(double min);
// Refuses an unknown command or long option before parsing, naming it and suggesting the
// closest valid one (util/suggest.hpp; CLI11 would only say "a subcommand is required" or list
// the extras).
void check_command_line(const CLI::App& app, int argc, const char* const* argv);

// --tokens N and --threads N of the commands that train: short for --set train.tokens=N and
// --set train.threads=N (applied after the --set values).
struct TrainKeyFlags {
  std::int64_t tokens = 0;
  int threads = 0;
  CLI::Option* tokens_option = nullptr;
  CLI::Option* threads_option = nullptr;
};
void add_train_key_flags(CLI::App* cmd, TrainKeyFlags& flags);
std::vector<std::string> with_train_key_flags(std::vector<std::string> settings, const TrainKeyFlags& flags);

// The weights of --checkpoint PATH (eval, sample, info): a weights file, a run directory (its
// model.safetensors, the newest weights) or a training checkpoint (the weights of its step;
// train/checkpoint.hpp). `path` becomes the file read.
SafetensorsFile read_model_weights(std::string& path);

// --device cpu|cuda|cuda:N (train/backend.hpp).
void add_device_option(CLI::App* cmd, std::string& device);

// A CLI11 parse error (a required option missing, a value of the wrong type, a stray argument) as
// attnres reports errors: "attnres COMMAND: error: --flag: what is wrong", then where the help is.
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e);

// The value of a comma-separated option: "a,b,c" -> {"a", "b", "c"}, "" -> {}; an empty item
// ("a,,b", a leading or trailing comma) is an error naming `flag`, the value and where.
std::vector<std::string> split_list(const std::string& text, std::string_view flag);

// --worker K/N: this process's index and the number of workers (0 <= K < N); "" leaves them as
// they are. A malformed value is an Error naming the option.
void parse_worker(const std::string& text, int& worker, int& workers);

// (job.cpp) Runs a command that may be one rank of an MPI job (`mpirun -np K attnres ...`). An error on
// any rank is printed with the rank's name and ends the whole job (the other ranks would
// otherwise wait for it forever); a single process rethrows it for main to print.
void run_as_job(const std::function<void(dist::Communicator&)>& command);

}  // namespace attnres::cli
