// Issue 34, items 5 and 9: every file input is read within a bound that fits what it is, and one
// that is not a regular file (/dev/zero, a FIFO) is refused before it is read, naming the flag or
// key: exit 2, one line. Each command runs under `ulimit -v` (a read of /dev/zero cannot take the
// machine's memory) and `timeout` (a FIFO that blocked would fail the test, not hang it). A write
// past `ulimit -f` is refused like a full disk, naming the file and the last checkpoint.
#include "../checkpoint/cli.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("bounded_inputs"); }

// `args` of the program under a 4 GB address-space limit and a 60 s timeout.
Launch limited(const std::string& args) {
  return run("ulimit -v 4000000; " + kEnv + "timeout 60 " + kBinary + " " + args);
}

void expect_refusal(const Launch& r, const std::string& what, const std::string& context) {
  EXPECT_EQ(r.status, 2) << context << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << context << ": not one line\n" << r.out;
  EXPECT_TRUE(contains(r.out, what)) << context << ": expected '" << what << "'\n" << r.out;
}

fs::path fifo() {
  const fs::path p = dir() / "fifo";
  if (!fs::exists(p)) EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
  return p;
}

}  // namespace

TEST(BoundedInputs, DevicesAndFifosAreRefusedBeforeTheyAreRead) {
  const std::string f = fifo().string();
  const std::string plan = "plan --schedule 1f1b --stages 2 --micro-batches 4 --profile ";
  const struct {
    std::string args, what;
  } cases[] = {
      {plan + "/dev/zero", "--profile: '/dev/zero' is a character device, not a regular file"},
      {plan + "/dev/urandom", "--profile: '/dev/urandom' is a character device, not a regular file"},
      {plan + f, "--profile: '" + f + "' is a FIFO, not a regular file"},
      {"report /dev/zero --out " + (dir() / "r.svg").string(), "'/dev/zero' is not a regular file"},
      {"report " + f + " --out " + (dir() / "r.svg").string(), "'" + f + "' is not a regular file"},
      {"train --config /dev/zero", "--config: '/dev/zero' is a character device, not a regular file"},
      {"train --config " + f, "--config: '" + f + "' is a FIFO, not a regular file"},
      {"plan --schedule-file /dev/zero", "--schedule-file: '/dev/zero' is a character device"},
      {"tokenize --in /dev/zero --vocab bert --out " + (dir() / "t.bin").string(), "'/dev/zero' is a character device"},
  };
  for (const auto& c : cases) expect_refusal(limited(c.args), c.what, c.args);
}

// A regular file may still be no log at all: one line of a megabyte without a newline is refused
// at that line, not read until memory runs out.
TEST(BoundedInputs, AReportLogWithAnEndlessLineIsRefused) {
  const fs::path log = dir() / "long.jsonl";
  {
    std::ofstream out(log);
    out << std::string((size_t{1} << 20) + 10, '0');
  }
  expect_refusal(limited("report " + log.string() + " --out " + (dir() / "l.svg").string()),
                 log.string() + ":1: a line over 1 MiB: not a run log", "report of a 1 MiB line");
}

// Item 9: SIGXFSZ is ignored, so the write that crosses the limit fails (EFBIG) and the run stops
// with status 2 naming the file and the last complete checkpoint, instead of dying silently.
TEST(BoundedInputs, AWritePastTheFileSizeLimitIsRefusedNamingTheFile) {
  tiny_config(dir());
  const fs::path ck = dir() / "fsize-ck";
  // 64 KiB: the logs and the configuration fit, a checkpoint's weights (about 1 MB) do not.
  Launch r = run("ulimit -f 64; " + train_cmd(dir(), "fsize", "--set train.checkpoint_every=2 --set train.checkpoint_dir=" +
                                                                      ck.string()));
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "File too large")) << r.out;
  EXPECT_TRUE(contains(r.out, ck.string())) << r.out;
  EXPECT_TRUE(contains(r.out, "checkpoint")) << r.out;
}

// Issue 34, messages: pfrun's options that take values, given without one, are named (exit 2),
// not reported by bash as "$2: unbound variable".
TEST(Pfrun, AnOptionWithoutItsValueIsNamed) {
  for (const std::string opt : {"-np", "--hostfile", "--mca x"}) {
    const Launch r = run(kPfrun + " " + opt);
    EXPECT_EQ(r.status, 2) << opt << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "pfrun: " + opt.substr(0, opt.find(' ')) + " needs a value")) << r.out;
    EXPECT_FALSE(contains(r.out, "unbound variable")) << r.out;
  }
}

