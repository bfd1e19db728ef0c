// The processes of one data-parallel job. Under `mpirun` / `srun` (detected from the launcher's
// environment) this joins the MPI job; otherwise it is a single process and every operation is
// a no-op, so callers never branch on whether MPI is present.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace attnres::dist {

class Communicator {
 public:
  Communicator() = default;  // a single process
  // Joins the MPI job this process was launched in, if any (and if built with MPI). The variable
  // ATTNRES_NO_MPI=1 forces a single process (set for the child processes of `experiment`).
  static Communicator from_environment();
  // True when the environment says an MPI launcher started this process.
  static bool launched_by_mpi();

  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  ~Communicator();  // finalises MPI if this object initialised it

  int rank() const { return rank_; }
  int world() const { return world_; }
  int local_size() const { return local_size_; }  // ranks on this machine
  int local_rank() const { return local_rank_; }  // this rank's index among them (e.g. its GPU)
  bool is_root() const { return rank_ == 0; }
  bool distributed() const { return world_ > 1; }
  // "rank 1 of 4" (empty for a single process), for messages.
  std::string describe() const;

  // Sums `data` over all ranks into every rank, adding the ranks' contributions in the fixed
  // tree order of tree_sum.hpp (not MPI's own order), so the result is the same on every rank,
  // in every run, and equal to one process summing the same parts. Works in buckets of at most
  // kBucket elements, so its scratch memory stays bounded.
  void sum(std::span<float> data);
  // Sums one value per rank in the same tree order.
  double sum(double value);
  bool any(bool flag);  // true on every rank when it is true on some rank
  void broadcast(std::span<float> data, int root = 0);
  void broadcast(std::string& text, int root = 0);
  void barrier();
  // A barrier that sleeps while it waits (MPI's blocking calls spin a core), for ranks that may
  // wait a long time, e.g. for another rank's experiment runs.
  void wait_for_all();
  // Ends the whole job (every rank) with `code`. For a single process: std::exit.
  [[noreturn]] void abort(int code);

  static constexpr std::size_t kBucket = std::size_t(1) << 22;  // floats per reduction round

 private:
  int rank_ = 0;
  int world_ = 1;
  int local_size_ = 1;
  int local_rank_ = 0;
  bool owns_mpi_ = false;
  // Reduction scratch, sized once per job so a training step allocates nothing.
  struct Tables {
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
    std::vector<const float*> parts;
    std::vector<double> values;
    std::vector<const double*> value_parts;
  };
  std::vector<float> scratch_;
  Tables tables_;
};

// Threads for one rank when the user asked for "all cores" (0): OMP_NUM_THREADS if set, else the
// cores this process may run on, shared among the ranks on this machine when the launcher did not
// bind each rank to its own cores.
int default_threads(const Communicator& comm);

}  // namespace attnres::dist
