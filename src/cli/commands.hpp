// Each subcommand of the `attnres` executable registers itself on the app.
// A command's callback throws attnres::Error for anything the user got wrong.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "train/train_config.hpp"

namespace CLI {
class App;
}

namespace attnres::cli {

void register_prepare_command(CLI::App& app);    // prepare_command.cpp: corpora -> token shards
void register_tokenizer_command(CLI::App& app);  // tokenizer_command.cpp: train / encode tokenizers
void register_model_commands(CLI::App& app);     // model_commands.cpp: info
void register_train_commands(CLI::App& app);     // train_commands.cpp: train, eval
void register_config_command(CLI::App& app);     // config_command.cpp: the keys, a resolved config
void register_report_command(CLI::App& app);     // report_command.cpp: experiment summary and report

void register_experiment_command(CLI::App& app);  // experiment_command.cpp: paired multi-seed runs
void register_bench_command(CLI::App& app);       // bench_command.cpp: training-step benchmark vs PyTorch

// Shared by the commands that take a training configuration (train_commands.cpp):
// --preset / --config / --set, and SIGINT/SIGTERM handlers that request a clean stop.
void add_config_options(CLI::App* cmd, std::string& preset_name, std::string& config_file,
                        std::vector<std::string>& settings);
TrainConfig load_train_config(const std::string& preset_name, const std::string& config_file,
                              const std::vector<std::string>& settings);
const std::atomic<bool>* install_stop_handlers();

// --device cpu|cuda|cuda:N (train/backend.hpp).
void add_device_option(CLI::App* cmd, std::string& device);

// "a,b,,c" -> {"a", "b", "c"}.
std::vector<std::string> split_list(const std::string& text);

// Runs a command that may be one rank of an MPI job (`mpirun -np K attnres ...`). An error on
// any rank is printed with the rank's name and ends the whole job (the other ranks would
// otherwise wait for it forever); a single process rethrows it for main to print.
void run_as_job(const std::function<void(dist::Communicator&)>& command);

}  // namespace attnres::cli
