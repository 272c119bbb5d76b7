// The seams the engines read (seams.hpp).
#include "runtime/seams.hpp"

#include <algorithm>
#include <limits>

namespace pf {

void PoisonStep::poison_inputs(int64_t index, std::vector<MicroBatch>& mbs) const {
  if (step == 0 || index + 1 != step || kind == Kind::loss) return;
  const float bad = kind == Kind::inf ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  for (MicroBatch& mb : mbs) mb.loss_scale = bad;
}

int64_t NoiseSeam::extra_ns(int rank, int64_t index, size_t action, int64_t compute_ns) const {
  double factor = 1;
  if (rank == slow_rank && index + 1 >= slow_from && index + 1 <= slow_to) factor *= slow_factor;
  if (jitter > 0) {
    // splitmix64 of (rank, step, action): a uniform u in [0, 1) that repeats run to run.
    uint64_t z = (static_cast<uint64_t>(rank) << 48) ^ (static_cast<uint64_t>(index) << 20) ^ action;
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    factor *= 1 + jitter * static_cast<double>(z >> 11) * 0x1.0p-53;
  }
  return static_cast<int64_t>(static_cast<double>(std::max<int64_t>(compute_ns, 0)) * (factor - 1));
}

}  // namespace pf
