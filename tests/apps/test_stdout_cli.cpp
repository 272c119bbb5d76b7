// Issue 50, item 4: a command whose output cannot be written (stdout on a full disk: /dev/full)
// fails, status 2 and a line on stderr, never 0: every command that prints a result.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace fs = std::filesystem;
using pf_test::run;

namespace {

const std::string kEnv = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ";
const std::string kPf = kEnv + PF_BINARY;

std::string sample(const std::string& vocab) {
  return std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20." + vocab + ".bin";
}

// `args` of pipefisher with stdout on /dev/full (stderr kept apart, read from a file).
void expect_write_failure(const std::string& args, const fs::path& dir) {
  const fs::path err = dir / "stderr.txt";
  const pf_test::Launch r = run(kPf + " " + args + " > /dev/full 2> " + err.string() + "; cat " + err.string());
  EXPECT_EQ(r.status, 0) << "the shell's cat";
  const pf_test::Launch st = run(kPf + " " + args + " > /dev/full 2> /dev/null");
  EXPECT_EQ(st.status, 2) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("pipefisher: cannot write the output (stdout): "), std::string::npos) << args << "\n" << r.out;
}

}  // namespace

TEST(StdoutCli, AnOutputThatCannotBeWrittenIsAnError) {
  const fs::path dir = pf_test::scratch_dir("stdout_cli");
  const fs::path run_dir = dir / "gpt";
  const pf_test::Launch t = run(kPf + " train --set model.arch=gpt --set model.layers=2 --set model.hidden=32 "
                                "--set model.heads=2 --set model.ffn=64 --set model.seq_len=16 --set data.train_file=" +
                                sample("gpt2") + " --set data.valid_file=" + sample("gpt2") +
                                " --set parallel.micro_batches=1 --set parallel.micro_batch_size=2 --set "
                                "train.eval_batches=1 --set train.threads=1 --set train.steps=1 --set train.out_dir=" +
                                run_dir.string());
  ASSERT_EQ(t.status, 0) << t.out;
  const std::string cases[] = {
      "config",
      "config --describe",
      "machine",
      "plan --schedule 1f1b --stages 2 --micro-batches 4 --json",
      "plan --schedule 1f1b --stages 2 --micro-batches 4",
      "eval --init " + run_dir.string() + " --json",
      "generate --init " + run_dir.string() + " --prompt 'Call me' --max-new-tokens 3 --seed 1 --json",
      "report " + run_dir.string() + " --json --out " + (dir / "loss.svg").string(),
      "tokenize --vocab gpt2 'Call me Ishmael.'",
      "--help",
  };
  for (const std::string& c : cases) expect_write_failure(c, dir);
  // The same commands on a working stdout exit 0.
  EXPECT_EQ(run(kPf + " config > /dev/null").status, 0);
  EXPECT_EQ(run(kPf + " eval --init " + run_dir.string() + " --json > /dev/null").status, 0);
}
