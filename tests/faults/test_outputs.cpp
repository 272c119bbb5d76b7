// Issue 20 at the command line: a run touches nothing outside itself (report's converter runs
// without a shell: ReportCli.RunsNoCommandFromAName). An output never replaces a device node or
// writes through a link, except a path the user names itself, which is written in place; nothing
// under out_dir is followed out of it, also by checkpoint clean-up (item 2); a resumed log never
// reads back a pipe (item 5); outputs naming one file, or an input, are refused before anything is
// written (item 10); a killed final write's leftovers go, and a full disk during the final write
// names the last checkpoint (item 13).
#include "../checkpoint/cli.hpp"

#include "io/checkpoint.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("outputs"); }

// Exit 2, exactly one line of output, containing `what`.
void expect_one_line_refusal(const Launch& r, const std::string& what, const std::string& context = "") {
  EXPECT_EQ(r.status, 2) << context << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << context << ": not one line\n" << r.out;
  EXPECT_TRUE(contains(r.out, what)) << context << ": expected '" << what << "'\n" << r.out;
}

bool is_char_device(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// A character device node like /dev/null (1, 3) or /dev/full (1, 7) in the scratch directory, so
// that a program replacing it never touches the system's own.
bool make_device(const fs::path& p, unsigned minor) {
  return ::mknod(p.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0;
}

std::string tiny_train(const std::string& out, const std::string& sets) {
  return kEnv + kBinary + " train --config " + (dir() / "tiny.toml").string() + " --set train.out_dir=" + out + " " +
         sets;
}

// Item 2: device nodes and links the user names are written in place, never replaced.
TEST(Outputs, PathsTheUserNamesAreWrittenInPlace) {
  tiny_config(dir());
  const fs::path save = dir() / "null-save", log = dir() / "null-log", svg = dir() / "null-svg",
                 trace = dir() / "null-trace";
  for (const fs::path& p : {save, log, svg, trace})
    if (!make_device(p, 3)) GTEST_SKIP() << "cannot make a device node here (" << std::strerror(errno) << ")";
  Launch r = run(tiny_train((dir() / "out-dev").string(), "--steps 1 --save " + save.string() + " --log-json " + log.string()));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(is_char_device(save)) << "--save replaced the device node";
  EXPECT_TRUE(is_char_device(log)) << "--log-json replaced the device node";
  Launch p = run(kBinary + " plan --schedule 1f1b --stages 2 --micro-batches 4 --svg " + svg.string() + " --trace " +
                 trace.string());
  EXPECT_EQ(p.status, 0) << p.out;
  EXPECT_TRUE(is_char_device(svg)) << "--svg replaced the device node";
  EXPECT_TRUE(is_char_device(trace)) << "--trace replaced the device node";
  // A link the user names: what it names is appended to, the link stays.
  const fs::path target = dir() / "linked-log.jsonl", link = dir() / "log-link.jsonl";
  fs::create_symlink(target, link);
  std::ofstream(target) << "";
  Launch l = run(tiny_train((dir() / "out-link-log").string(), "--steps 2 --log-json " + link.string()));
  EXPECT_EQ(l.status, 0) << l.out;
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_log(target).size(), 2u) << slurp(target);
}

// Item 2: a file the run names under out_dir that is a link or a device is refused, naming it,
// before anything is written; what the link names is untouched.
TEST(Outputs, NothingUnderOutDirIsFollowedOutOfIt) {
  tiny_config(dir());
  int k = 0;
  for (const char* name : {"log.jsonl", "metrics.csv", ".pipefisher-lock", "config.toml", "summary.json",
                           "model.safetensors"}) {
    const fs::path out = dir() / ("out-sym" + std::to_string(k)), outside = dir() / ("outside" + std::to_string(k++));
    fs::create_directories(out);
    std::ofstream(outside) << "precious\n";
    fs::create_symlink(outside, out / name);
    Launch r = run(tiny_train(out.string(), "--steps 1"));
    expect_one_line_refusal(r, "train.out_dir: '" + (out / name).string() + "' is a symbolic link", name);
    EXPECT_EQ(slurp(outside), "precious\n") << name;
    EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1) << name << ": wrote in out_dir";
  }
  // The default checkpoint directory (out_dir/checkpoints) linked to a directory outside.
  const fs::path ckout = dir() / "out-symck", elsewhere = dir() / "elsewhere-ck";
  fs::create_directories(ckout);
  fs::create_directories(elsewhere);
  fs::create_symlink(elsewhere, ckout / "checkpoints");
  Launch ck = run(tiny_train(ckout.string(), "--steps 2 --set train.checkpoint_every=1"));
  expect_one_line_refusal(ck, "train.out_dir: '" + (ckout / "checkpoints").string() + "' is a symbolic link");
  EXPECT_TRUE(fs::is_empty(elsewhere));
  EXPECT_EQ(std::distance(fs::directory_iterator(ckout), fs::directory_iterator()), 1) << "wrote in out_dir";
  const fs::path out = dir() / "out-devlog";
  fs::create_directories(out);
  if (!make_device(out / "log.jsonl", 3)) GTEST_SKIP() << "cannot make a device node here";
  Launch r = run(tiny_train(out.string(), "--steps 1"));
  expect_one_line_refusal(r, "train.out_dir: '" + (out / "log.jsonl").string() + "' is a character device");
  EXPECT_TRUE(is_char_device(out / "log.jsonl"));
}

