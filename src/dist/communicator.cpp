#include "dist/communicator.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "dist/tree_sum.hpp"
#include "util/error.hpp"

#ifdef ATTNRES_WITH_MPI
#include <mpi.h>
#endif

namespace attnres::dist {

namespace {

#ifdef ATTNRES_WITH_MPI
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("MPI call ", call, " failed: ", std::string(text, static_cast<std::size_t>(len)));
}
#endif

}  // namespace

bool Communicator::launched_by_mpi() {
  const char* off = std::getenv("ATTNRES_NO_MPI");
  if (off != nullptr && std::string(off) == "1") return false;
  // Open MPI's mpirun, MPICH/Intel MPI (Hydra), PMIx launchers (Slurm srun --mpi=pmix) and PMI-2.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

Communicator Communicator::from_environment() {
  Communicator c;
  if (!launched_by_mpi()) return c;
#ifdef ATTNRES_WITH_MPI
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised == 0) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    c.owns_mpi_ = true;
  }
  // Errors come back as codes (and become attnres errors naming the call) instead of aborting.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(MPI_COMM_WORLD, &c.rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &c.world_), "MPI_Comm_size");
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c.rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  check(MPI_Comm_size(local, &c.local_size_), "MPI_Comm_size");
  check(MPI_Comm_rank(local, &c.local_rank_), "MPI_Comm_rank");
  MPI_Comm_free(&local);
  const auto w = static_cast<std::size_t>(c.world_);
  Tables& t = c.tables_;
  for (auto* v : {&t.send_counts, &t.send_displs, &t.recv_counts, &t.recv_displs}) v->resize(w);
  t.parts.resize(w);
  t.values.resize(w);
  t.value_parts.resize(w);
  for (std::size_t r = 0; r < w; ++r) t.value_parts[r] = &t.values[r];
  return c;
#else
  fail("this process was started by an MPI launcher, but attnres was built without MPI; install MPI "
       "(scripts/install-deps.sh) and rebuild, or run it without mpirun");
#endif
}

Communicator::Communicator(Communicator&& o) noexcept
    : rank_(o.rank_), world_(o.world_), local_size_(o.local_size_), local_rank_(o.local_rank_), owns_mpi_(std::exchange(o.owns_mpi_, false)),
      scratch_(std::move(o.scratch_)), tables_(std::move(o.tables_)) {}

Communicator& Communicator::operator=(Communicator&& o) noexcept {
  std::swap(rank_, o.rank_);
  std::swap(world_, o.world_);
  std::swap(local_size_, o.local_size_);
  std::swap(local_rank_, o.local_rank_);
  std::swap(owns_mpi_, o.owns_mpi_);
  std::swap(scratch_, o.scratch_);
  std::swap(tables_, o.tables_);
  return *this;
}

Communicator::~Communicator() {
#ifdef ATTNRES_WITH_MPI
  if (owns_mpi_) MPI_Finalize();
#endif
}

std::string Communicator::describe() const {
  if (world_ == 1) return "";
  return "rank " + std::to_string(rank_) + " of " + std::to_string(world_);
}

