// Issue 20 items 3, 8 and 12 at the command line: a run under an address-space limit either fits
// and trains or is refused at once naming the limit (it spun forever in OpenBLAS's allocator);
// ranks launched with different configurations (mpirun's MPMD syntax) refuse to start, naming
// the key; token files are mapped, so a file larger than memory trains and a broken one is
// refused naming the key and the file; `eval --batches` is bounded by the validation split.
// Commands that hung before run under `timeout`, generous, so a hang fails instead of blocking.
#include "../checkpoint/cli.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("run_limits"); }

// `cmd` (which may start with VAR=value assignments, hence env) stopped after `seconds`: a hang
// ends as a failure (status 124, or 137 when SIGTERM is not enough), not a stalled suite. TERM
// first, so that mpirun takes its ranks down with it.
Launch run_within(int seconds, const std::string& cmd) {
  return run("timeout -k 10 " + std::to_string(seconds) + " env " + cmd);
}

// The tiny run as one shell command under `ulimit -v kib`, OpenBLAS's thread count left to the
// library (unset, as a user's shell has it: its workers then start as it loads).
std::string limited_train(long kib, const std::string& name) {
  return "sh -c 'ulimit -v " + std::to_string(kib) + "; exec env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS " +
         kBinary + " train --config " + (dir() / "tiny.toml").string() + " --set train.out_dir=" +
         (dir() / ("out-" + name)).string() + " --steps 2'";
}

// Item 3: 200 MB spun at 200% CPU for more than 10 minutes; now the check refuses it at once,
// with the limit, what is mapped and what the run needs; a generous limit trains.
TEST(RunLimits, AddressSpaceLimitIsRefusedAtOnceOrTheRunFits) {
  tiny_config(dir());
  const Launch low = run_within(120, limited_train(200000, "as-low"));
  EXPECT_EQ(low.status, 2) << low.out;
  EXPECT_EQ(std::count(low.out.begin(), low.out.end(), '\n'), 1) << low.out;
  EXPECT_TRUE(contains(low.out, "pipefisher: ulimit -v: the address-space limit (RLIMIT_AS) is 195.3 MiB: this "
                                "process has ")) << low.out;
  EXPECT_TRUE(contains(low.out, "OpenBLAS buffer") && contains(low.out, "raise the limit to at least")) << low.out;
  EXPECT_FALSE(fs::exists(dir() / "out-as-low"));
  const Launch high = run_within(600, limited_train(4000000, "as-high"));
  EXPECT_EQ(high.status, 0) << high.out;
  EXPECT_TRUE(fs::exists(dir() / "out-as-high" / "model.safetensors")) << high.out;
  // eval runs the model too: it spun the same way (at its first product) instead of refusing.
  const Launch eval = run_within(120, "sh -c 'ulimit -v 200000; exec env -u OPENBLAS_NUM_THREADS -u OMP_NUM_THREADS " +
                                          kBinary + " eval --config " + (dir() / "tiny.toml").string() + " --init " +
                                          (dir() / "out-as-high" / "model.safetensors").string() + " --batches 2'");
  EXPECT_EQ(eval.status, 2) << eval.out;
  EXPECT_TRUE(contains(eval.out, "pipefisher: ulimit -v: the address-space limit (RLIMIT_AS) is 195.3 MiB")) << eval.out;
}

// Item 8: `mpirun -np 1 prog A : -np 1 prog B` with two configurations trained silently apart (a
// learning rate, a data seed), aborted unnamed (a shape) or blamed the network (train.steps).
TEST(RunLimits, RanksWithDifferentConfigurationsRefuseToStart) {
  tiny_config(dir());
  const std::string prog = kBinary + " train --config " + (dir() / "tiny.toml").string() +
                           " --set parallel.data_parallel=2 --set train.out_dir=";
  const struct {
    std::string a, b, line;
  } cases[] = {
      {"--set optim.lr=1e-3", "--set optim.lr=2e-3", "optim.lr: 0.001 on rank 0 but 0.002 on rank 1"},
      {"--set data.seed=1", "--set data.seed=2", "data.seed: 1 on rank 0 but 2 on rank 1"},
      {"--set model.hidden=32", "--set model.hidden=64", "model.hidden: 32 on rank 0 but 64 on rank 1"},
      {"--steps 3", "--steps 4", "train.steps: 3 on rank 0 but 4 on rank 1"},
  };
  int k = 0;
  for (const auto& c : cases) {
    const fs::path out = dir() / ("out-mpmd" + std::to_string(k++));
    const Launch r = run_within(300, kEnv + kPfrun + " -np 1 " + prog + out.string() + " " + c.a + " : -np 1 " + prog +
                                         out.string() + " " + c.b);
    EXPECT_EQ(r.status, 2) << c.a << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "pipefisher: " + c.line + ": every rank must run one configuration (rank 1 differs "
                                "from rank 0")) << r.out;
    EXPECT_FALSE(fs::exists(out)) << c.a << ": written before the check";
  }
  // The same configuration on both sides of the MPMD syntax trains.
  const fs::path out = dir() / "out-mpmd-same";
  const Launch same = run_within(600, kEnv + kPfrun + " -np 1 " + prog + out.string() + " --steps 2 : -np 1 " + prog +
                                          out.string() + " --steps 2");
  EXPECT_EQ(same.status, 0) << same.out;
  EXPECT_TRUE(fs::exists(out / "model.safetensors")) << same.out;
}

