#pragma once
// Schedule generators: compute-only schedules (F/B, or I/W for zero-bubble). D = devices,
// N = micro-batches per step. Undefined combinations throw UsageError naming the flag.
//   naive        no micro-batching: micro-batches run one after another through all stages
//   gpipe        all forwards, then all backwards (flush)
//   1f1b         PipeDream-flush: warm-up forwards, one-forward-one-backward, cool-down
//   interleaved  Megatron's interleaved 1F1B with V model chunks per device (N multiple of D)
//   chimera      two bidirectional pipelines (D even, N = kD: k basic units concatenated), the
//                order chosen for the given T_f and T_b
//   zb-h1        zero-bubble H1: split backward I + W, W fills the bubbles, 1F1B memory
//   zb-h2        zero-bubble H2: twice the warm-up forwards (2D-1 in flight), no inner bubble (N >= D)
//   zb-auto      Qi et al.'s automatic zero-bubble order (zb_auto.hpp) for given T_F, T_I, T_W, T_comm
//                and a memory limit of X times 1F1B's peak
//   zb-v         the same heuristic on 2D stages placed in a V (stage s on device s for s < D, on
//                2D-1-s otherwise), within 1F1B's peak memory
#include "config/enums.hpp"
#include "schedule/schedule.hpp"
#include "schedule/zb_auto.hpp"

#include <string>
#include <vector>

namespace pf {

Schedule make_naive(int D, int N);
Schedule make_gpipe(int D, int N);
Schedule make_1f1b(int D, int N);
Schedule make_interleaved(int D, int N, int V);
Schedule make_chimera(int D, int N, double tf = 1, double tb = 2);
Schedule make_zb_h1(int D, int N);
Schedule make_zb_h2(int D, int N);
// Times of one micro-batch on one of the schedule's stages (for zb-v a chunk: half a device's
// layers); zb-v ignores zb.memory.
Schedule make_zb_auto(int D, int N, const ZbSpec& zb);
Schedule make_zb_v(int D, int N, const ZbSpec& zb);

// V is used by interleaved only, tf/tb (one micro-batch's forward and backward on one stage) by
// chimera only, whose order is chosen for them, zb by zb-auto and zb-v.
Schedule make_schedule(ScheduleName name, int D, int N, int V = 2, double tf = 1, double tb = 2, const ZbSpec& zb = {});
// The same by the name a user writes ("1f1b"): UsageError naming --schedule when unknown.
Schedule make_schedule(const std::string& name, int D, int N, int V = 2, double tf = 1, double tb = 2,
                       const ZbSpec& zb = {});
// A schedule's name parsed once at the edge: UsageError naming `flag` when unknown.
ScheduleName schedule_name(const std::string& name, const std::string& flag);
const std::vector<std::string>& schedule_names();  // in the generators' order
// The work bound of a generated schedule before it is made (sim/limits.hpp's check_schedule_size):
// each micro-batch passes each model chunk as F and B with a send and a receive each way, 6 D N
// actions per chunk a device holds (interleaved V, zb-v 2, the others 1).
int64_t schedule_size_bound(ScheduleName name, int D, int N, int V);

}  // namespace pf
