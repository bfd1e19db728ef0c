// Placeholder until the data pipeline lands (owned by the data-pipeline work).
#include "cli/commands.hpp"
namespace attnres::cli {
void register_prepare_command(CLI::App&) {}
}  // namespace attnres::cli
