// `attnres plan`: the pilot that measures the noise floor and writes a study's protocol file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.hpp"
#include "experiment/planner.hpp"
#include "experiment/protocol.hpp"
#include "util/error.hpp"

namespace attnres::cli {
namespace {

struct PlanArgs {
  std::string protocol, out, write, worker;
  bool force = false;
};

}  // namespace

void register_plan_command(CLI::App& app) {
  auto a = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan",
      "Plan a study from a pilot: measure each shape's throughput on this machine, train the baseline, the\n"
      "primary arm and their twins (suffix ~) over a grid of learning rates and shapes at equal compute per\n"
      "run, pick the setting by the rule of the pilot file (of the settings whose noise floor's upper confidence\n"
      "limit is below a fraction of the effect of interest, with no unstable or failed run, the lowest learning\n"
      "rate within a tolerance of the best baseline NLL), size sequential seeds from the upper confidence limits,\n"
      "and write the study's protocol file with the pilot's tables in its header. Resumable; --worker K/N shares\n"
      "the runs.\n"
      "See docs/experiments.md, \"Designing a study that can answer\".");
  cmd->add_option("--protocol", a->protocol, "the pilot file: a protocol file with a [pilot] table")->required();
  cmd->add_option("--out", a->out, "directory of the pilot's runs (default runs/<name>-pilot)");
  cmd->add_option("--write", a->write, "the protocol file to write (default: [pilot] out)");
  cmd->add_flag("--force", a->force, "replace a protocol file of other contents at the --write path");
  cmd->add_option("--worker", a->worker, "K/N: this process runs every N-th run from the K-th (0-based)");
  cmd->callback([a] {
    const experiment::ProtocolFile p = experiment::read_protocol(a->protocol);
    require(p.pilot.has_value(), a->protocol, ": not a pilot file: it has no [pilot] table (see docs/experiments.md)");
    experiment::PlanOptions o;
    o.out_dir = a->out.empty() ? "runs/" + p.options.name + "-pilot" : a->out;
    o.write_to = a->write;
    o.force = a->force;
    parse_worker(a->worker, o.worker, o.workers);
    o.stop = install_stop_handlers();
    // Said before the pilot's runs (hours, maybe), not only when the plan is refused after them.
    const std::string target = a->write.empty() ? p.pilot->out : a->write;
    if (!a->force && std::filesystem::exists(target))
      std::fprintf(stderr,
                   "plan: note: '%s' exists: the plan will leave it if it is the same and refuse to replace it "
                   "otherwise (--force replaces it, --write PATH writes elsewhere)\n",
                   target.c_str());
    experiment::prepare_protocol_data(p, true);
    const std::optional<experiment::PlanResult> r = experiment::run_pilot(p, o);
    if (!r) {
      std::printf("plan: stopped; rerun the same command to continue\n");
      if (stop_signal() != 0) throw Interrupted{stop_signal()};
      return;
    }
    std::printf("%s\nprotocol: %s%s\n", experiment::plan_report(p, *r).c_str(), r->protocol_path.c_str(),
                r->protocol_unchanged ? " (unchanged: it already held this plan)" : "");
  });
}

}  // namespace attnres::cli
