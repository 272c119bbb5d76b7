// comm_worker: the MPI side of tests/comm. test_comm launches it with scripts/pfrun and
// checks its output and exit status. Each mode prints "<MODE> rank=R ..." lines, and "OK" lines
// only after checking exact values itself; any mismatch prints "FAIL ..." and exits 1.
//
//   groups D W        print each rank's stage, replica and communicator members (world ranks)
//   pingpong K        K micro-batches through a pipeline of all ranks and back, out-of-order waits
//   allreduce BYTES   bucketed all-reduce of integer-valued buffers vs the exact sum, and bitwise
//                     agreement of a non-integer sum across ranks
//   symmetric         packed upper-triangle all-reduce
//   broadcast         broadcast from the last rank
//   chimera D W       each stage's gradient summed over both Chimera copies and all replicas
//   clock             clock offsets (one host: true offset is 0)
//   kill              the last rank SIGKILLs itself while the others wait for it
//   stall SECONDS     the last rank sleeps SECONDS outside MPI; the others' watchdog must fire
//                     before it wakes (it then prints "STALL rank=R woke" and sends to them)
//   mismatch S E      rank 1 sends S floats where rank 0 expects E
//   latency MS REPS   (measurement) how late a sleeping wait notices a message sent after MS
//   idle SECONDS      rank 0 waits SECONDS for rank 1 and reports its own CPU time
#include "comm/clock.hpp"
#include "comm/collectives.hpp"
#include "comm/p2p.hpp"
#include "comm/world.hpp"
#include "core/error.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace pf::comm;

