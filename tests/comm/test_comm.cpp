// The communication layer under real mpirun: each test launches tests/comm/worker (comm_worker)
// through scripts/pfrun with 2-4 ranks and checks its output and exit status. The worker checks
// exact values itself ("OK" lines); membership and timings are checked here.
#include "../support/launch.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using pf_test::Launch;

// mpirun (scripts/pfrun) with `args`, `env` ("NAME=value ...", or kGuard) in front.
Launch run(const std::string& args, const std::string& env = "") {
  return pf_test::run(env + " " + PF_SOURCE_DIR "/scripts/pfrun " + args);
}

// A hang guard, not a timing check: far beyond any job here, it only turns a job that never ends
// into a failure (timeout's exit status) instead of holding the suite until ctest's own timeout.
const std::string kGuard = "timeout -k 10 300";
constexpr int kGuardStatus = 124;

Launch worker(int np, const std::string& mode, const std::string& env = "") {
  return run("-np " + std::to_string(np) + " " PF_COMM_WORKER " " + mode, env);
}

std::vector<std::string> lines_starting(const std::string& out, const std::string& prefix) {
  std::vector<std::string> v;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) v.push_back(l);
  return v;
}

int count_lines(const std::string& out, const std::string& prefix) {
  return static_cast<int>(lines_starting(out, prefix).size());
}

void expect_groups(int D, int W, const std::vector<std::string>& expected) {
  Launch r = worker(D * W, "groups " + std::to_string(D) + " " + std::to_string(W));
  ASSERT_EQ(r.status, 0) << r.out;
  // mpirun forwards each rank's lines whole but interleaves ranks in any order.
  auto got = lines_starting(r.out, "GROUPS");
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expected) << r.out;
}

}  // namespace

// Rank r = w*D + s. Pipelines are consecutive ranks; data-parallel groups stride by D; under
// Chimera, device i and D-1-i hold copies of the same stages.
TEST(CommGroups, TwoStagesOneReplica) {
  expect_groups(2, 1, {
      "GROUPS rank=0 stage=0 replica=0 pipeline=0,1 pipeline_rank=0 dp=0 dp_rank=0 holders=0,1 holders_fn=0,1",
      "GROUPS rank=1 stage=1 replica=0 pipeline=0,1 pipeline_rank=1 dp=1 dp_rank=0 holders=0,1 holders_fn=0,1",
  });
}

TEST(CommGroups, OneStageTwoReplicas) {
  expect_groups(1, 2, {
      "GROUPS rank=0 stage=0 replica=0 pipeline=0 pipeline_rank=0 dp=0,1 dp_rank=0 holders=0,1 holders_fn=0,1",
      "GROUPS rank=1 stage=0 replica=1 pipeline=1 pipeline_rank=0 dp=0,1 dp_rank=1 holders=0,1 holders_fn=0,1",
  });
}

TEST(CommGroups, TwoStagesTwoReplicas) {
  expect_groups(2, 2, {
      "GROUPS rank=0 stage=0 replica=0 pipeline=0,1 pipeline_rank=0 dp=0,2 dp_rank=0 holders=0,1,2,3 holders_fn=0,1,2,3",
      "GROUPS rank=1 stage=1 replica=0 pipeline=0,1 pipeline_rank=1 dp=1,3 dp_rank=0 holders=0,1,2,3 holders_fn=0,1,2,3",
      "GROUPS rank=2 stage=0 replica=1 pipeline=2,3 pipeline_rank=0 dp=0,2 dp_rank=1 holders=0,1,2,3 holders_fn=0,1,2,3",
      "GROUPS rank=3 stage=1 replica=1 pipeline=2,3 pipeline_rank=1 dp=1,3 dp_rank=1 holders=0,1,2,3 holders_fn=0,1,2,3",
  });
}

TEST(CommGroups, FourStagesOneReplica) {
  expect_groups(4, 1, {
      "GROUPS rank=0 stage=0 replica=0 pipeline=0,1,2,3 pipeline_rank=0 dp=0 dp_rank=0 holders=0,3 holders_fn=0,3",
      "GROUPS rank=1 stage=1 replica=0 pipeline=0,1,2,3 pipeline_rank=1 dp=1 dp_rank=0 holders=1,2 holders_fn=1,2",
      "GROUPS rank=2 stage=2 replica=0 pipeline=0,1,2,3 pipeline_rank=2 dp=2 dp_rank=0 holders=1,2 holders_fn=1,2",
      "GROUPS rank=3 stage=3 replica=0 pipeline=0,1,2,3 pipeline_rank=3 dp=3 dp_rank=0 holders=0,3 holders_fn=0,3",
  });
}

