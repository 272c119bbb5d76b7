#pragma once
// One stage's factors summed over its copies (data-parallel replicas, Chimera's twin). Each copy
// accumulates the curvature of its own micro-batches; summing the copies' accumulators and row
// counts before the commit gives every copy the factor one process builds from all of them, as
// gradients are summed. Row counts travel as floats with the factors (exact below 2^24).
// Example: copy 0 accumulated A's sum S0 over 3 rows, copy 1 S1 over 5; after the sum both
// commit S0 + S1 as the factor of 8 rows.
// The K-FAC service (runtime/units/kfac_service.hpp: sum_factors) sums every factor at once, blocking
// (sum_factors_over_copies); the DistributedKfac fuses and overlaps its own messages, with the
// same row counts (factor_rows) and the same commit (commit_summed).
#include "kfac/preconditioner.hpp"

#include <mpi.h>

#include <cstddef>
#include <vector>

namespace pf {

// Factor (layer, s)'s local row count, as it travels with the factors.
float factor_rows(const KfacPreconditioner& pre, size_t layer, Side s);
// Commits factor (layer, s) from its summed accumulator and summed row count; false when nothing
// was accumulated.
bool commit_summed(KfacPreconditioner& pre, size_t layer, Side s, double loss_scale, float summed_rows);
// Collective over `copies`, blocking: every factor's accumulator (layer by layer, A then B; none
// with `factors` false, when every copy skips the cycle's curvature) and the row counts, summed.
// Returns the summed row counts, [2 * layer + side]; the caller commits (commit_summed).
std::vector<float> sum_factors_over_copies(KfacPreconditioner& pre, MPI_Comm copies, bool factors);

}  // namespace pf
