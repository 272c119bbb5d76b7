// Timed simulator: closed forms, communication, collectives, gaps, memory model, profiles.
#include "schedule/generators.hpp"
#include "schedule/lower.hpp"
#include "schedule/validate.hpp"
#include "sim/memory.hpp"
#include "sim/profile.hpp"
#include "sim/sim.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace pf {
namespace {

CostModel uniform(double tf, double tb) {
  CostModel c;
  c.stages[0].forward = tf;
  c.stages[0].backward = tb;
  return c;
}

TEST(ClosedForm, GPipeAndOneFOneB) {
  // (N + D - 1)(T_f + T_b); at N = D the paper's (2D - 1)(T_f + T_b).
  for (const char* name : {"gpipe", "1f1b"})
    for (int D = 1; D <= 8; ++D)
      for (int N : {D, 2 * D, 3 * D, 1}) {
        for (auto [tf, tb] : {std::pair{1.0, 2.0}, {1.25, 1.75}, {3.0, 0.5}}) {
          Timeline tl = simulate(make_schedule(name, D, N), uniform(tf, tb));
          EXPECT_DOUBLE_EQ(tl.step_time, (N + D - 1) * (tf + tb)) << name << " D=" << D << " N=" << N;
          for (int d = 0; d < D; ++d) {
            EXPECT_DOUBLE_EQ(tl.busy[d], N * (tf + tb));
            EXPECT_DOUBLE_EQ(tl.bubble[d], (D - 1) * (tf + tb));
          }
          EXPECT_DOUBLE_EQ(tl.mean_utilization(), double(N) / (N + D - 1));
        }
      }
}

TEST(ClosedForm, Chimera) {
  for (int D = 2; D <= 8; D += 2) {
    // The paper's T_b = 2 T_f: D*T_f + (2D - 2)*T_b exactly.
    for (double tf : {1.0, 0.75, 5.0}) {
      Timeline tl = simulate(make_chimera(D, D), uniform(tf, 2 * tf));
      EXPECT_DOUBLE_EQ(tl.step_time, D * tf + (2 * D - 2) * 2 * tf) << "D=" << D;
    }
  }
}

TEST(ClosedForm, ChimeraGeneralTb) {
  // The order is chosen for the actual T_f/T_b (make_chimera's candidates, replayed with them):
  // the paper's closed form D*T_f + (2D-2)*T_b at N = D for every T_b >= T_f tried (the fixed
  // 1:2 order missed it below 2 T_f: D = 8, T_f = T_b = 1 gave 24 instead of 22).
  for (int D = 2; D <= 8; D += 2)
    for (double r : {1.0, 1.25, 1.5, 1.69, 1.75, 2.0, 2.5, 3.0})
      for (double tf : {1.0, 0.5}) {
        Timeline tl = simulate(make_chimera(D, D, tf, r * tf), uniform(tf, r * tf));
        EXPECT_NEAR(tl.step_time, D * tf + (2 * D - 2) * r * tf, 1e-9) << "D=" << D << " Tb/Tf=" << r;
      }
  EXPECT_DOUBLE_EQ(simulate(make_chimera(8, 8, 1, 1), uniform(1, 1)).step_time, 22);
  // T_b < T_f: above the closed form (its critical path assumes the backward is the longer).
  for (int D = 2; D <= 8; D += 2)
    EXPECT_GE(simulate(make_chimera(D, D, 2, 1), uniform(2, 1)).step_time, D * 2.0 + (2 * D - 2) * 1.0);
}

TEST(ClosedForm, ChimeraWorkPerDeviceAndConcatenatedUnits) {
  for (int D = 2; D <= 8; D += 2)
    for (int k = 1; k <= 3; ++k) {
      const int N = k * D;
      Timeline tl = simulate(make_chimera(D, N), uniform(1, 2));
      for (int d = 0; d < D; ++d) EXPECT_DOUBLE_EQ(tl.busy[d], N * 3.0);
      // Concatenated units overlap: never slower than k separate steps, never faster than the work.
      EXPECT_LE(tl.step_time, k * (D * 1.0 + (2 * D - 2) * 2.0));
      EXPECT_GE(tl.step_time, N * 3.0);
      // Fewer bubbles than 1F1B at the same N.
      EXPECT_LT(tl.step_time, simulate(make_1f1b(D, N), uniform(1, 2)).step_time);
    }
  // N = kD as k basic units: the units fill each other's bubbles, so the bubble stays that of one
  // unit (within one backward) while the work grows k-fold (it grew with k before: D = 8, T_b = 2:
  // 12 at N = 8, 15 at N = 16; now 12, 11, 12 for k = 1, 2, 3).
  for (double r : {1.0, 1.5, 1.69, 2.0, 3.0})
    for (int D = 2; D <= 8; D += 2) {
      const double one = simulate(make_chimera(D, D, 1, r), uniform(1, r)).step_time - D * (1 + r);
      for (int k = 2; k <= 4; ++k) {
        const double bubble = simulate(make_chimera(D, k * D, 1, r), uniform(1, r)).step_time - k * D * (1 + r);
        EXPECT_LE(bubble, one + r + 1e-9) << "D=" << D << " k=" << k << " Tb/Tf=" << r;
      }
    }
  EXPECT_DOUBLE_EQ(simulate(make_chimera(8, 16), uniform(1, 2)).step_time - 16 * 3, 11);
}

TEST(ClosedForm, NaiveRunsMicroBatchesOneAfterAnother) {
  for (int D = 1; D <= 6; ++D)
    for (int N = 1; N <= 4; ++N)
      EXPECT_DOUBLE_EQ(simulate(make_naive(D, N), uniform(1.5, 2.5)).step_time, N * D * 4.0);
}

TEST(ClosedForm, InterleavedShrinksTheBubbleByV) {
  // Megatron: bubble (D-1)(T_f+T_b)/V per device when each of the V chunks takes 1/V of the time.
  for (int D = 2; D <= 6; ++D)
    for (int V : {2, 3})
      for (int k : {1, 2}) {
        const int N = k * D;
        Timeline tl = simulate(make_interleaved(D, N, V), uniform(1.0 / V, 2.0 / V));
        EXPECT_NEAR(tl.step_time, N * 3.0 + (D - 1) * 3.0 / V, 1e-12) << "D=" << D << " V=" << V << " N=" << N;
      }
}

TEST(ZeroBubble, H1BubbleIsAThirdOfOneFOneBAtNEqualsD) {
  // T_f = T_i = T_w = 1 (T_b = 2): 1F1B's bubble is 3(D-1), ZB-H1's exactly D-1 at N = D (the
  // published "a third of 1F1B"), and for N = 2D, 3D too (ClosedForm.ZeroBubbleH1).
  // Both hold at most D micro-batches in flight.
  for (int D = 2; D <= 8; ++D)
    for (int N : {D, 2 * D, 3 * D}) {
      Timeline z = simulate(make_zb_h1(D, N), uniform(1, 2));
      Timeline o = simulate(make_1f1b(D, N), uniform(1, 2));
      EXPECT_DOUBLE_EQ(o.bubble[0], 3.0 * (D - 1));
      if (N == D) {
        EXPECT_DOUBLE_EQ(z.step_time, 3.0 * N + D - 1) << "D=" << D;
      }
      EXPECT_GE(z.bubble[0], D - 1.0);
      EXPECT_LE(z.bubble[0], D + 2.0);
      EXPECT_LT(z.mean_bubble(), o.mean_bubble());
      for (int d = 0; d < D; ++d) EXPECT_LE(z.peak_in_flight[d], D);
      EXPECT_EQ(z.peak_in_flight[0], o.peak_in_flight[0]);
    }
  EXPECT_DOUBLE_EQ(simulate(make_zb_h1(1, 3), uniform(1, 2)).step_time, 9);
}

// T_f, T_i (the input gradient) and T_w per micro-batch and stage; W != I in most triples.
CostModel split(double tf, double ti, double tw) {
  CostModel c = uniform(tf, ti + tw);
  c.stages[0].input_grad = ti;
  c.stages[0].weight_grad = tw;
  return c;
}
const std::vector<std::array<double, 3>> split_times = {{1, 1, 1},    {1, 2, 1},   {2, 1, 1}, {1, 1, 0.5},
                                                        {1.5, 1, 0.75}, {1, 1.5, 1}, {3, 2, 1}, {2, 2, 1}};

TEST(ClosedForm, ZeroBubbleH1) {
  // Qi et al.: bubble (D-1)(T_f+T_i-T_w) over N(T_f+T_i+T_w) of work, for T_w <= T_f (a longer W
  // no longer hides in the cool-down).
  for (int D = 1; D <= 8; ++D)
    for (int N : {D, 2 * D, 3 * D + 1})
      for (auto [f, i, w] : split_times) {
        const Timeline tl = simulate(make_zb_h1(D, N), split(f, i, w));
        EXPECT_DOUBLE_EQ(tl.step_time, N * (f + i + w) + (D - 1) * (f + i - w))
            << "D=" << D << " N=" << N << " times " << f << "," << i << "," << w;
      }
}

TEST(ClosedForm, ZeroBubbleH2) {
  // Qi et al.'s parallelogram: device d idles (D-1-d)(T_f+T_i-2T_w) between its first F and its
  // last W (the paper's bubble, at d = 0, while 2T_w <= T_f+T_i); one step is the last stage's
  // (D-1)T_f start plus its N(T_f+T_i+T_w) without a gap, once N >= 2D-1 reaches a steady state.
  auto times = split_times;
  times.insert(times.end(), {{1, 1, 2}, {1, 2, 2}});
  for (int D = 1; D <= 8; ++D)
    for (int N : {2 * D - 1, 2 * D, 3 * D + 1})
      for (auto [f, i, w] : times) {
        SCOPED_TRACE(fmt::format("D={} N={} times {},{},{}", D, N, f, i, w));
        const Timeline tl = simulate(make_zb_h2(D, N), split(f, i, w));
        EXPECT_DOUBLE_EQ(tl.step_time, (D - 1) * f + N * (f + i + w));
        double last = 0;
        for (const TimedAction& t : tl.per_device[0]) last = std::max(last, t.end);
        if (2 * w <= f + i) EXPECT_NEAR(last - N * (f + i + w), (D - 1) * (f + i - 2 * w), 1e-9);
        for (int d = 0; d < D; ++d) EXPECT_EQ(tl.peak_in_flight[d], std::min(2 * D - 1, N));
      }
}

TEST(ZeroBubble, H2BeatsH1WithTwiceTheMemory) {
  // One step of H2 is (D-1)(T_i - T_w) shorter than H1's (equal at T_i = T_w: then H2's gain is
  // the parallelogram's, which only a next step overlapping this one's tail would collect).
  for (int D = 2; D <= 8; ++D) {
    const Timeline h1 = simulate(make_zb_h1(D, 3 * D), split(1, 1.5, 1));
    const Timeline h2 = simulate(make_zb_h2(D, 3 * D), split(1, 1.5, 1));
    EXPECT_DOUBLE_EQ(h1.step_time - h2.step_time, (D - 1) * 0.5) << "D=" << D;
    EXPECT_EQ(h1.peak_in_flight[0], D);
    EXPECT_EQ(h2.peak_in_flight[0], 2 * D - 1);
  }
}

TEST(InFlight, OneFOneBHoldsDMinusStageGPipeHoldsN) {
  for (int D = 1; D <= 6; ++D)
    for (int N = 1; N <= 3 * D; ++N) {
      Timeline o = simulate(make_1f1b(D, N), uniform(1, 2));
      Timeline g = simulate(make_gpipe(D, N), uniform(1, 2));
      for (int d = 0; d < D; ++d) {
        EXPECT_EQ(o.peak_in_flight[d], std::min(D - d, N));
        EXPECT_EQ(g.peak_in_flight[d], N);
      }
    }
}

TEST(Communication, PointToPointLatencyOnEveryCrossing) {
  // One micro-batch: D forwards, D backwards, 2(D-1) messages of latency + bytes / bandwidth.
  for (int D = 1; D <= 5; ++D) {
    CostModel c = uniform(1, 2);
    c.p2p_latency = 0.25;
    c.p2p_bandwidth = 1000;
    c.stages[0].activation_bytes = 500;  // + 0.5 per message
    EXPECT_DOUBLE_EQ(simulate(make_1f1b(D, 1), c).step_time, D * 3.0 + 2 * (D - 1) * 0.75);
  }
}

TEST(Communication, LoweredScheduleTimesLikeTheComputeOnlyOne) {
  for (const std::string name : {"gpipe", "1f1b", "chimera", "interleaved", "zb-h1", "zb-h2"}) {
    CostModel c = uniform(1.0, 2.0);
    c.p2p_latency = 0.3;
    Schedule s = make_schedule(name, 4, 8, 2);
    Timeline a = simulate(s, c);
    Timeline b = simulate(lower_communication(s), c);
    EXPECT_DOUBLE_EQ(a.step_time, b.step_time) << name;
    for (int d = 0; d < 4; ++d) EXPECT_DOUBLE_EQ(a.busy[d], b.busy[d]) << name;  // messages are not busy time
  }
}

TEST(Communication, CollectiveStartsTogetherAndCostsAlphaPlusBetaBytes) {
  CostModel c = uniform(1, 2);
  c.allreduce_alpha = 0.5;
  c.allreduce_beta = 0.001;
  c.stages[0].grad_bytes = 2000;  // 0.5 + 2 = 2.5
  Schedule s = lower_communication(make_chimera(4, 4), {true, false});
  Timeline tl = simulate(s, c);
  // Stage 1 lives on device 1 (down) and device 2 (up): their ALLREDUCE starts at one time.
  auto find = [&](int d, int stage) {
    for (const TimedAction& t : tl.per_device[d])
      if (t.action.kind == Kind::ALLREDUCE && t.action.stage == stage) return t;
    ADD_FAILURE();
    return TimedAction{};
  };
  TimedAction x = find(1, 1), y = find(2, 1);
  EXPECT_DOUBLE_EQ(x.start, y.start);
  EXPECT_DOUBLE_EQ(x.end - x.start, 2.5);
  // Each device syncs two stages after its work; the last one ends the step.
  Timeline plain = simulate(make_chimera(4, 4), uniform(1, 2));
  EXPECT_GE(tl.step_time, plain.step_time + 2 * 2.5);
}

TEST(Timeline, GapsSumToTheBubbleAndStartsFollowDependencies) {
  for (const std::string name : {"gpipe", "1f1b", "chimera", "interleaved", "zb-h1", "zb-h2"}) {
    Schedule s = make_schedule(name, 4, 8, 2);
    Timeline tl = simulate(s, uniform(1.0, 2.0));
    for (int d = 0; d < 4; ++d) {
      double idle = 0;
      for (const Gap& g : tl.gaps(d)) {
        EXPECT_LT(g.start, g.end);
        idle += g.end - g.start;
      }
      EXPECT_NEAR(idle, tl.bubble[d], 1e-12) << name;
      for (size_t i = 1; i < tl.per_device[d].size(); ++i)
        EXPECT_GE(tl.per_device[d][i].start, tl.per_device[d][i - 1].end);
    }
  }
}

TEST(Timeline, PerActionDurationsOverrideTheCostModel) {
  Schedule s = make_1f1b(2, 2);
  std::vector<std::vector<double>> dur(2);
  for (int d = 0; d < 2; ++d) dur[d].assign(s.per_device[d].size(), 1.0);
  dur[1][1] = 10;  // 1B0 on the last stage
  Timeline tl = simulate(s, uniform(5, 5), &dur);
  // 0F0 [0,1) 1F0 [1,2) 1B0 [2,12) 1F1 [12,13) 1B1 [13,14) 0B0 [12,13) 0B1 [14,15)
  EXPECT_DOUBLE_EQ(tl.step_time, 15);
  EXPECT_DOUBLE_EQ(tl.per_device[0][2].start, 12);
}

TEST(Timeline, KfacKindsAreTimedAndCountAsBusy) {
  // The planner's use: K-FAC actions after the pipeline work of each device.
  Schedule s = make_gpipe(2, 2);
  for (int d = 0; d < 2; ++d) {
    s.per_device[d].push_back({Kind::CURV_A, d, 0, 0, 0});
    s.per_device[d].push_back({Kind::CURV_A, d, 0, 1, 0});
    s.per_device[d].push_back({Kind::INV_A, d, 0, -1, 0});
    s.per_device[d].push_back({Kind::PREC, d, 0, -1, -1});
  }
  EXPECT_NO_THROW(validate(s));
  CostModel c = uniform(1, 2);
  c.stages[0].curvature = 4;  // per micro-batch, A and B of 1 layer: CURV_A takes 2
  c.stages[0].inversion = 6;  // INV_A takes 3
  c.stages[0].precondition = 1;
  Timeline tl = simulate(s, c);
  EXPECT_DOUBLE_EQ(tl.busy[0], 2 * 3 + 2 + 2 + 3 + 1);
  EXPECT_DOUBLE_EQ(tl.step_time, 9 + 8);  // GPipe D=2 N=2: 9, then 8 of K-FAC on device 0
}

TEST(Timeline, DeadlockedScheduleIsRefused) {
  Schedule s = make_naive(2, 2);
  s.per_device[1] = {act(Kind::F, 1, 1), act(Kind::B, 1, 1), act(Kind::F, 1, 0), act(Kind::B, 1, 0)};
  EXPECT_THROW(simulate(s, uniform(1, 2)), ScheduleError);
}

TEST(Memory, PaperModelTerms) {
  StageMemory m{10, 3, 2, 1, 7};  // M_theta, M_act, M_err^peak, M_err^save, M_kron
  for (int D : {2, 4}) {
    const int N = 2 * D;
    MemoryReport g = memory_model(make_gpipe(D, N), simulate(make_gpipe(D, N), uniform(1, 2)), {m});
    EXPECT_DOUBLE_EQ(g.m_pipe, 2 * 10 + N * 3 + 2);
    EXPECT_DOUBLE_EQ(g.m_pipe_in_flight, g.m_pipe);  // GPipe holds all N
    EXPECT_DOUBLE_EQ(g.m_kfac, 7 + 7 + N * 1);
    MemoryReport o = memory_model(make_1f1b(D, N), simulate(make_1f1b(D, N), uniform(1, 2)), {m});
    EXPECT_EQ(o.device, 0);
    EXPECT_DOUBLE_EQ(o.m_pipe, g.m_pipe);
    EXPECT_DOUBLE_EQ(o.m_pipe_in_flight, 2 * 10 + D * 3 + 2);  // 1F1B holds D on stage 0
    // Chimera: two stage copies per device, N/2 micro-batches through each.
    MemoryReport c = memory_model(make_chimera(D, N), simulate(make_chimera(D, N), uniform(1, 2)), {m});
    EXPECT_DOUBLE_EQ(c.params, 2 * 2 * 10);
    EXPECT_DOUBLE_EQ(c.activations, N * 3);
    // M_curv = M_inv per stage as the paper defines them (its Chimera curves: 1x, not 2x).
    EXPECT_DOUBLE_EQ(c.m_kfac, 7 + 7 + N * 1);
    // Activation recomputation: one micro-batch's activations per hosted stage.
    MemoryReport gr = memory_model(make_gpipe(D, N), simulate(make_gpipe(D, N), uniform(1, 2)), {m}, true);
    EXPECT_DOUBLE_EQ(gr.m_pipe, 2 * 10 + 3 + 2);
    EXPECT_DOUBLE_EQ(gr.m_kfac, g.m_kfac);
    MemoryReport cr = memory_model(make_chimera(D, N), simulate(make_chimera(D, N), uniform(1, 2)), {m}, true);
    EXPECT_DOUBLE_EQ(cr.activations, 2 * 3);
    EXPECT_LT(cr.m_pipe, c.m_pipe);
  }
}

std::string temp_file(const std::string& name, const std::string& body) {
  auto p = pf_test::scratch_dir("test_sim") / name;
  std::ofstream(p) << body;
  return p.string();
}

const char* kPaperHeader =
    "bs,time_f,time_b,time_kron,time_inv,time_prec,mem_param,mem_act,mem_peak_err,mem_save_err,mem_kron\n";

TEST(Profile, PaperCsvRowsAndLayerScaling) {
  std::string path = temp_file("paper.csv", std::string(kPaperHeader) +
                                                "8,3.5,5.25,7.0,80.85,8.9,27.0,40.0,10.0,6.0,168.0\n"
                                                "32,10.39,16.28,27.45,80.85,8.90,27.0,160.0,40.0,24.0,168.0\n");
  auto rows = read_paper_csv(path);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].bs, 32);
  EXPECT_DOUBLE_EQ(rows[1].time_b, 16.28);
  Profile p = profile_from_row(rows[0], 3);
  EXPECT_DOUBLE_EQ(p.cost.stages[0].forward, 10.5);
  EXPECT_DOUBLE_EQ(p.cost.stages[0].backward, 15.75);
  EXPECT_DOUBLE_EQ(p.cost.stages[0].inversion, 3 * 80.85);
  EXPECT_EQ(p.cost.stages[0].layers, 3);
  EXPECT_DOUBLE_EQ(p.memory[0].kron, 3 * 168.0);
  EXPECT_DOUBLE_EQ(p.memory[0].act, 120);
}

