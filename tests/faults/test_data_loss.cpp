// Issue 34, "Data loss": a command never destroys a file of the user's. An output naming an input
// is refused, compared by device and inode (item 1); --resume of a copied run directory writes into
// the copy, and a moved one continues where it is (item 2); a checkpoint directory belongs to one
// run, and retention removes only that run's checkpoints (item 3); a folder that is not a run
// directory is not written into without --overwrite (item 4). Every refusal: one line naming the
// flags or keys, exit 2, nothing written.
#include "../checkpoint/cli.hpp"

#include <algorithm>
#include <map>

namespace {

using namespace pf_test;

// Its own folder: one test program's tests share the scratch directory (support/scratch.hpp).
fs::path dir() {
  const fs::path d = work_dir("data_loss") / "data-loss";
  fs::create_directories(d);
  return d;
}

// Exit 2, exactly one line of output, containing `what`.
void expect_one_line_refusal(const Launch& r, const std::string& what, const std::string& context = "") {
  EXPECT_EQ(r.status, 2) << context << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << context << ": not one line\n" << r.out;
  EXPECT_TRUE(contains(r.out, what)) << context << ": expected '" << what << "'\n" << r.out;
}

std::string tiny_train(const fs::path& out, const std::string& sets) {
  return kEnv + kBinary + " train --config " + (dir() / "tiny.toml").string() + " --set train.out_dir=" + out.string() +
         " " + sets;
}

// Every file under `root` (links not followed) and its bytes: a directory's state, to compare.
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(root))
    files[fs::relative(e.path(), root).string()] = e.is_symlink()      ? "link " + fs::read_symlink(e.path()).string()
                                                    : e.is_directory() ? std::string("directory")
                                                                       : slurp(e.path());
  return files;
}

std::vector<std::string> entries(const fs::path& d) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Item 1: the probe's four cases and their kin, for train and tokenize; each refused naming
// both, before any byte is written (the input keeps its bytes, no out_dir is made).
TEST(DataLoss, AnOutputNamingAnInputIsRefused) {
  tiny_config(dir());
  const fs::path cfg = dir() / "tiny.toml", w = dir() / "w.safetensors", ck = dir() / "in-ck";
  Launch made = run(tiny_train(dir() / "out-w", "--steps 2 --save " + w.string() +
                                                    " --set train.checkpoint_every=2 --set train.checkpoint_dir=" + ck.string()));
  ASSERT_EQ(made.status, 0) << made.out;
  // Token files of the test's own, with their document index (the committed ones are never at risk).
  for (const char* ext : {".bin", ".docs"})
    fs::copy_file(PF_SOURCE_DIR "/data/sample/moby-dick-1-20.bert" + std::string(ext), dir() / ("tok" + std::string(ext)),
                  fs::copy_options::overwrite_existing);
  fs::create_hard_link(cfg, dir() / "tiny-link.toml");
  const std::string weights = (ck / "step-000002" / "weights-stage-0.safetensors").string();
  const std::string tokens = "--set data.train_file=" + (dir() / "tok.bin").string();
  const struct {
    std::string flags, what;
    fs::path input;
  } cases[] = {
      {"--log-json " + cfg.string(), "--log-json: '" + cfg.string() + "' is also --config, which is read", cfg},
      {"--save " + cfg.string(), "--save: '" + cfg.string() + "' is also --config, which is read", cfg},
      {"--log-json " + (dir() / "tiny-link.toml").string(), "' is also --config, which is read", cfg},  // a hard link
      {"--init " + w.string() + " --log-json " + w.string(), "--log-json: '" + w.string() + "' is also --init", w},
      {"--init " + w.string() + " --save " + w.string(), "--save: '" + w.string() + "' is also --init", w},
      {"--steps 4 --resume " + ck.string() + " --save " + weights, "--save: '" + weights + "' is also --resume", weights},
      {tokens + " --log-json " + (dir() / "tok.docs").string(), "is also data.train_file's document index", dir() / "tok.docs"},
  };
  int k = 0;
  for (const auto& c : cases) {
    tiny_config(dir());  // the same inode: a case that wrote over it does not spoil the next
    const std::string before = slurp(c.input);
    const fs::path out = dir() / ("out-in" + std::to_string(k++));
    expect_one_line_refusal(run_both_ways(tiny_train(out, c.flags)), c.what, c.flags);
    EXPECT_EQ(slurp(c.input), before) << c.flags;
    EXPECT_FALSE(fs::exists(out)) << c.flags;
  }
  // tokenize: --docs over the vocabulary it reads.
  const fs::path vocab = dir() / "vocab", text = dir() / "in.txt", vocab_file = vocab / "bert-base-uncased.txt";
  fs::create_directories(vocab);
  std::ofstream(vocab_file) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n";
  std::ofstream(text) << "hello world\n";
  Launch tok = run(kBinary + " tokenize --vocab bert --vocab-dir " + vocab.string() + " --in " + text.string() +
                   " --out " + (dir() / "t.bin").string() + " --docs " + vocab_file.string());
  expect_one_line_refusal(tok, "--docs: '" + vocab_file.string() + "' is also the bert vocabulary");
  EXPECT_EQ(slurp(vocab_file), "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n");
  EXPECT_FALSE(fs::exists(dir() / "t.bin"));
}