// Item 2: the clean-up of an interrupted attempt removes a linked step directory (an archived copy
// placed in the checkpoint directory), never the files it links to; retention leaves a linked
// checkpoint of another run alone (issue 34 item 3).
TEST(Outputs, CheckpointCleanUpRemovesLinksNotWhatTheyName) {
  tiny_config(dir());
  const fs::path cka = dir() / "ck-a", archive = dir() / "archive", ckb = dir() / "ck-b";
  Launch a = run(tiny_train((dir() / "out-cka").string(), "--steps 2 --set train.checkpoint_every=1 "
                                                           "--set train.keep_checkpoints=10 --set train.checkpoint_dir=" +
                                                               cka.string()));
  ASSERT_EQ(a.status, 0) << a.out;
  fs::create_directories(archive);
  fs::create_directories(ckb);
  for (const char* s : {"step-000001", "step-000002"}) fs::rename(cka / s, archive / s);
  fs::create_symlink(archive / "step-000001", ckb / "step-000001");  // this run's first checkpoint replaces it
  fs::create_symlink(archive / "step-000002", ckb / "step-000000");  // another run's: retention leaves it
  Launch b = run(tiny_train((dir() / "out-ckb").string(), "--steps 2 --set train.checkpoint_every=1 "
                                                           "--set train.keep_checkpoints=1 --set train.checkpoint_dir=" +
                                                               ckb.string()));
  ASSERT_EQ(b.status, 0) << b.out;
  for (const char* s : {"step-000001", "step-000002"})
    EXPECT_NO_THROW(pf::read_checkpoint((archive / s).string())) << s << ": the archived copy was damaged";
  EXPECT_TRUE(fs::is_symlink(ckb / "step-000000"));  // not this run's (issue 34 item 3)
  EXPECT_FALSE(fs::exists(fs::symlink_status(ckb / "step-000001")));
  EXPECT_NO_THROW(pf::read_checkpoint((ckb / "step-000002").string()));
}

// Item 5: --resume with --log-json /dev/stdout into a pipe (the test reads the run's output
// through one) continues instead of reading its own output back. (`timeout` only ends a hang.)
TEST(Outputs, ResumeWithTheLogOnAPipe) {
  tiny_config(dir());
  const fs::path out = dir() / "out-pipe", ck = dir() / "ck-pipe";
  const std::string sets = "--set optim.decay_steps=6 --set train.checkpoint_every=2 --set train.checkpoint_dir=" +
                           ck.string();
  Launch first = run(tiny_train(out.string(), "--steps 2 " + sets));
  ASSERT_EQ(first.status, 0) << first.out;
  Launch r = run("timeout 120 env " + tiny_train(out.string(), "--steps 4 --resume " + ck.string() +
                                                               " --log-json /dev/stdout " + sets));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "{\"step\":3,") && contains(r.out, "{\"step\":4,")) << r.out;
  EXPECT_EQ(read_log(out / "log.jsonl").size(), 4u);
}