namespace {

int g_fail = 0;
void fail(const std::string& msg) {
  std::printf("FAIL %s\n", msg.c_str());
  std::fflush(stdout);
  g_fail = 1;
}

std::vector<int> world_members(MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  MPI_Group g, wg;
  MPI_Comm_group(c, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  std::vector<int> in(n), out(n);
  for (int i = 0; i < n; ++i) in[i] = i;
  MPI_Group_translate_ranks(g, n, in.data(), wg, out.data());
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return out;
}

int mode_groups(const World& w, int D, int W) {
  Groups g = make_groups(w, D, W);
  std::printf("GROUPS rank=%d stage=%d replica=%d pipeline=%s pipeline_rank=%d dp=%s dp_rank=%d holders=%s "
                "holders_fn=%s\n",
                g.rank, g.stage, g.replica, fmt::format("{}", fmt::join(world_members(g.pipeline), ",")).c_str(),
                g.pipeline.rank(), fmt::format("{}", fmt::join(world_members(g.data_parallel), ",")).c_str(),
                g.data_parallel.rank(), fmt::format("{}", fmt::join(world_members(g.stage_holders), ",")).c_str(),
                fmt::format("{}", fmt::join(g.holders(g.stage), ",")).c_str());
  return 0;
}

// Value j of the message (kind, mb) produced by stage s: distinct for every field, exact in float.
float payload(int kind, int mb, int s, size_t j) { return float(kind * 1000000 + mb * 10000 + s * 1000 + int(j % 997)); }
size_t msg_len(int mb) { return 100 + 37 * mb; }  // sizes differ per micro-batch

// A pipeline of all ranks: stage s receives mb's activation from s-1 (posted early, for all mbs,
// waited for in reverse order), checks it, forwards its own; the last stage returns gradients.
int mode_pingpong(const World& w, int K) {
  Groups g = make_groups(w, w.size(), 1);
  const int D = g.stages, s = g.stage;
  TagScheme tags(D, K);
  P2P p2p(g.pipeline, 4 * K);
  std::vector<std::vector<float>> act_in(K), act_out(K), grad_in(K), grad_out(K);
  for (int mb = 0; mb < K; ++mb) {
    act_in[mb].resize(msg_len(mb));
    act_out[mb].resize(msg_len(mb));
    grad_in[mb].resize(msg_len(mb));
    grad_out[mb].resize(msg_len(mb));
  }
  auto expect = [&](const std::vector<float>& v, int kind, int mb, int from, int step) {
    for (size_t j = 0; j < v.size(); ++j)
      if (v[j] != payload(kind, mb, from, j) + step) {
        fail(fmt::format("rank {} kind {} mb {} from {} step {}: [{}] = {} expected {}", w.rank(), kind, mb, from,
                         step, j, v[j], payload(kind, mb, from, j) + step));
        return;
      }
  };
  for (int step = 0; step < 3; ++step) {  // buffers and slots reused across steps
    std::vector<Ticket> recv_act(K), recv_grad(K), sends;
    // Post every receive early.
    for (int mb = 0; mb < K; ++mb) {
      if (s > 0) recv_act[mb] = p2p.irecv(act_in[mb], s - 1, tags.tag(MsgKind::Activation, s, mb));
      if (s < D - 1) recv_grad[mb] = p2p.irecv(grad_in[mb], s + 1, tags.tag(MsgKind::ActivationGrad, s, mb));
    }
    // Forward: wait for activations in reverse order (all are in flight at once).
    for (int mb = K - 1; mb >= 0; --mb) {
      if (s > 0) {
        p2p.wait(recv_act[mb]);
        expect(act_in[mb], 0, mb, s - 1, step);
      }
    }
    for (int mb = 0; mb < K; ++mb) {
      for (size_t j = 0; j < act_out[mb].size(); ++j) act_out[mb][j] = payload(0, mb, s, j) + step;
      if (s < D - 1) sends.push_back(p2p.isend(act_out[mb], s + 1, tags.tag(MsgKind::Activation, s + 1, mb)));
    }
    // Backward: gradients, waited for odd micro-batches first.
    for (int mb = 0; mb < K; ++mb) {
      for (size_t j = 0; j < grad_out[mb].size(); ++j) grad_out[mb][j] = payload(1, mb, s, j) + step;
      if (s > 0) sends.push_back(p2p.isend(grad_out[mb], s - 1, tags.tag(MsgKind::ActivationGrad, s - 1, mb)));
    }
    if (s < D - 1) {
      for (int parity : {1, 0})
        for (int mb = parity; mb < K; mb += 2) {
          p2p.wait(recv_grad[mb]);
          expect(grad_in[mb], 1, mb, s + 1, step);
        }
    }
    for (Ticket t : sends) p2p.wait(t);
    if (p2p.in_flight() != 0) fail(fmt::format("rank {}: {} requests still in flight", w.rank(), p2p.in_flight()));
  }
  if (!g_fail) std::printf("PINGPONG OK rank=%d\n", w.rank());
  return g_fail;
}

// Integer-valued, so every sum is exact whatever the order.
float int_value(int rank, size_t buf, size_t j) { return float(int((rank + 1) * 7 + buf * 131 + j % 1009) - 500); }

int mode_allreduce(const World& w, size_t bucket_bytes) {
  const std::vector<size_t> sizes = {3, 1000, 5, 70000, 17, 1, 0, 2500};
  std::vector<std::vector<float>> bufs(sizes.size());
  std::vector<std::span<float>> spans;
  for (size_t b = 0; b < sizes.size(); ++b) {
    bufs[b].resize(sizes[b]);
    spans.emplace_back(bufs[b]);
  }
  BucketedAllReduce ar(MPI_COMM_WORLD, spans, bucket_bytes);
  for (int step = 0; step < 3; ++step) {
    for (size_t b = 0; b < sizes.size(); ++b)
      for (size_t j = 0; j < sizes[b]; ++j) bufs[b][j] = int_value(w.rank(), b, j) + step;
    if (step == 0) {
      ar.start();
    } else if (step == 1) {  // as backward would: last buffers first, progress in between
      for (size_t b = sizes.size(); b-- > 0;) {
        ar.ready(b);
        ar.progress();
      }
    } else {  // as the adaptive filler does: test between units until every bucket is summed
      for (size_t b = sizes.size(); b-- > 1;) ar.ready(b);
      if (ar.test()) {
        fail(fmt::format("rank {}: test() says done with buffer 0 not ready", w.rank()));
        return 1;
      }
      ar.ready(0);
      while (!ar.test()) {
      }
    }
    ar.wait();
    for (size_t b = 0; b < sizes.size(); ++b)
      for (size_t j = 0; j < sizes[b]; ++j) {
        float want = 0;
        for (int r = 0; r < w.size(); ++r) want += int_value(r, b, j) + step;
        if (bufs[b][j] != want) {
          fail(fmt::format("rank {} step {} buffer {} [{}] = {} expected {}", w.rank(), step, b, j, bufs[b][j], want));
          return 1;
        }
      }
  }
  // Non-integer values: sums are rounded, but every rank must hold the same bits.
  uint64_t x = 0x9E3779B97F4A7C15ull * (w.rank() + 1);
  for (auto& v : bufs)
    for (float& f : v) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      f = float(x >> 40) / float(1 << 24) - 0.5f;
    }
  ar.start();
  ar.wait();
  uint64_t h = 1469598103934665603ull;
  for (auto& v : bufs)
    for (float f : v) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      h = (h ^ u) * 1099511628211ull;
    }
  std::vector<uint64_t> all(w.size());
  MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (uint64_t o : all)
    if (o != h) fail(fmt::format("rank {}: all-reduce bits differ across ranks", w.rank()));
  if (!g_fail)
    std::printf("ALLREDUCE OK rank=%d buckets=%zu fused=%zu bits=%016llx\n", w.rank(), ar.buckets(),
                ar.fused_buckets(), (unsigned long long)h);
  return g_fail;
}

