#pragma once
// The paper's performance model tables (Figures 5, 6, 9, 10): for each micro-batch size (profile
// row), pipeline depth D and N = k*D, simulate one step and derive
//   t_pipe      step time;  t_bubble  mean bubble per device
//   t_prec      precondition per step (worst device: all stages it hosts; a stage held by two
//               pipeline copies, Chimera's, counts once over its copies: the paper's per stage)
//   t_curv_inv  N*T_curv + T_inv on the worst device (must fit into bubbles; T_inv per stage,
//               shared by its copies as in the planner's Chimera stage groups)
//   ratio       t_curv_inv / t_bubble: about the steps per curvature refresh
//   throughput  sequences/s of the plain pipeline, of PipeFisher (t_pipe + t_prec), of naive
//               K-FAC (everything added to the step) and of K-FAC skipping curvature+inversion
//               to refresh every ceil(ratio) steps, the same frequency as PipeFisher
//   m_pipe, m_kfac  the memory model (memory.hpp), worst device
// With `recompute` (the paper's R) every backward first repeats its forward: T_b + T_f in the
// simulated step (so bubble = T_pipe - N (2 T_f + T_b)), and M_act once per hosted stage.
#include "sim/profile.hpp"

#include <string>
#include <vector>

namespace pf {

struct SweepRow {
  std::string schedule;
  int micro_batch_size = 0, stages = 0, micro_batches = 0;
  double t_pipe = 0, t_bubble = 0, t_prec = 0, t_curv_inv = 0, ratio = 0;
  double throughput_pipe = 0, throughput_pipefisher = 0, throughput_kfac = 0, throughput_kfac_skip = 0;
  double m_pipe = 0, m_kfac = 0;
  bool recompute = false;
};

struct SweepSpec {
  std::string schedule = "chimera";
  std::vector<int> stages = {4, 8, 16, 32};
  std::vector<int> n_multiples = {1, 2, 3};  // N = k * D
  int virtual_stages = 2;
  double ms_per_unit = 1;  // throughput is per second: time unit in milliseconds
  bool recompute = false;  // activation recomputation (R)
  double zb_memory = 1;    // zb-auto's memory limit (times 1F1B's peak)
};

// `profiles`: one uniform-stage Profile per micro-batch size. Combinations the schedule does not
// define (e.g. chimera with odd D) are skipped.
std::vector<SweepRow> run_sweep(const SweepSpec& spec, const std::vector<Profile>& profiles);
std::string sweep_csv(const std::vector<SweepRow>& rows);

}  // namespace pf