// Item 10: two outputs naming one file, or an output naming an input, are refused before
// anything is written.
TEST(Outputs, OutputsNamingOneFileAreRefused) {
  tiny_config(dir());
  const std::string train_file = PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert.bin";
  const fs::path out = dir() / "out-same";
  const struct {
    std::string flags, what;
  } cases[] = {
      {"--log-json " + (out / "metrics.csv").string(),
       "--log-json: '" + (out / "metrics.csv").string() + "' is also train.out_dir's metrics.csv"},
      {"--save " + (out / "log.jsonl").string(), "--save: '" + (out / "log.jsonl").string() + "' is also train.out_dir's log.jsonl"},
      {"--save " + (dir() / "w.bin").string() + " --log-json " + (dir() / "." / "w.bin").string(), "is also --save"},
      {"--log-json " + train_file, "--log-json: '" + train_file + "' is also data.train_file"},
  };
  const std::string before = slurp(train_file);
  for (const auto& c : cases) {
    expect_one_line_refusal(run_both_ways(tiny_train(out.string(), "--steps 1 " + c.flags)), c.what, c.flags);
    EXPECT_FALSE(fs::exists(out)) << c.flags;
    EXPECT_FALSE(fs::exists(dir() / "w.bin")) << c.flags;
  }
  EXPECT_EQ(slurp(train_file), before);
  // tokenize: --docs and --out one file, --out the input itself (a minimal vocabulary).
  const fs::path vocab = dir() / "vocab";
  fs::create_directories(vocab);
  std::ofstream(vocab / "bert-base-uncased.txt") << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n";
  std::ofstream(dir() / "in.bin") << "hello world\n\nhello\n";
  const std::string tok = kBinary + " tokenize --vocab bert --vocab-dir " + vocab.string();
  const std::string x = (dir() / "x.bin").string(), in = (dir() / "in.bin").string();
  expect_one_line_refusal(run(tok + " --in " + in + " --out " + x + " --docs " + x), "--docs: '" + x + "' is also --out");
  EXPECT_FALSE(fs::exists(x));
  expect_one_line_refusal(run(tok + " --in " + in + " --out " + in), "--out: '" + in + "' is also --in");
  EXPECT_EQ(slurp(in), "hello world\n\nhello\n");
  // The same outputs apart: written.
  Launch ok = run(tok + " --in " + in + " --out " + x + " --docs " + (dir() / "x.docs").string());
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_EQ(slurp(dir() / "x.docs"), "0\n2\n");
}

// Item 13: the temporaries a killed final write left behind (NAME.tmp.PID of the run's own
// outputs, regular files) go when a run holds out_dir's lock; anything else stays.
TEST(Outputs, LeftoversOfAKilledFinalWriteGo) {
  tiny_config(dir());
  const fs::path out = dir() / "out-stale", outside = dir() / "outside-stale";
  fs::create_directories(out / "log.jsonl.tmp.8");
  std::ofstream(out / ".pipefisher-lock") << "";  // a run of ours was killed here
  std::ofstream(outside) << "precious\n";
  for (const char* name : {"model.safetensors.tmp.999999", "summary.json.tmp.12", "config.toml.tmp.5", "notes.tmp.3",
                           "model.safetensors.tmp.x"})
    std::ofstream(out / name) << "partial";
  fs::create_symlink(outside, out / "config.json.tmp.77");
  Launch r = run(tiny_train(out.string(), "--steps 1"));
  ASSERT_EQ(r.status, 0) << r.out;
  for (const char* gone : {"model.safetensors.tmp.999999", "summary.json.tmp.12", "config.toml.tmp.5"})
    EXPECT_FALSE(fs::exists(out / gone)) << gone;
  for (const char* kept : {"notes.tmp.3", "model.safetensors.tmp.x", "config.json.tmp.77", "log.jsonl.tmp.8"})
    EXPECT_TRUE(fs::exists(fs::symlink_status(out / kept))) << kept;
  EXPECT_EQ(slurp(outside), "precious\n");
}

// Item 13: a full disk during the final write (--save to a /dev/full node: every write fails
// with ENOSPC) stops the run with exit 2, naming the file and the last complete checkpoint (the
// last step's); in one process and under mpirun.
TEST(Outputs, FullDiskDuringTheFinalWriteNamesTheLastCheckpoint) {
  tiny_config(dir());
  const fs::path full = dir() / "full";
  if (!make_device(full, 7)) GTEST_SKIP() << "cannot make a device node here (" << std::strerror(errno) << ")";
  for (const bool mpi : {false, true}) {
    const std::string tag = mpi ? "mpi" : "one";
    const fs::path ck = dir() / ("ck-full-" + tag), out = dir() / ("out-full-" + tag);
    const std::string sets = "--steps 5 --save " + full.string() + " --set train.checkpoint_every=2 "
                             "--set train.checkpoint_dir=" + ck.string();
    Launch r = run(mpi ? kEnv + kPfrun + " -np 2 " + kBinary + " train --config " + (dir() / "tiny.toml").string() +
                             " --set parallel.stages=2 --set train.out_dir=" + out.string() + " " + sets
                       : tiny_train(out.string(), sets));
    EXPECT_EQ(r.status, 2) << tag << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, "--save: cannot write '" + full.string() + "': No space left on device; the last "
                                "complete checkpoint is " + (ck / "step-000005").string() + ": continue with --resume " +
                                ck.string()))
        << tag << "\n" << r.out;
    EXPECT_TRUE(is_char_device(full)) << tag;
  }
}

}  // namespace
