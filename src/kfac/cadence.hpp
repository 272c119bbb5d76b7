#pragma once
// When an inline K-FAC refresh runs (step numbers from 0): curvature at the steps t with
// t % curvature_every == 0, inversion at t % inversion_every == 0; step 0 always refreshes.
// With k = kfac.inverse_every (refresh_cadence, below):
//   inline  {1, k}: curvature every step, inversion every k (k = 1: all K-FAC work every step, on
//           the critical path; k > 1: KAISA's pattern)
//   skip    {k, k}: curvature and inversion only every k ("K-FAC + skip")
// PipeFisher's placement has no cadence: its plan decides.
#include "config/config.hpp"
#include "config/placement.hpp"

#include <cstdint>

namespace pf {

struct KfacCadence {
  int curvature_every = 1, inversion_every = 1;
  bool curvature_step(int64_t t) const { return t % curvature_every == 0; }
  bool inversion_step(int64_t t) const { return t % inversion_every == 0; }
};

// The inline refresh's cadence of kfac.placement = inline or skip: the single-process Trainer's
// and the runtime's inline placement's.
inline KfacCadence refresh_cadence(const KfacConfig& k) {
  return {placement_spec(k).curvature_every, k.inverse_every};
}

}  // namespace pf
