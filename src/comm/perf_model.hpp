#pragma once
// Performance models of this machine for the data-parallel K-FAC planners (SPD-KFAC, Shi et al.):
//   all-reduce   t(m) = alpha + beta * m      (m floats; Eq. 14), for the factor tensor fusion
//   broadcast    t(m) = alpha + beta * m      (Eq. 27 with m = d(d+1)/2), for inverse placement
//   inversion    t(d) = c * d^3 + e           (Cholesky potrf + potri is O(d^3); the paper fits an
//                                              exponential on a GPU, a cubic is what a CPU does)
// Each is fitted by least squares on a short measurement over a few sizes at start-up. The
// measurement takes well under a second on one host and is cached in a JSON file keyed by the
// machine (hostname + CPU model), the world size and the threads per rank, so later runs read it.
//
// Every rank must use the same model (the plans derived from it must agree): world rank 0 of the
// communicator reads or writes the cache and broadcasts the numbers.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pf::comm {

struct LinearCost {
  double alpha = 0, beta = 0;  // seconds, seconds per element
  double at(double m) const { return std::max(0.0, alpha + beta * m); }  // a fit may cross 0
};
// Least squares of y = alpha + beta * x. Needs two distinct x and a rising trend (else
// alpha = mean y, beta = 0).
LinearCost fit_linear(const std::vector<double>& x, const std::vector<double>& y);

struct CubicCost {
  double c = 0, e = 0;  // t(d) = c d^3 + e, seconds
  double at(double d) const { return std::max(0.0, c * d * d * d + e); }
};
// Least squares of y = c * d^3 + e (a linear fit against d^3).
CubicCost fit_cubic(const std::vector<double>& d, const std::vector<double>& y);

struct PerfModel {
  LinearCost allreduce;   // of m floats over the communicator
  LinearCost broadcast;   // of m floats from one member to the others
  CubicCost inversion;    // of a d x d factor on one rank
  std::string key;        // what the cache entry is for
  bool from_cache = false;

  // Broadcast of the upper triangle of a d x d symmetric matrix.
  double broadcast_sym(int64_t d) const { return broadcast.at(static_cast<double>(d) * (d + 1) / 2); }
  double allreduce_floats(int64_t m) const { return allreduce.at(static_cast<double>(m)); }
  double invert(int64_t d) const { return inversion.at(static_cast<double>(d)); }
};

std::string perf_model_to_json(const PerfModel& m);
// Throws std::exception on malformed text.
PerfModel perf_model_from_json(const std::string& text);

// "<hostname>-<cpu model>-w<world>-t<threads>", with characters outside [A-Za-z0-9._-] replaced.
std::string machine_key(int world_size, int threads);

// Times one inversion of a d x d factor (seconds), e.g. a KfacFactor's invert on a made-up SPD
// matrix. The comm layer does not know K-FAC; the caller supplies this.
using InversionTimer = std::function<double(int64_t d)>;

// Measures the model collectively over comm (all-reduce and broadcast at a few sizes, inversion
// at a few dimensions on every rank, the slowest rank's time kept); every member gets rank 0's
// fit. Takes a fraction of a second.
PerfModel measure_perf_model(MPI_Comm comm, const InversionTimer& invert, int threads);
// The cached model for this machine, world size and thread count, or a fresh measurement
// (written to the cache atomically by rank 0; a cache that cannot be written is only a warning).
// Collective. cache_dir empty = core/machine.hpp's cache_dir().
PerfModel load_or_measure_perf_model(MPI_Comm comm, const InversionTimer& invert, int threads,
                                     const std::string& cache_dir = "");

}  // namespace pf::comm
