#include "comm/perf_model.hpp"

#include "comm/wait.hpp"
#include "core/files.hpp"
#include "core/machine.hpp"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pf::comm {

LinearCost fit_linear(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  if (n == 0) return {};
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += x[i], my += y[i];
  mx /= static_cast<double>(n), my /= static_cast<double>(n);
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; ++i) sxx += (x[i] - mx) * (x[i] - mx), sxy += (x[i] - mx) * (y[i] - my);
  // A cost does not fall with size: noise that tilts the line down gives a constant instead.
  if (sxx <= 0 || sxy <= 0) return {my, 0};
  const double beta = sxy / sxx;
  if (my - beta * mx >= 0) return {my - beta * mx, beta};
  // Nor is a cost ever negative: noise that puts the intercept below zero (seen on a loaded
  // machine) gives the least-squares line through the origin instead.
  double sx2 = 0, sxy0 = 0;
  for (size_t i = 0; i < n; ++i) sx2 += x[i] * x[i], sxy0 += x[i] * y[i];
  return {0, sxy0 / sx2};
}

CubicCost fit_cubic(const std::vector<double>& d, const std::vector<double>& y) {
  std::vector<double> d3(d.size());
  for (size_t i = 0; i < d.size(); ++i) d3[i] = d[i] * d[i] * d[i];
  const LinearCost l = fit_linear(d3, y);
  return {l.beta, l.alpha};
}

std::string perf_model_to_json(const PerfModel& m) {
  nlohmann::json j = {{"key", m.key},
                      {"allreduce", {{"alpha", m.allreduce.alpha}, {"beta", m.allreduce.beta}}},
                      {"broadcast", {{"alpha", m.broadcast.alpha}, {"beta", m.broadcast.beta}}},
                      {"inversion", {{"c", m.inversion.c}, {"e", m.inversion.e}}}};
  return j.dump(2) + "\n";
}

PerfModel perf_model_from_json(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  PerfModel m;
  m.key = j.at("key").get<std::string>();
  m.allreduce = {j.at("allreduce").at("alpha").get<double>(), j.at("allreduce").at("beta").get<double>()};
  m.broadcast = {j.at("broadcast").at("alpha").get<double>(), j.at("broadcast").at("beta").get<double>()};
  m.inversion = {j.at("inversion").at("c").get<double>(), j.at("inversion").at("e").get<double>()};
  return m;
}

namespace {

// Seconds of one collective `op` (posted non-blocking, waited for without spinning), the slowest
// member's, averaged over reps after one warm-up.
// Median over reps (after one warm-up) of the slowest member's time: the cores are shared with
// other work, and a median ignores the reps a descheduled rank spoiled.
double median_of_slowest(std::vector<double> t, MPI_Comm comm) {
  MPI_Allreduce(MPI_IN_PLACE, t.data(), static_cast<int>(t.size()), MPI_DOUBLE, MPI_MAX, comm);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class Op>
double time_collective(MPI_Comm comm, int reps, Op op) {
  std::vector<double> t;
  for (int r = 0; r <= reps; ++r) {
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    MPI_Request req = op();
    wait(req, {"perf-model measurement", comm, -1});
    if (r > 0) t.push_back(MPI_Wtime() - t0);
  }
  return median_of_slowest(t, comm);
}

}  // namespace

std::string machine_key(int world_size, int threads) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  // The BLAS kernel family too: inversion costs change with it (Prescott's are ~5x SkylakeX's).
  return file_name_safe(std::string(host) + "-" + cpu_model_name() + "-" + blas_kernel_name() + "-w" + std::to_string(world_size) + "-t" +
                  std::to_string(threads));
}

