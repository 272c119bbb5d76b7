#pragma once
// The machine's peak, what MFU divides by: the best rate of a square sgemm on the BLAS kernel in
// use with this process's threads, as the paper's GPUs are rated by their fp32 peak. Measured once
// per machine (host, CPU, kernel family, threads) in about a third of a second and cached as
// cache_dir()/sgemm-peak-<key>.json, so that every run on the machine divides by the same number.
// A measurement taken while the machine is busy (1-minute load average above half its cores) is
// used but not cached: it would understate the peak for every later run. A cache that cannot be
// read or written costs a measurement, never the run.
#include <string>

namespace pf {

struct PeakFlops {
  double flops_per_s = 0;  // one process with its threads
  bool from_cache = false;
  bool busy = false;       // measured while the machine was busy: not cached
  std::string cache_path;  // where it is (or would be) cached
};

// "<hostname>-<cpu model>-<kernel>-t<threads>", file-name safe.
std::string peak_key(int threads);
// Best of a few n x n x n sgemms (n = 1024) after one warm-up, with the current thread count.
double measure_sgemm_peak();
// The cached peak for num_threads(), or a measurement written to the cache.
PeakFlops sgemm_peak();

}  // namespace pf