// Item 12: a 100 GB sparse data.train_file was read whole ("internal error: std::bad_alloc",
// exit 1). Holes read as [PAD] (id 0): a valid corpus, larger than this machine's memory, that
// trains, shuffled (its windows are too many for a stored permutation).
TEST(RunLimits, TokenFileLargerThanMemoryTrains) {
  tiny_config(dir());
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  meminfo >> key >> kib;
  ASSERT_EQ(key, "MemTotal:");
  const uint64_t bytes = std::max<uint64_t>(uint64_t{64} << 30, 2 * kib * 1024) / 2 * 2;
  const fs::path big = dir() / "larger-than-memory.bin";
  std::ofstream(big, std::ios::binary).flush();
  fs::resize_file(big, bytes);
  const Launch r = run_within(600, train_cmd(dir(), "sparse", "--set data.train_file=" + big.string() + " --steps 2"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(contains(r.out, "bad_alloc")) << r.out;
  EXPECT_EQ(read_log(dir() / "sparse.jsonl").size(), 2u) << r.out;
  fs::remove(big);
}

// Item 12: broken token files are refused with one line naming the key and the file.
TEST(RunLimits, BrokenTokenFilesAreRefusedNamingKeyAndFile) {
  tiny_config(dir());
  const fs::path empty = dir() / "empty.bin", odd = dir() / "odd.bin", outside = dir() / "outside.bin",
                 folder = dir() / "folder.bin", fifo = dir() / "fifo.bin";
  std::ofstream(empty, std::ios::binary).flush();
  std::ofstream(odd, std::ios::binary) << "abc";
  std::ofstream(outside, std::ios::binary).write("\x01\x00\xff\xff", 4);
  fs::create_directories(folder);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    fs::path file;
    std::string what;
  } cases[] = {
      {empty, "token file is empty"},
      {odd, "token file has an odd number of bytes (3)"},
      {outside, "token id 65535 at position 1 is >= the vocabulary size 30522"},
      {folder, "is a directory, not a token file"},
      {fifo, "is not a regular file"},
  };
  int k = 0;
  for (const auto& c : cases) {
    for (const std::string key : {"data.train_file", "data.valid_file"}) {
      const Launch r = run_within(120, train_cmd(dir(), "broken" + std::to_string(k++), "--set " + key + "=" +
                                                                                          c.file.string()));
      EXPECT_EQ(r.status, 2) << r.out;
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
      EXPECT_TRUE(contains(r.out, "pipefisher: " + key + ": '" + c.file.string() + "': " + c.what)) << r.out;
    }
  }
}

// Item 12: `eval --batches 2147483647` scored the split over and over for ever.
TEST(RunLimits, EvalBatchesBeyondTheValidationSplitAreRefused) {
  tiny_config(dir());
  const fs::path weights = dir() / "eval-weights.safetensors";
  const Launch t = run(train_cmd(dir(), "eval-train", "--steps 1 --save " + weights.string()));
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string eval = kEnv + kBinary + " eval --config " + (dir() / "tiny.toml").string() + " --init " +
                           weights.string() + " --batches ";
  const Launch r = run_within(120, eval + "2147483647");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_TRUE(contains(r.out, "pipefisher: --batches: 2147483647 micro-batches of 2 sequences are more than data.valid_file '")) << r.out;
  EXPECT_TRUE(contains(r.out, "(0 scores each of them once)")) << r.out;
  // The largest number it names is accepted.
  const std::string most = r.out.substr(r.out.find("at most ") + 8);
  const Launch ok = run_within(600, eval + most.substr(0, most.find(' ')));
  EXPECT_EQ(ok.status, 0) << ok.out;
}

}  // namespace