TEST(CommGroups, OddStagesMiddleStageHoldsBothCopies) {
  expect_groups(3, 1, {
      "GROUPS rank=0 stage=0 replica=0 pipeline=0,1,2 pipeline_rank=0 dp=0 dp_rank=0 holders=0,2 holders_fn=0,2",
      "GROUPS rank=1 stage=1 replica=0 pipeline=0,1,2 pipeline_rank=1 dp=1 dp_rank=0 holders=1 holders_fn=1",
      "GROUPS rank=2 stage=2 replica=0 pipeline=0,1,2 pipeline_rank=2 dp=2 dp_rank=0 holders=0,2 holders_fn=0,2",
  });
}

TEST(CommGroups, WorldSizeNotStagesTimesReplicasIsRefused) {
  Launch r = worker(4, "groups 3 1");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("parallel.stages x parallel.data_parallel: 3 x 1 = 3 processes, but mpirun started 4"),
            std::string::npos)
      << r.out;
}

TEST(CommP2P, PingPongTwoRanksManyMicroBatchesInFlight) {
  Launch r = worker(2, "pingpong 6");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count_lines(r.out, "PINGPONG OK"), 2) << r.out;
  EXPECT_EQ(count_lines(r.out, "FAIL"), 0) << r.out;
}

TEST(CommP2P, FourStagePipelineOutOfOrderWaits) {
  Launch r = worker(4, "pingpong 5");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count_lines(r.out, "PINGPONG OK"), 4) << r.out;
}

TEST(CommAllReduce, SmallBucketsSplitBuffersAndFuseOthers) {
  // 73526 floats in 8 buffers, 1024-float buckets: boundaries fall inside buffers.
  Launch r = worker(3, "allreduce 4096");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count_lines(r.out, "ALLREDUCE OK rank="), 3) << r.out;
  std::regex re("ALLREDUCE OK rank=0 buckets=(\\d+) fused=(\\d+)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, re)) << r.out;
  EXPECT_EQ(std::stoi(m[1]), (73526 + 1023) / 1024);
  EXPECT_GE(std::stoi(m[2]), 1);
  EXPECT_LT(std::stoi(m[2]), std::stoi(m[1]));  // most buckets are slices of the big buffer, in place
}

TEST(CommAllReduce, DefaultBucketFusesEverything) {
  Launch r = worker(2, "allreduce");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ALLREDUCE OK rank=1 buckets=1 fused=1"), std::string::npos) << r.out;
}

// Same inputs, same np: the same bits on every rank (checked by the worker) and in every run.
TEST(CommAllReduce, FourRanksSameBitsEveryRun) {
  std::regex re("ALLREDUCE OK rank=3 buckets=8 fused=\\d+ bits=([0-9a-f]+)");
  std::string bits[2];
  for (std::string& b : bits) {
    Launch r = worker(4, "allreduce 40000");
    ASSERT_EQ(r.status, 0) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.out, m, re)) << r.out;
    b = m[1];
  }
  EXPECT_EQ(bits[0], bits[1]);
}

TEST(CommAllReduce, PackedUpperTrianglesOfSymmetricMatrices) {
  Launch r = worker(3, "symmetric");
  ASSERT_EQ(r.status, 0) << r.out;
  // 1 + 15 + 561 upper-triangle entries.
  EXPECT_EQ(count_lines(r.out, "SYMMETRIC OK rank="), 3) << r.out;
  EXPECT_NE(r.out.find("packed=577"), std::string::npos) << r.out;
}

TEST(CommAllReduce, ChimeraStageCopiesSummedAcrossPairedDevices) {
  Launch r = worker(4, "chimera 4 1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count_lines(r.out, "CHIMERA OK"), 4) << r.out;
}

TEST(CommAllReduce, ChimeraWithDataParallelism) {
  Launch r = worker(4, "chimera 2 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count_lines(r.out, "CHIMERA OK"), 4) << r.out;
}

TEST(CommCollectives, BroadcastFromLastRank) {
  Launch r = worker(3, "broadcast");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count_lines(r.out, "BROADCAST OK"), 3) << r.out;
}

// All ranks share one steady_clock here, so the true offset is 0 and the estimate must lie
// within half the kept round trip of it.
TEST(CommClock, OffsetsOnOneHostAreWithinHalfTheRoundTrip) {
  Launch r = worker(3, "clock");
  ASSERT_EQ(r.status, 0) << r.out;
  std::regex re("CLOCK rank=(\\d+) offset_ns=(-?\\d+) rtt_ns=(\\d+)");
  auto lines = lines_starting(r.out, "CLOCK");
  ASSERT_EQ(lines.size(), 3u) << r.out;
  for (const std::string& l : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(l, m, re)) << l;
    long long off = std::stoll(m[2]), rtt = std::stoll(m[3]);
    if (m[1] == "0") {
      EXPECT_EQ(off, 0);
      continue;
    }
    EXPECT_GT(rtt, 0) << l;
    EXPECT_LE(std::llabs(off), rtt / 2 + 1) << l;
  }
}