int mode_symmetric(const World& w) {
  const std::vector<int> ns = {1, 5, 33};
  std::vector<std::vector<float>> mats(ns.size());
  std::vector<SymMatrix> sym;
  auto upper = [](int rank, size_t m, int i, int j) { return float((rank + 1) * (i * 100 + j) + int(m)); };
  for (size_t m = 0; m < ns.size(); ++m) {
    int n = ns[m];
    mats[m].assign(size_t(n) * n, 0.0f);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)  // lower triangle is junk on input: it must be ignored
        mats[m][size_t(i) * n + j] = j >= i ? upper(w.rank(), m, i, j) : -12345.0f;
    sym.push_back({mats[m].data(), n});
  }
  SymmetricAllReduce ar(MPI_COMM_WORLD, sym, 64 * sizeof(float));  // several buckets
  ar.start();
  ar.wait();
  for (size_t m = 0; m < ns.size(); ++m) {
    int n = ns[m];
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        float want = 0;
        for (int r = 0; r < w.size(); ++r) want += upper(r, m, std::min(i, j), std::max(i, j));
        if (mats[m][size_t(i) * n + j] != want) {
          fail(fmt::format("rank {} matrix {} ({},{}) = {} expected {}", w.rank(), m, i, j, mats[m][size_t(i) * n + j],
                           want));
          return 1;
        }
      }
  }
  std::printf("SYMMETRIC OK rank=%d packed=%zu\n", w.rank(), ar.packed_size());
  return 0;
}

int mode_broadcast(const World& w) {
  const int root = w.size() - 1;
  std::vector<float> v(12345);
  for (size_t j = 0; j < v.size(); ++j) v[j] = w.rank() == root ? float(j) * 0.5f : -1.0f;
  broadcast(v, root, MPI_COMM_WORLD);
  for (size_t j = 0; j < v.size(); ++j)
    if (v[j] != float(j) * 0.5f) {
      fail(fmt::format("rank {} [{}] = {}", w.rank(), j, v[j]));
      return 1;
    }
  std::printf("BROADCAST OK rank=%d\n", w.rank());
  return 0;
}

// Chimera gradient sums on a D x W layout: device i holds the down-pipeline's copy of stage i and
// the up-pipeline's copy of stage D-1-i; each stage's sum runs over both copies on every replica.
// Paired devices finish their two stages in opposite orders (as Chimera's backward does).
float chimera_grad(int rank, int s, size_t j) { return float(rank * 1000 + s * 10 + int(j % 7)); }