PerfModel measure_perf_model(MPI_Comm comm, const InversionTimer& invert, int threads) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  PerfModel m;
  m.key = machine_key(size, threads);
  // Sizes spanning a small factor's upper triangle (32: 528 floats) to a large one (1024: 525k).
  const std::vector<int> sizes = {512, 8192, 65536, 262144, 524288};
  std::vector<float> buf(static_cast<size_t>(sizes.back()), 1.0f);
  std::vector<double> x, ar, bc;
  for (int n : sizes) {
    x.push_back(n);
    ar.push_back(time_collective(comm, 5, [&] {
      MPI_Request q;
      check(MPI_Iallreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, comm, &q), "MPI_Iallreduce");
      return q;
    }));
    std::fill(buf.begin(), buf.end(), 1.0f);  // keep the sums finite
    bc.push_back(time_collective(comm, 5, [&] {
      MPI_Request q;
      check(MPI_Ibcast(buf.data(), n, MPI_FLOAT, 0, comm, &q), "MPI_Ibcast");
      return q;
    }));
  }
  m.allreduce = fit_linear(x, ar);
  m.broadcast = fit_linear(x, bc);
  // Inversion on every rank at once (the ranks share the cores as they do in training).
  std::vector<double> dims = {64, 128, 256, 384, 512}, inv;
  for (double d : dims) {
    std::vector<double> t;
    for (int r = 0; r < 3; ++r) t.push_back(invert(static_cast<int64_t>(d)));
    inv.push_back(median_of_slowest(t, comm));
  }
  m.inversion = fit_cubic(dims, inv);
  // Every member uses rank 0's numbers.
  double v[6] = {m.allreduce.alpha, m.allreduce.beta, m.broadcast.alpha, m.broadcast.beta, m.inversion.c, m.inversion.e};
  MPI_Bcast(v, 6, MPI_DOUBLE, 0, comm);
  m.allreduce = {v[0], v[1]};
  m.broadcast = {v[2], v[3]};
  m.inversion = {v[4], v[5]};
  return m;
}

namespace {
// A cost is finite and never negative (an older fit could give a negative intercept).
bool usable(const PerfModel& m) {
  for (double x : {m.allreduce.alpha, m.allreduce.beta, m.broadcast.alpha, m.broadcast.beta, m.inversion.c,
                   m.inversion.e})
    if (!std::isfinite(x) || x < 0) return false;
  return true;
}
}  // namespace

PerfModel load_or_measure_perf_model(MPI_Comm comm, const InversionTimer& invert, int threads,
                                     const std::string& cache_dir) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const std::string key = machine_key(size, threads);
  const std::string dir = cache_dir.empty() ? pf::cache_dir() : cache_dir;
  const std::string path = dir + "/perf-model-" + key + ".json";
  // Rank 0 reads; the six numbers (or "none") travel by broadcast.
  double v[7] = {0, 0, 0, 0, 0, 0, 0};
  if (rank == 0) {
    std::ifstream f(path);
    if (f) {
      std::stringstream ss;
      ss << f.rdbuf();
      try {
        const PerfModel c = perf_model_from_json(ss.str());
        if (c.key == key && !usable(c))
          spdlog::warn("perf model cache '{}' holds a negative or non-finite cost: measuring again", path);
        else if (c.key == key)
          v[0] = 1, v[1] = c.allreduce.alpha, v[2] = c.allreduce.beta, v[3] = c.broadcast.alpha,
          v[4] = c.broadcast.beta, v[5] = c.inversion.c, v[6] = c.inversion.e;
      } catch (const std::exception& e) {
        spdlog::warn("perf model cache '{}' unreadable ({}): measuring again", path, e.what());
      }
    }
  }
  MPI_Bcast(v, 7, MPI_DOUBLE, 0, comm);
  if (v[0] == 1) {
    PerfModel m;
    m.key = key;
    m.from_cache = true;
    m.allreduce = {v[1], v[2]};
    m.broadcast = {v[3], v[4]};
    m.inversion = {v[5], v[6]};
    return m;
  }
  PerfModel m = measure_perf_model(comm, invert, threads);
  if (rank == 0) {
    try {
      std::filesystem::create_directories(dir);
      write_file_atomic(path, perf_model_to_json(m));
    } catch (const std::exception& e) {
      spdlog::warn("perf model cache '{}' not written: {}", path, e.what());
    }
  }
  return m;
}

}  // namespace pf::comm