// Issue 50, item 10: a file-size limit too small for mpirun's shared-memory files and a run's
// checkpoints (it hung mpirun, a zombie rank, SIGTERM ignored) is refused before launching,
// naming it; the run itself and a limit that fits are left alone.
TEST(Pfrun, ASmallFileSizeLimitIsRefusedBeforeLaunching) {
  tiny_config(dir());
  const std::string train = mpi_train_cmd(2, dir(), "fsize", "--set parallel.stages=2 --steps 2");
  const Launch r = run("(ulimit -f 2000; " + train + ")");
  EXPECT_EQ(r.status, 2) << r.out;
  // 2000 blocks: 2000 KiB in bash, 1000 KiB in a POSIX sh (512-byte blocks).
  EXPECT_TRUE(contains(r.out, "pfrun: the file-size limit (ulimit -f) is 2000 KiB") ||
              contains(r.out, "pfrun: the file-size limit (ulimit -f) is 1000 KiB")) << r.out;
  EXPECT_LT(r.seconds, 10) << r.out;
  EXPECT_FALSE(fs::exists(dir() / "out-fsize"));
  const Launch dry = run("(ulimit -f 2000000; PFRUN_DRY=1 " + kPfrun + " -np 2 prog)");
  EXPECT_EQ(dry.status, 0) << dry.out;
}

// Issue 50, item 11: hostile schedule CSVs (63 MiB of commas took 2.3 GB) are bounded as the other
// inputs are: by size, and by cells counted before they are stored.
TEST(BoundedInputs, ASchedulesSizeAndCellsAreBounded) {
  const fs::path d = dir();
  auto file = [&](const std::string& name, const std::string& unit, size_t bytes) {
    std::string text;
    while (text.size() + unit.size() <= bytes) text += unit;
    std::ofstream(d / name, std::ios::binary) << text;
    return (d / name).string();
  };
  const struct {
    std::string path, what;
  } cases[] = {
      {file("commas.csv", std::string(4096, ','), 15 << 20), "over 4000000 cells"},
      {file("rows.csv", std::string(4096, '\n'), 15 << 20), "over 4000000 cells"},
      {file("actions.csv", "0F0,", 17 << 20), "over the bound of 16777216 bytes"},
  };
  for (const auto& c : cases) {
    const Launch r = run(kEnv + kBinary + " plan --schedule-file " + c.path);
    EXPECT_EQ(r.status, 2) << c.path << "\n" << r.out.substr(0, 2000);
    EXPECT_TRUE(contains(r.out, c.what)) << c.path << "\n" << r.out.substr(0, 2000);
    EXPECT_LT(r.seconds, 10) << c.path;
  }
}

// Issue 34, messages: a whole-number flag out of range says what it wants, not CLI11's range of
// "0.000000 to 1797693..." (300 digits of DBL_MAX); plan --profile DIR names the directory.
TEST(Messages, RangeErrorsSayWhatIsWanted) {
  const struct {
    std::string args, what;
  } cases[] = {
      {"train --steps -3", "--steps: must be a positive integer, got '-3'"},
      {"train --steps 0", "--steps: must be a positive integer, got '0'"},
      {"eval --batches -1", "--batches: must be an integer >= 0, got '-1'"},
      {"generate --top-k x", "--top-k: must be an integer >= 0, got 'x'"},
      // A directory as --profile is looked into (a run's --profile-dir), not taken for a missing --schedule.
      {"plan --profile " + dir().string(), "--profile: '" + dir().string() + "' is a directory without profile.json"},
  };
  for (const auto& c : cases) {
    const Launch r = run(kEnv + kBinary + " " + c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, c.what)) << c.args << "\n" << r.out;
    EXPECT_FALSE(contains(r.out, "1797693")) << r.out;
  }
}

// Issue 34, messages: the default job run from outside the source tree (the program copied
// elsewhere) finds the data of the tree it was built from, or names every place it looked.
TEST(Messages, ACopiedProgramFindsItsSourceTreesData) {
  const fs::path bin = dir() / "elsewhere" / "bin";
  fs::create_directories(bin);
  fs::copy_file(kBinary, bin / "pipefisher", fs::copy_options::overwrite_existing);
  const std::string source_file = std::string(PF_SOURCE_DIR) + "/data/corpus/train.bert.bin";
  const Launch r = run("cd " + (dir() / "elsewhere").string() + " && " + kEnv + (bin / "pipefisher").string() +
                       " train --print-config");
  if (fs::exists(source_file)) {
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "train_file = '" + source_file + "'")) << r.out;
  } else {  // data not prepared: the message lists the source tree among the places looked in
    EXPECT_TRUE(contains(r.out, source_file)) << r.out;
  }
}