void Communicator::sum(std::span<float> data) {
  if (world_ == 1) return;
#ifdef ATTNRES_WITH_MPI
  // Per bucket: every rank receives its chunk from all ranks (all-to-all), adds the parts in tree
  // order, and the reduced chunks are gathered back (the bandwidth of a ring all-reduce, with a
  // fixed order of additions).
  const auto w = static_cast<std::size_t>(world_);
  const std::size_t chunk_max = (std::min(kBucket, data.size()) + w - 1) / w;
  if (scratch_.size() < chunk_max * w) scratch_.resize(chunk_max * w);
  auto& [send_counts, send_displs, recv_counts, recv_displs, parts, values, value_parts] = tables_;
  for (std::size_t begin = 0; begin < data.size(); begin += kBucket) {
    const std::size_t len = std::min(kBucket, data.size() - begin);
    const std::size_t chunk = (len + w - 1) / w;
    float* bucket = data.data() + begin;
    auto chunk_begin = [&](std::size_t r) { return std::min(len, r * chunk); };
    auto chunk_len = [&](std::size_t r) { return chunk_begin(r + 1) - chunk_begin(r); };
    const auto me = static_cast<std::size_t>(rank_);
    for (std::size_t r = 0; r < w; ++r) {
      send_counts[r] = static_cast<int>(chunk_len(r));
      send_displs[r] = static_cast<int>(chunk_begin(r));
      recv_counts[r] = static_cast<int>(chunk_len(me));
      recv_displs[r] = static_cast<int>(r * chunk);
    }
    check(MPI_Alltoallv(bucket, send_counts.data(), send_displs.data(), MPI_FLOAT, scratch_.data(),
                        recv_counts.data(), recv_displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
          "MPI_Alltoallv");
    for (std::size_t r = 0; r < w; ++r) parts[r] = scratch_.data() + r * chunk;
    float* mine = bucket + chunk_begin(me);
    const std::size_t n = chunk_len(me);
#pragma omp parallel for schedule(static) if (n >= (std::size_t(1) << 15))
    for (std::size_t i = 0; i < n; ++i) mine[i] = tree_sum_at<float>(parts, 0, w, i);
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, bucket, send_counts.data(), send_displs.data(), MPI_FLOAT,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
  }
#endif
}

double Communicator::sum(double value) {
  if (world_ == 1) return value;
#ifdef ATTNRES_WITH_MPI
  check(MPI_Allgather(&value, 1, MPI_DOUBLE, tables_.values.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD), "MPI_Allgather");
  return tree_sum_at<double>(tables_.value_parts, 0, tables_.value_parts.size(), 0);
#else
  return value;
#endif
}

bool Communicator::any(bool flag) {
  if (world_ == 1) return flag;
#ifdef ATTNRES_WITH_MPI
  int in = flag ? 1 : 0, out = 0;
  check(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  return out != 0;
#else
  return flag;
#endif
}

void Communicator::broadcast(std::span<float> data, int root) {
  if (world_ == 1) return;
#ifdef ATTNRES_WITH_MPI
  constexpr std::size_t kMaxCount = std::size_t(1) << 30;  // MPI counts are int
  for (std::size_t begin = 0; begin < data.size(); begin += kMaxCount) {
    const std::size_t len = std::min(kMaxCount, data.size() - begin);
    check(MPI_Bcast(data.data() + begin, static_cast<int>(len), MPI_FLOAT, root, MPI_COMM_WORLD), "MPI_Bcast");
  }
#else
  (void)data;
  (void)root;
#endif
}

void Communicator::broadcast(std::string& text, int root) {
  if (world_ == 1) return;
#ifdef ATTNRES_WITH_MPI
  auto size = static_cast<std::uint64_t>(text.size());
  check(MPI_Bcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD), "MPI_Bcast");
  text.resize(size);
  check(MPI_Bcast(text.data(), static_cast<int>(size), MPI_CHAR, root, MPI_COMM_WORLD), "MPI_Bcast");
#else
  (void)text;
  (void)root;
#endif
}

void Communicator::barrier() {
  if (world_ == 1) return;
#ifdef ATTNRES_WITH_MPI
  check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

void Communicator::wait_for_all() {
  if (world_ == 1) return;
#ifdef ATTNRES_WITH_MPI
  MPI_Request request;
  check(MPI_Ibarrier(MPI_COMM_WORLD, &request), "MPI_Ibarrier");
  for (int done = 0;;) {
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
#endif
}

void Communicator::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef ATTNRES_WITH_MPI
  if (world_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

int default_threads(const Communicator& comm) {
  if (const char* env = std::getenv("OMP_NUM_THREADS"); env != nullptr && std::atoi(env) > 0) return std::atoi(env);
  const int available = omp_get_num_procs();  // honours the launcher's CPU binding
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (comm.local_size() > 1 && available >= machine) return std::max(1, available / comm.local_size());
  return available;
}

}  // namespace attnres::dist