int mode_chimera(const World& w, int D, int W) {
  Groups g = make_groups(w, D, W);
  const int down = g.stage, up = g.mirror_stage(g.stage);
  if (down == up) {  // odd D: the middle device holds both copies; nothing paired to test
    std::printf("CHIMERA OK rank=%d (middle)\n", w.rank());
    return 0;
  }
  int cmp = 0;
  MPI_Comm_compare(g.holders_comm(down), g.holders_comm(up), &cmp);
  if (cmp != MPI_CONGRUENT) fail(fmt::format("rank {}: the two holders communicators differ in members", w.rank()));
  const size_t n = 3000;  // > 2 buckets of 1024 floats
  std::vector<float> gd(n), gu(n);
  for (size_t j = 0; j < n; ++j) {
    gd[j] = chimera_grad(w.rank(), down, j);
    gu[j] = chimera_grad(w.rank(), up, j);
  }
  BucketedAllReduce rd(g.holders_comm(down), {std::span<float>(gd)}, 4096);
  BucketedAllReduce ru(g.holders_comm(up), {std::span<float>(gu)}, 4096);
  rd.start();  // device i: stage i then D-1-i; device D-1-i: stage D-1-i then i
  ru.start();
  ru.wait();
  rd.wait();
  auto expect = [&](const std::vector<float>& v, int s) {
    for (size_t j = 0; j < n; ++j) {
      float want = 0;
      for (int r : g.holders(s)) want += chimera_grad(r, s, j);
      if (v[j] != want) {
        fail(fmt::format("rank {} stage {} [{}] = {} expected {}", w.rank(), s, j, v[j], want));
        return;
      }
    }
  };
  expect(gd, down);
  expect(gu, up);
  if (!g_fail) std::printf("CHIMERA OK rank=%d\n", w.rank());
  return g_fail;
}

int mode_clock(const World& w) {
  ClockOffsets c = estimate_clock_offsets(MPI_COMM_WORLD);
  if (w.rank() == 0)
    for (int r = 0; r < w.size(); ++r)
      std::printf("CLOCK rank=%d offset_ns=%lld rtt_ns=%lld\n", r, (long long)c.offset_ns[r], (long long)c.rtt_ns[r]);
  return 0;
}

int mode_kill(const World& w) {
  const int victim = w.size() - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (w.rank() == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::raise(SIGKILL);
  }
  std::printf("KILL waiting rank=%d\n", w.rank());
  std::fflush(stdout);
  if (w.rank() == 0) {  // a pipeline receive from the dead rank
    P2P p2p(MPI_COMM_WORLD, 1);
    std::vector<float> buf(16);
    p2p.wait(p2p.irecv(buf, victim, 0));
  } else {  // an all-reduce including it
    std::vector<float> buf(16, 1.0f);
    BucketedAllReduce ar(MPI_COMM_WORLD, {std::span<float>(buf)});
    ar.start();
    ar.wait();
  }
  std::printf("FAIL rank %d: a wait on a dead rank returned\n", w.rank());
  return 1;
}

int mode_stall(const World& w, double seconds) {
  const int sleeper = w.size() - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  P2P p2p(MPI_COMM_WORLD, 1);
  std::vector<float> buf(16);
  if (w.rank() == sleeper) {  // alive, but silent: only the watchdog can notice
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    // Reached only if the watchdog did not end the job first; the message then ends the others'
    // waits, so a broken watchdog fails the test instead of hanging it.
    std::printf("STALL rank=%d woke\n", w.rank());
    std::fflush(stdout);
    for (int r = 0; r < sleeper; ++r) p2p.wait(p2p.isend(std::span<const float>(buf), r, 0));
    return 0;
  }
  p2p.wait(p2p.irecv(buf, sleeper, 0));
  std::printf("FAIL rank %d: the watchdog did not fire\n", w.rank());
  return 1;
}