// Item 2: cp -r of a run, --resume of the copy: the copy goes on, the original keeps every byte;
// the copy moved elsewhere continues there with the same command. A copy whose log lies outside
// it (the original's) is refused until it names its own.
TEST(DataLoss, ResumeOfACopiedRunWritesIntoTheCopy) {
  tiny_config(dir());
  const fs::path orig = dir() / "orig", copy = dir() / "copy", moved = dir() / "moved";
  Launch first = run(tiny_train(orig, "--steps 4 --set train.checkpoint_every=2"));
  ASSERT_EQ(first.status, 0) << first.out;
  fs::copy(orig, copy, fs::copy_options::recursive);
  const auto before = snapshot(orig);
  Launch resumed = run(kEnv + kBinary + " train --resume " + copy.string() + " --steps 6");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "resuming from " + (copy / "checkpoints" / "step-000004").string())) << resumed.out;
  EXPECT_TRUE(snapshot(orig) == before) << "the original run directory changed";
  EXPECT_EQ(read_log(copy / "log.jsonl").size(), 6u);
  EXPECT_EQ(slurp(copy / "checkpoints" / "latest"), "step-000006\n");
  EXPECT_TRUE(contains(slurp(copy / "config.toml"), "out_dir = '" + copy.string() + "'"));

  fs::rename(copy, moved);
  Launch again = run(kEnv + kBinary + " train --resume " + moved.string() + " --steps 8");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "resuming from " + (moved / "checkpoints" / "step-000006").string())) << again.out;
  EXPECT_EQ(read_log(moved / "log.jsonl").size(), 8u);
  EXPECT_FALSE(fs::exists(copy)) << "the run wrote where it was before the move";
  EXPECT_TRUE(snapshot(orig) == before) << "the original run directory changed";

  const fs::path logged = dir() / "logged", logged_copy = dir() / "logged-copy", log = dir() / "logged.jsonl";
  Launch l = run(tiny_train(logged, "--steps 2 --set train.checkpoint_every=2 --log-json " + log.string()));
  ASSERT_EQ(l.status, 0) << l.out;
  fs::copy(logged, logged_copy, fs::copy_options::recursive);
  const std::string log_before = slurp(log);
  expect_one_line_refusal(run_both_ways(kEnv + kBinary + " train --resume " + logged_copy.string() + " --steps 4"),
                          "train.log_json: '" + log.string() + "' is the log of the run in '" + logged.string() + "'");
  EXPECT_EQ(slurp(log), log_before);
}

// Item 3: run B (another seed, another out_dir) naming run A's checkpoint directory is refused,
// naming A, in one process and under mpirun, and A's checkpoints keep every byte; A itself goes
// on. Retention removes only the run's own checkpoints: a step-000000/ and another run's
// checkpoint placed in its directory stay.
TEST(DataLoss, ACheckpointDirectoryBelongsToOneRun) {
  tiny_config(dir());
  const fs::path a = dir() / "run-a", ck = dir() / "ck-a";
  const std::string cks = " --set train.checkpoint_every=1 --set train.keep_checkpoints=10 --set train.checkpoint_dir=" +
                          ck.string();
  Launch first = run(tiny_train(a, "--steps 4" + cks));
  ASSERT_EQ(first.status, 0) << first.out;
  const auto before = snapshot(ck);
  const std::string owned = "train.checkpoint_dir: '" + ck.string() + "' holds the checkpoints of the run in '" +
                            a.string() + "' (" + (ck / "owner.json").string() + ")";
  expect_one_line_refusal(run_both_ways(tiny_train(dir() / "run-b", "--steps 4 --set train.seed=7" + cks)), owned);
  Launch mpi = run(kEnv + kPfrun + " -np 2 " + kBinary + " train --config " + (dir() / "tiny.toml").string() +
                   " --set parallel.stages=2 --set train.out_dir=" + (dir() / "run-b2").string() + " --steps 4" + cks);
  EXPECT_EQ(mpi.status, 2) << mpi.out;
  EXPECT_TRUE(contains(mpi.out, owned)) << mpi.out;
  EXPECT_TRUE(snapshot(ck) == before) << "a refused run changed the checkpoint directory";
  EXPECT_FALSE(fs::exists(dir() / "run-b") || fs::exists(dir() / "run-b2"));
  Launch longer = run(tiny_train(a, "--steps 5" + cks));  // the same run, extended
  EXPECT_EQ(longer.status, 0) << longer.out;

  // Run C's directory holds a step-000000/ of somebody's and run A's step 1.
  const fs::path ckc = dir() / "ck-c";
  fs::create_directories(ckc / "step-000000");
  std::ofstream(ckc / "step-000000" / "notes.txt") << "mine\n";
  fs::copy(ck / "step-000001", ckc / "step-000001", fs::copy_options::recursive);
  Launch c = run(tiny_train(dir() / "run-c", "--steps 5 --set train.checkpoint_every=2 --set train.keep_checkpoints=1 "
                                             "--set train.checkpoint_dir=" + ckc.string()));
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_EQ(entries(ckc), (std::vector<std::string>{".pipefisher-lock", "latest", "owner.json", "step-000000",
                                                    "step-000001", "step-000005"}));
  EXPECT_EQ(slurp(ckc / "step-000000" / "notes.txt"), "mine\n");
  EXPECT_EQ(slurp(ckc / "step-000001" / "manifest.json"), slurp(ck / "step-000001" / "manifest.json"));
}