// A SIGKILLed rank: OpenMPI notices the death and aborts the job (or else the watchdog does);
// the other ranks, blocked in a receive and an all-reduce with the dead rank, must not hang: the
// job ends by itself, not by the guard.
TEST(CommFaults, KilledRankEndsTheJob) {
  Launch r = worker(3, "kill", kGuard);
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.status, kGuardStatus) << "the guard ended the job\n" << r.out;
  EXPECT_TRUE(r.out.find("signal 9") != std::string::npos || r.out.find("no progress") != std::string::npos)
      << r.out;
  EXPECT_EQ(count_lines(r.out, "FAIL"), 0) << r.out;
}

// A peer that is alive but silent is only caught by the watchdog. Order, not wall time: the
// watchdog (2 s) must end the job before the sleeper wakes (60 s, both counted from the same
// barrier, so a slow start or tear-down of mpirun does not count); a sleeper that wakes prints
// "STALL ... woke" and releases rank 0, which then reports FAIL.
TEST(CommFaults, WatchdogAbortsWhenAPeerMakesNoProgress) {
  Launch r = worker(2, "stall 60", "PF_COMM_TIMEOUT=2");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0: no progress from rank 1 for 2 s (peer lost or stopped?)"), std::string::npos) << r.out;
  EXPECT_EQ(count_lines(r.out, "STALL"), 0) << "the job outlived the sleeper\n" << r.out;
  EXPECT_EQ(count_lines(r.out, "FAIL"), 0) << r.out;
}

TEST(CommFaults, ShortMessageEndsTheJobWithAMessage) {
  Launch r = worker(2, "mismatch 10 20");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("has 10 floats, expected 20"), std::string::npos) << r.out;
}

TEST(CommFaults, LongMessageEndsTheJobWithAnMpiError) {
  Launch r = worker(2, "mismatch 20 10");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0: MPI error in a pipeline receive: MPI_ERR_TRUNCATE"), std::string::npos) << r.out;
}

// Behaviour, not speed: a rank blocked 2 s in a receive must sleep, not poll a core.
TEST(CommWait, IdleRankUsesAlmostNoCpu) {
  Launch r = worker(2, "idle 2");
  ASSERT_EQ(r.status, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("IDLE wall=([0-9.]+) cpu=([0-9.]+)"))) << r.out;
  EXPECT_GE(std::stod(m[1]), 1.9) << r.out;
  EXPECT_LT(std::stod(m[2]), 0.3) << r.out;
}

TEST(Pfrun, AddsTheFlagsForThisMachine) {
  Launch r = run("-np 4 --mca btl self,vader /bin/true x", "PFRUN_DRY=1 OMP_NUM_THREADS= OPENBLAS_NUM_THREADS=");
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* flag : {"--oversubscribe", "--bind-to none", "--mca mpi_yield_when_idle 1", "-x OMP_NUM_THREADS",
                           "-x OPENBLAS_NUM_THREADS", "-np 4", "--mca btl self,vader /bin/true x"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << "\n" << r.out;
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::string threads = std::to_string(std::max(1u, cores / 4));
  EXPECT_NE(r.out.find("OMP_NUM_THREADS=" + threads + " OPENBLAS_NUM_THREADS=" + threads), std::string::npos) << r.out;
}

TEST(Pfrun, HostfileLeavesThreadsToEachHostAndKeepsUserThreads) {
  std::string hosts = testing::TempDir() + "pfrun_hosts";
  std::ofstream(hosts) << "# two hosts\nnode1 slots=2\n\nnode2 slots=2\n";
  // This host's core count says nothing about the others: no thread count is made up here.
  Launch r = run("-np 4 --hostfile " + hosts + " prog", "PFRUN_DRY=1 OMP_NUM_THREADS= OPENBLAS_NUM_THREADS=");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("-x OMP_NUM_THREADS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--hostfile " + hosts), std::string::npos) << r.out;
  Launch h = run("-np 4 --host node1,node2 prog", "PFRUN_DRY=1 OMP_NUM_THREADS= OPENBLAS_NUM_THREADS=");
  EXPECT_EQ(h.out.find("-x OMP_NUM_THREADS"), std::string::npos) << h.out;
  // The user's own settings reach every host.
  Launch u = run("-np 4 --hostfile " + hosts + " prog",
                 "PFRUN_DRY=1 OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS= OPENBLAS_CORETYPE=Haswell OMP_WAIT_POLICY=PASSIVE");
  for (const char* s : {"OMP_NUM_THREADS=3 OPENBLAS_NUM_THREADS=3", "-x OMP_NUM_THREADS", "-x OPENBLAS_NUM_THREADS",
                        "-x OPENBLAS_CORETYPE", "-x OMP_WAIT_POLICY"})
    EXPECT_NE(u.out.find(s), std::string::npos) << s << "\n" << u.out;
}

TEST(Pfrun, RequiresRankCount) {
  Launch r = run("prog");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.out.find("-np N is required"), std::string::npos) << r.out;
}
