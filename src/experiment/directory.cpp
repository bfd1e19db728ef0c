#include "experiment/directory.hpp"

#include <filesystem>
#include <string>

#include "results/experiment_spec.hpp"
#include "util/error.hpp"

namespace attnres::experiment {

OutputKind experiment_directory_kind(int worker, int workers) {
  OutputKind kind;
  kind.what = "experiment directory";
  kind.lock_name = concat(".lock-worker-", worker, "-of-", workers);
  kind.in_use = workers == 1
                    ? std::string("another 'attnres experiment' is running this experiment; two processes share an "
                                  "experiment only as different workers, e.g. --worker 0/2 and --worker 1/2")
                    : concat("another 'attnres experiment' is running worker ", worker, "/", workers,
                             " of it; every process sharing an experiment needs its own --worker K/N");
  kind.recognised = [](const std::filesystem::path& dir) {
    std::error_code ec;
    return std::filesystem::exists(results::experiment_spec_path(dir.string()), ec) ||
           std::filesystem::is_directory(dir / "runs", ec);
  };
  kind.holds = "experiment.json and runs/";
  return kind;
}

}  // namespace attnres::experiment