TEST(Profile, MalformedPaperCsvIsRefused) {
  for (std::string body : {std::string("bs,time_f\n1,2\n"), std::string(kPaperHeader) + "8,1,2,3\n",
                           std::string(kPaperHeader) + "8,1,2,3,4,5,6,7,8,9,x\n", std::string(kPaperHeader),
                           std::string(kPaperHeader) + "0,1,2,3,4,5,6,7,8,9,10\n", std::string("")}) {
    std::string path = temp_file("bad.csv", body);
    try {
      read_paper_csv(path);
      ADD_FAILURE() << body;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--profile", 0), 0u) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_THROW(read_paper_csv("/nonexistent/profile.csv"), UsageError);
}

TEST(Profile, ProjectJson) {
  std::string path = temp_file("p.json", R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 16,
    "stages": [{"forward": 1.5, "backward": 3, "curvature": 2, "layers": 2, "mem_act": 4},
               {"forward": 2.5, "backward": 5, "input_grad": 2, "weight_grad": 3}],
    "p2p": {"latency": 0.1, "bandwidth": 100}, "allreduce": {"alpha": 0.2, "beta": 0.01}})");
  Profile p = read_profile_json(path);
  EXPECT_EQ(p.micro_batch_size, 16);
  ASSERT_EQ(p.cost.stages.size(), 2u);
  EXPECT_DOUBLE_EQ(p.cost.stages[1].forward, 2.5);
  EXPECT_DOUBLE_EQ(p.cost.duration(act(Kind::I, 0, 0)), 1.5);  // half the backward
  EXPECT_DOUBLE_EQ(p.cost.duration(act(Kind::W, 1, 0)), 3);
  EXPECT_DOUBLE_EQ(p.cost.duration({Kind::CURV_A, 0, 0, 0, 1}), 0.5);  // 2 / (2 * 2 layers)
  EXPECT_DOUBLE_EQ(p.cost.p2p_latency, 0.1);
  EXPECT_DOUBLE_EQ(p.cost.allreduce_beta, 0.01);
  EXPECT_DOUBLE_EQ(p.memory[0].act, 4);
  // Non-uniform stages: 1F1B with N = 1 is the sum of all stage times.
  EXPECT_DOUBLE_EQ(simulate(make_1f1b(2, 1), p.cost).step_time, 1.5 + 2.5 + 5 + 3 + 2 * 0.1);
  for (std::string bad : {std::string("{"), std::string(R"({"format": "x", "version": 1})"),
                          std::string(R"({"format": "pipefisher-profile", "version": 2})"),
                          std::string(R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4, "stages": []})"),
                          std::string(R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4, "stages": [{"forward": 1}]})"),
                          std::string(R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4, "stages": [{"forward": -1, "backward": 1}]})")}) {
    std::string b = temp_file("bad.json", bad);
    try {
      read_profile_json(b);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("--profile", 0), 0u) << e.what();
    }
  }
}

// M_W (mem_deferred, optional): read into the stage's memory, 0 when absent, and refused like
// the other sizes when negative, naming the key.
TEST(Profile, DeferredOutputGradientMemory) {
  const std::string head = R"({"format": "pipefisher-profile", "version": 1, "micro_batch_size": 4, "stages": [)";
  const Profile p = read_profile_json(temp_file("w.json", head + R"({"forward": 1, "backward": 2, "mem_act": 3, "mem_deferred": 0.5},
                                                                    {"forward": 1, "backward": 2, "mem_act": 3}]})"));
  ASSERT_EQ(p.memory.size(), 2u);
  EXPECT_DOUBLE_EQ(p.memory[0].deferred, 0.5);
  EXPECT_DOUBLE_EQ(p.memory[1].deferred, 0);
  try {
    read_profile_json(temp_file("w_bad.json", head + R"({"forward": 1, "backward": 2, "mem_deferred": -1}]})"));
    ADD_FAILURE() << "mem_deferred = -1 was read";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'stages[0].mem_deferred' must be a finite number"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pf
