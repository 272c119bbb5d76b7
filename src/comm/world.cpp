#include "comm/world.hpp"

#include "comm/wait.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string>

namespace pf::comm {

World::World(int* argc, char*** argv) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    owns_ = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  if (const char* t = std::getenv("PF_COMM_TIMEOUT"); t && *t) {
    char* end = nullptr;
    double s = std::strtod(t, &end);
    if (end == t || *end != '\0') usage_error("PF_COMM_TIMEOUT", "'{}' is not a number of seconds", t);
    set_progress_timeout(s);
  }
  if (const char* t = std::getenv("PF_COMM_SLEEP_US"); t && *t) {
    char* end = nullptr;
    double us = std::strtod(t, &end);
    if (end == t || *end != '\0' || us < 1)
      usage_error("PF_COMM_SLEEP_US", "'{}' is not a number of microseconds >= 1", t);
    set_max_sleep_ns(static_cast<long>(us * 1000));
  }
  exceptions_at_init_ = std::uncaught_exceptions();
}

World::~World() {
  if (!owns_) return;
  // Unwinding from an exception that may be this rank's alone: MPI_Finalize could then wait
  // forever for peers still expecting messages. Leaving without it makes mpirun end the job
  // ("exited without calling finalize"), and the exception's message still gets printed.
  if (std::uncaught_exceptions() > exceptions_at_init_) return;
  MPI_Finalize();
}

Comm::~Comm() {
  if (c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
}

Comm& Comm::operator=(Comm&& o) noexcept {
  if (this != &o) {
    if (c_ != MPI_COMM_NULL) MPI_Comm_free(&c_);
    c_ = o.c_;
    o.c_ = MPI_COMM_NULL;
  }
  return *this;
}

int Comm::rank() const {
  int r = -1;
  MPI_Comm_rank(c_, &r);
  return r;
}

int Comm::size() const {
  int n = 0;
  MPI_Comm_size(c_, &n);
  return n;
}

Comm Comm::dup() const {
  MPI_Comm c = MPI_COMM_NULL;
  check(MPI_Comm_dup(c_, &c), "MPI_Comm_dup");
  return Comm(c);  // the error handler (MPI_ERRORS_RETURN) is copied by MPI_Comm_dup
}

MPI_Comm Groups::holders_comm(int s) const {
  const int m = mirror_stage(stage);
  PF_CHECK(s == stage || s == m, "stage {} is not hosted by device {} (stages {} and {})", s, stage, stage, m);
  return s == std::min(stage, m) ? stage_holders.get() : mirror_holders.get();
}

std::vector<int> Groups::holders(int s) const {
  std::vector<int> out;
  int m = mirror_stage(s);
  for (int w = 0; w < replicas; ++w) {
    out.push_back(world_rank(std::min(s, m), w));
    if (m != s) out.push_back(world_rank(std::max(s, m), w));
  }
  return out;
}

namespace {
Comm split(int color, int key, const char* what) {
  MPI_Comm c = MPI_COMM_NULL;
  check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &c), what);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return Comm(c);
}
}  // namespace

Groups make_groups(const World& world, int stages, int data_parallel) {
  if (stages < 1) usage_error("parallel.stages", "must be >= 1 (got {})", stages);
  if (data_parallel < 1) usage_error("parallel.data_parallel", "must be >= 1 (got {})", data_parallel);
  if (stages * data_parallel != world.size())
    usage_error("parallel.stages x parallel.data_parallel",
                "{} x {} = {} processes, but mpirun started {} (-np must equal stages x data_parallel)",
                stages, data_parallel, stages * data_parallel, world.size());
  Groups g;
  g.stages = stages;
  g.replicas = data_parallel;
  g.rank = world.rank();
  g.stage = g.rank % stages;
  g.replica = g.rank / stages;
  g.pipeline = split(g.replica, g.stage, "MPI_Comm_split(pipeline)");
  g.data_parallel = split(g.stage, g.replica, "MPI_Comm_split(data_parallel)");
  const int m = g.mirror_stage(g.stage);
  g.stage_holders = split(std::min(g.stage, m), g.replica * 2 + (g.stage > m ? 1 : 0),
                          "MPI_Comm_split(stage_holders)");
  g.mirror_holders = g.stage_holders.dup();
  return g;
}

}  // namespace pf::comm
