#pragma once
// Helpers for tests that run the built `pipefisher` program (tests/checkpoint, tests/faults): a
// tiny BERT on the committed sample text, one thread per process, a private temporary directory.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace pf_test {

namespace fs = std::filesystem;

inline const std::string kEnv = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ";
inline const std::string kPfrun = PF_SOURCE_DIR "/scripts/pfrun";
inline const std::string kBinary = PF_BINARY;

// The work directory (checkpoints of tens of MB), removed when the program's tests end.
inline fs::path work_dir(const std::string& program) { return scratch_dir(program); }

// Tiny BERT (4 blocks, hidden 32, 6 steps, NVLAMB); `extra` is appended TOML.
inline fs::path tiny_config(const fs::path& dir, const std::string& extra = "") {
  fs::path p = dir / "tiny.toml";
  std::ofstream f(p);
  f << "[model]\narch = \"bert\"\nlayers = 4\nhidden = 32\nheads = 2\nffn = 64\nseq_len = 16\nmax_position = 16\n"
    << "[data]\nvocab = \"bert\"\ntrain_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
    << "valid_file = \"" PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin\"\n"
    << "[optim]\nname = \"nvlamb\"\nlr = 1e-2\nwarmup_steps = 1\n"
    << "[train]\nsteps = 6\nthreads = 1\neval_every = 0\neval_batches = 2\n"
    << "[parallel]\nmicro_batches = 4\nmicro_batch_size = 2\n"
    << extra;
  return p;
}

// "pipefisher train --config CFG --set train.out_dir=DIR/out-NAME --log-json DIR/NAME.jsonl SETS"
inline std::string train_cmd(const fs::path& dir, const std::string& name, const std::string& sets) {
  return kEnv + kBinary + " train --config " + (dir / "tiny.toml").string() + " --set train.out_dir=" +
         (dir / ("out-" + name)).string() + " --log-json " + (dir / (name + ".jsonl")).string() + " " + sets;
}
inline std::string mpi_train_cmd(int np, const fs::path& dir, const std::string& name, const std::string& sets) {
  return kEnv + kPfrun + " -np " + std::to_string(np) + " " + kBinary + " train --config " +
         (dir / "tiny.toml").string() + " --set train.out_dir=" + (dir / ("out-" + name)).string() +
         " --log-json " + (dir / (name + ".jsonl")).string() + " " + sets;
}

// Step number -> JSON record of a run's log.
inline std::map<int64_t, nlohmann::json> read_log(const fs::path& path) {
  std::map<int64_t, nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      out[j["step"].get<int64_t>()] = j;
    }
  return out;
}

inline bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The lines of `out` that pipefisher printed ("pipefisher..."), without mpirun's own (job ids),
// and with the memory available now left out of a refusal that names it ("this machine has 13.8
// GiB (...); at most 1760 threads fit"): other processes move it between two runs.
inline std::string pipefisher_lines(const std::string& out) {
  static const std::regex available("this machine has [^;]*(; at most [0-9]+)?");
  std::istringstream in(out);
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("pipefisher", 0) == 0) kept += std::regex_replace(line, available, "this machine has ...") + "\n";
  return kept;
}

// A `pipefisher train` command line run with --dry-run, then as given: the dry run takes the run's
// own checks (issue 50, item 3), so both end alike, with the same status and the same lines.
// Returns the run's. The dry run goes first: it writes nothing the run could then trip over.
inline Launch run_both_ways(const std::string& cmd) {
  const Launch dry = run(cmd + " --dry-run");
  Launch real = run(cmd);
  EXPECT_EQ(dry.status, real.status) << cmd << "\nrun:\n" << real.out << "--dry-run:\n" << dry.out;
  if (real.status != 0) EXPECT_EQ(pipefisher_lines(dry.out), pipefisher_lines(real.out)) << cmd;
  return real;
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace pf_test