// Item 4: a Hugging Face model folder as train.out_dir is refused, naming it and what it holds,
// and keeps every byte; --overwrite writes into it; an empty folder is fine.
TEST(DataLoss, AFolderThatIsNoRunDirectoryIsNotWrittenInto) {
  tiny_config(dir());
  const fs::path hf = dir() / "hf-model";
  fs::create_directories(hf);
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "README.md"})
    std::ofstream(hf / name) << "theirs: " << name << "\n";
  const auto before = snapshot(hf);
  expect_one_line_refusal(run_both_ways(tiny_train(hf, "--steps 1")),
                          "train.out_dir: '" + hf.string() + "' is not empty and not a pipefisher run directory (it "
                          "holds README.md, config.json, model.safetensors, tokenizer.json, ... (5 entries))");
  EXPECT_TRUE(snapshot(hf) == before) << "the folder changed";
  Launch over = run(tiny_train(hf, "--steps 1 --overwrite"));
  EXPECT_EQ(over.status, 0) << over.out;
  EXPECT_NE(slurp(hf / "model.safetensors"), "theirs: model.safetensors\n");
  EXPECT_EQ(slurp(hf / "README.md"), "theirs: README.md\n");  // not a file a run writes
  const fs::path empty = dir() / "empty-out";
  fs::create_directories(empty);
  Launch fine = run(tiny_train(empty, "--steps 1"));
  EXPECT_EQ(fine.status, 0) << fine.out;
}

}  // namespace

// Issue 50, item 1: cp -r of a run, then the same command through the copy's own config.toml
// (which records the original's out_dir): the copy goes on where it is and the original keeps
// every byte; so does its dry run, and a moved run continued through its config.toml.
TEST(DataLoss, ContinuingACopiedRunThroughItsOwnConfigWritesIntoTheCopy) {
  tiny_config(dir());
  const fs::path orig = dir() / "own-orig", copy = dir() / "own-copy", moved = dir() / "own-moved";
  Launch first = run(tiny_train(orig, "--steps 2"));
  ASSERT_EQ(first.status, 0) << first.out;
  fs::copy(orig, copy, fs::copy_options::recursive);
  const auto before = snapshot(orig);
  const std::string own = kEnv + kBinary + " train --config " + (copy / "config.toml").string();
  Launch dry = run(own + " --steps 4 --dry-run");
  EXPECT_EQ(dry.status, 0) << dry.out;
  Launch resumed = run(own + " --steps 4");
  ASSERT_EQ(resumed.status, 0) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "resuming from " + (copy / "checkpoints" / "step-000002").string())) << resumed.out;
  EXPECT_FALSE(contains(resumed.out, orig.string() + "/")) << resumed.out;
  EXPECT_TRUE(snapshot(orig) == before) << "the original run directory changed";
  EXPECT_EQ(read_log(copy / "log.jsonl").size(), 4u);
  EXPECT_EQ(slurp(copy / "checkpoints" / "latest"), "step-000004\n");
  EXPECT_TRUE(contains(slurp(copy / "config.toml"), "out_dir = '" + copy.string() + "'"));

  fs::rename(copy, moved);
  Launch again = run(kEnv + kBinary + " train --config " + (moved / "config.toml").string() + " --steps 6");
  ASSERT_EQ(again.status, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "resuming from " + (moved / "checkpoints" / "step-000004").string())) << again.out;
  EXPECT_EQ(read_log(moved / "log.jsonl").size(), 6u);
  EXPECT_FALSE(fs::exists(copy)) << "the run wrote where it was before the move";
  // A --set naming another out_dir takes the configuration as a template: a new run there.
  const fs::path fresh = dir() / "own-fresh";
  Launch other = run(kEnv + kBinary + " train --config " + (moved / "config.toml").string() +
                     " --set train.out_dir=" + fresh.string() + " --steps 2");
  ASSERT_EQ(other.status, 0) << other.out;
  EXPECT_FALSE(contains(other.out, "resuming")) << other.out;
  EXPECT_TRUE(snapshot(orig) == before) << "the original run directory changed";
}