// Rank 1 sends `sent` floats where rank 0 expects `expected`: a schedule/model-split mismatch
// must end the job with a message, whichever side is larger.
int mode_mismatch(const World& w, int sent, int expected) {
  P2P p2p(MPI_COMM_WORLD, 1);
  std::vector<float> buf(std::max(sent, expected), 1.0f);
  if (w.rank() == 1) p2p.wait(p2p.isend(std::span<const float>(buf.data(), sent), 0, 3));
  if (w.rank() == 0) {
    p2p.wait(p2p.irecv(std::span<float>(buf.data(), expected), 1, 3));
    std::printf("FAIL rank 0: a mismatched message was accepted\n");
    return 1;
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 0 aborts the job before reaching it
  return 0;
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + 1e-6 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Not a test: how late a sleeping wait notices a message. Rank 1 computes (sleeps) `ms` before
// each send and stamps the send time; rank 0 (same host, same steady_clock) reports how long
// after that stamp its wait returned, and its CPU use while waiting.
int mode_latency(const World& w, double ms, int reps) {
  P2P p2p(MPI_COMM_WORLD, 2);
  int64_t stamp = 0;
  std::span<float> msg(reinterpret_cast<float*>(&stamp), 2);
  double total_us = 0, worst_us = 0, cpu0 = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  cpu0 = cpu_seconds();
  for (int i = 0; i < reps; ++i) {
    if (w.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
      stamp = steady_now_ns();
      p2p.wait(p2p.isend(msg, 0, 9));
    } else if (w.rank() == 0) {
      p2p.wait(p2p.irecv(msg, 1, 9));
      double late = 1e-3 * double(steady_now_ns() - stamp);
      total_us += late;
      worst_us = std::max(worst_us, late);
    }
  }
  if (w.rank() == 0)
    std::printf("LATENCY wait=%.1fms reps=%d mean_late_us=%.1f worst_late_us=%.1f cpu_share=%.3f\n", ms, reps,
                total_us / reps, worst_us, (cpu_seconds() - cpu0) / (reps * ms * 1e-3));
  return 0;
}

int mode_idle(const World& w, double seconds) {
  std::vector<float> buf(1000, 0.0f);
  P2P p2p(MPI_COMM_WORLD, 2);
  MPI_Barrier(MPI_COMM_WORLD);
  if (w.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    std::fill(buf.begin(), buf.end(), 3.0f);
    p2p.wait(p2p.isend(buf, 0, 5));
  } else if (w.rank() == 0) {
    double c0 = cpu_seconds();
    auto t0 = std::chrono::steady_clock::now();
    p2p.wait(p2p.irecv(buf, 1, 5));
    double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double cpu = cpu_seconds() - c0;
    if (buf[999] != 3.0f) fail("idle: wrong contents");
    std::printf("IDLE wall=%.3f cpu=%.3f\n", wall, cpu);
  }
  return g_fail;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    World world(&argc, &argv);
    std::string mode = argc > 1 ? argv[1] : "";
    auto arg = [&](int i, double dflt) { return argc > i ? std::atof(argv[i]) : dflt; };
    int rc = 2;
    if (mode == "groups") rc = mode_groups(world, int(arg(2, 1)), int(arg(3, 1)));
    else if (mode == "pingpong") rc = mode_pingpong(world, int(arg(2, 6)));
    else if (mode == "allreduce") rc = mode_allreduce(world, size_t(arg(2, double(kDefaultBucketBytes))));
    else if (mode == "symmetric") rc = mode_symmetric(world);
    else if (mode == "broadcast") rc = mode_broadcast(world);
    else if (mode == "chimera") rc = mode_chimera(world, int(arg(2, 2)), int(arg(3, 1)));
    else if (mode == "clock") rc = mode_clock(world);
    else if (mode == "kill") rc = mode_kill(world);
    else if (mode == "stall") rc = mode_stall(world, arg(2, 10));
    else if (mode == "mismatch") rc = mode_mismatch(world, int(arg(2, 10)), int(arg(3, 20)));
    else if (mode == "latency") rc = mode_latency(world, arg(2, 10), int(arg(3, 50)));
    else if (mode == "idle") rc = mode_idle(world, arg(2, 2));
    else std::fprintf(stderr, "comm_worker: unknown mode '%s'\n", mode.c_str());
    std::fflush(stdout);
    return rc;
  } catch (const pf::UsageError& e) {
    std::fprintf(stderr, "comm_worker: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_worker: internal error: %s\n", e.what());
    return 1;
  }
}
