#include "comm/small.hpp"

#include "comm/collectives.hpp"
#include "comm/wait.hpp"
#include "comm/world.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <numeric>
#include <thread>

namespace pf::comm {

void allreduce_sum(std::span<double> values, MPI_Comm comm, const char* what) {
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM, comm, &req),
        "MPI_Iallreduce");
  wait(req, {what, comm, -1});
}

std::vector<std::string> gather_bytes(const std::string& mine, int root, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  PF_CHECK(mine.size() <= static_cast<size_t>(INT_MAX), "gather of {} bytes", mine.size());
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(rank == root ? size : 0);
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, root, comm, &req), "MPI_Igather");
  wait(req, {"gather of lengths", comm, -1});
  std::vector<int> displs(lens.size());
  std::string all;
  if (rank == root) {
    std::exclusive_scan(lens.begin(), lens.end(), displs.begin(), 0);
    all.resize(static_cast<size_t>(std::accumulate(lens.begin(), lens.end(), int64_t{0})));
  }
  check(MPI_Igatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, root, comm, &req),
        "MPI_Igatherv");
  wait(req, {"gather of records", comm, -1});
  std::vector<std::string> out;
  for (size_t r = 0; r < lens.size(); ++r) out.push_back(all.substr(displs[r], lens[r]));
  return out;
}

void barrier(MPI_Comm comm, const char* what) {
  MPI_Request req = MPI_REQUEST_NULL;
  check(MPI_Ibarrier(comm, &req), "MPI_Ibarrier");
  wait(req, {what, comm, -1});
}

bool barrier_within(MPI_Comm comm, double seconds) {
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &req) != MPI_SUCCESS) return false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (int done = 0;;) {
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void on_root_agreed(int world_rank, const std::function<void()>& fn) {
  std::string err;
  if (world_rank == 0) {
    try {
      fn();
    } catch (const UsageError& e) {
      err = e.what();
    }
  }
  uint64_t n = err.size();
  broadcast_bytes(&n, sizeof n, 0, MPI_COMM_WORLD);
  err.resize(n);
  if (n) broadcast_bytes(err.data(), n, 0, MPI_COMM_WORLD);
  if (n) throw UsageError(err);
}

int threads_per_rank(int configured) {
  if (configured > 0) return configured;
  MPI_Comm local = MPI_COMM_NULL;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
  Comm owned(local);
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  return std::max(1, cores / owned.size());
}

}  // namespace pf::comm
