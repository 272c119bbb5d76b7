// `pipefisher train` refuses bad configuration with exit status 2 and one line naming the key,
// before writing anything.
#include "config/config.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// 1234567 -> "1,234,567", written apart from the program's.
std::string with_commas(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// bert-tiny's parameters on 2 stages of one block each, by hand (nn/blocks.cpp): the embeddings
// and their LayerNorm; per block Q, K, V, O, two FFN Linears with biases, two LayerNorms; the
// head's transform, its LayerNorm and decoder bias (the decoder is the tied word matrix, counted once),
// and next-sentence prediction's pooler and classifier (data.nsp is on by default).
std::pair<int64_t, int64_t> bert_tiny_stage_parameters() {
  const int64_t C = 128, F = 512, V = 30522, P = 512, T = 2;
  const int64_t embedding = (V + P + T) * C + 2 * C, block = 4 * C * C + 2 * C * F + 9 * C + F,
                head = C * C + 3 * C + V + (C * C + C) + (2 * C + 2);
  return {embedding + block, block + head};
}

struct CliRun {
  int status = -1;
  std::string err;
};

CliRun train(const std::string& args, const fs::path& dir) {
  const fs::path err = dir / "stderr.txt";
  const std::string cmd = std::string(PF_BINARY) + " train " + args + " > /dev/null 2> " + err.string();
  int rc = std::system(cmd.c_str());
  std::ifstream f(err);
  CliRun r{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string((std::istreambuf_iterator<char>(f)), {})};
  return r;
}

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pf_test_train_cli_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    out_ = dir_ / "out";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs with `sets` on the committed sample and expects exit 2, one line starting with `prefix`,
  // and no output directory; --dry-run refuses alike (issue 50, item 3).
  void expect_refused(const std::string& sets, const std::string& prefix) {
    const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
    const std::string args = "--set data.train_file=" + sample + " --set data.valid_file=" + sample +
                             " --set train.out_dir=" + out_.string() + " " + sets;
    const CliRun dry = train(args + " --dry-run", dir_);
    CliRun r = train(args, dir_);
    EXPECT_EQ(dry.status, r.status) << sets << "\n" << dry.err;
    EXPECT_EQ(dry.err, r.err) << sets;
    EXPECT_EQ(r.status, 2) << sets << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("pipefisher: " + prefix, 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out_)) << "an output directory was created for a refused run";
  }

  fs::path dir_, out_;
};

}  // namespace

TEST_F(TrainCli, UnknownKey) { expect_refused("--set model.layerz=3", "model.layerz: unknown configuration key"); }

TEST_F(TrainCli, NonPositiveSize) { expect_refused("--set model.hidden=0", "model.hidden: must be positive"); }

// SOAP's keys and SOAP beside K-FAC: exit 2, one line naming the key (and, for K-FAC, both keys).
TEST_F(TrainCli, SoapKeysOutOfBounds) {
  expect_refused("--set optim.name=soap --set optim.soap.shampoo_beta=1",
                 "optim.soap.shampoo_beta: must be in [0, 1) (got 1)");
  expect_refused("--set optim.name=soap --set optim.soap.precondition_frequency=0",
                 "optim.soap.precondition_frequency: must be positive (got 0)");
  expect_refused("--set optim.soap.max_precond_dim=-3", "optim.soap.max_precond_dim: must be positive (got -3)");
  expect_refused("--set optim.soap.max_precond_dimm=3",
                 "optim.soap.max_precond_dimm: unknown configuration key (did you mean optim.soap.max_precond_dim?)");
  expect_refused("--set optim.name=soap --set kfac.enabled=true",
                 "optim.name: soap does not run with kfac.enabled = true");
}

TEST_F(TrainCli, HiddenNotDivisibleByHeads) {
  expect_refused("--set model.hidden=100 --set model.heads=3", "model.hidden: 100 is not divisible by model.heads = 3");
}

TEST_F(TrainCli, MissingDataFile) {
  expect_refused("--set data.train_file=/nonexistent/train.bin", "data.train_file: no such file '/nonexistent/train.bin'");
}

TEST_F(TrainCli, MalformedConfigFile) {
  const fs::path cfg = dir_ / "bad.toml";
  std::ofstream(cfg) << "[model\nlayers = 2\n";
  expect_refused("--config " + cfg.string(), cfg.string() + ": line 1");
}

TEST_F(TrainCli, BadFlagValue) { expect_refused("--steps -3", "--steps"); }

// A 50 MB value in a configuration file: the one line that refuses it repeats its start, its end
// and its length, not the value.
TEST_F(TrainCli, AHugeValueIsClippedInTheMessage) {
  const fs::path cfg = dir_ / "huge.toml";
  // 10 MB: within a configuration's 16 MiB bound (a larger file is refused before it is parsed).
  std::ofstream(cfg) << "[model]\narch = \"" << std::string(10'000'000, 'x') << "\"\n";
  expect_refused("--config " + cfg.string(), "model.arch: '" + std::string(60, 'x') + "..." + std::string(20, 'x') +
                                                 " (10000000 bytes)' is not one of");
  CliRun r = train("--config " + cfg.string(), dir_);
  EXPECT_LT(r.err.size(), 300u);
  const fs::path larger = dir_ / "larger.toml";
  std::ofstream(larger) << "[model]\narch = \"" << std::string(20'000'000, 'x') << "\"\n";
  expect_refused("--config " + larger.string(), "--config: '" + larger.string() + "' is 20000018 bytes, over the bound");
}

// --- what a user sees ---

namespace {

struct Output {
  int status;
  std::string out, err;
};

Output pipefisher(const std::string& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const int rc = std::system((std::string(PF_BINARY) + " " + args + " > " + out.string() + " 2> " + err.string()).c_str());
  std::ifstream o(out), e(err);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string((std::istreambuf_iterator<char>(o)), {}),
          std::string((std::istreambuf_iterator<char>(e)), {})};
}

}  // namespace

TEST_F(TrainCli, BareCallPrintsUsageAndTrainsNothing) {
  const Output r = pipefisher("", dir_);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Usage:"), std::string::npos) << r.out;
  for (const char* cmd : {"train", "eval", "generate", "plan", "tokenize"}) EXPECT_NE(r.out.find(cmd), std::string::npos) << cmd;
  EXPECT_EQ(r.out.find("step "), std::string::npos) << "a bare call must not start the default job";
}

TEST_F(TrainCli, PrintConfigShowsNumbersAsWritten) {
  const Output r = pipefisher("train --print-config --set optim.lr=0.1 --set kfac.damping=3e-4", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* line : {"\nmask_prob = 0.15\n", "\nlr = 0.1\n", "\ndamping = 0.0003\n", "\nlayer_norm_eps = 1e-12\n",
                           "\ndropout = 0.0\n", "\nsteps = 80\n"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " in\n" << r.out;
}

// --print-config shows every declared key exactly once, under its table, and reads back as the
// configuration it printed.
TEST_F(TrainCli, PrintConfigShowsEveryKeyOnce) {
  const Output r = pipefisher("train --print-config --set kfac.enabled=true --set parallel.schedule=zb-h1", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string& key : pf::config_keys()) {
    const size_t dot = key.find('.');
    const std::string table = "[" + key.substr(0, dot) + "]\n", line = "\n" + key.substr(dot + 1) + " = ";
    const size_t start = r.out.find(table), end = r.out.find("\n[", start + 1);
    ASSERT_NE(start, std::string::npos) << table;
    const std::string section = r.out.substr(start, end == std::string::npos ? std::string::npos : end - start + 1);
    const size_t at = section.find(line);
    EXPECT_NE(at, std::string::npos) << key << " in\n" << r.out;
    EXPECT_EQ(section.find(line, at + 1), std::string::npos) << key << " twice in\n" << r.out;
  }
  const pf::Config printed = pf::Config::from_toml_string(r.out);
  pf::Config expected = pf::Config::from_toml_string("", {"kfac.enabled=true", "parallel.schedule=zb-h1"});
  // The default token files are looked for beside the program (build/pipefisher -> data/), not
  // beside this test's program.
  EXPECT_TRUE(printed.data.train_file.ends_with("data/corpus/train.bert.bin")) << printed.data.train_file;
  EXPECT_TRUE(printed.data.valid_file.ends_with("data/corpus/valid.bert.bin")) << printed.data.valid_file;
  expected.data.train_file = printed.data.train_file;
  expected.data.valid_file = printed.data.valid_file;
  EXPECT_TRUE(printed == expected);
  EXPECT_EQ(printed.to_toml(), r.out);
}

TEST_F(TrainCli, MisspeltFlagOrKeyGetsASuggestion) {
  Output r = pipefisher("train --stpes 3", dir_);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "pipefisher: train: unknown flag --stpes (did you mean --steps?); see pipefisher train --help\n");
  r = pipefisher("train --set optim.warmup_step=3", dir_);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "pipefisher: optim.warmup_step: unknown configuration key (did you mean optim.warmup_steps?)\n");
  r = pipefisher("trian", dir_);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "pipefisher: unknown command 'trian' (did you mean train?)\n");
  r = pipefisher("train --steps 3 oops", dir_);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "pipefisher: train: unexpected argument 'oops'\n");
}

TEST_F(TrainCli, WarmupLongerThanTheRunIsWarnedAbout) {
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const Output r = pipefisher("train --set model.preset=bert-tiny --set model.seq_len=16 --set parallel.micro_batches=1 "
                              "--set parallel.micro_batch_size=2 --set train.eval_batches=1 --set optim.warmup_steps=10 "
                              "--steps 2 --set data.train_file=" + sample + " --set data.valid_file=" + sample +
                              " --set train.out_dir=" + out_.string(), dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("pipefisher: warning: optim.warmup_steps = 10 exceeds train.steps = 2: the learning rate never "
                       "reaches optim.lr = 0.01"), std::string::npos) << r.err;
  // The banner names the preset and the optimizer; the status lines the time so far and to go.
  EXPECT_NE(r.out.find("pipefisher train: bert-tiny (bert, 2 layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", nvlamb, 2 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" elapsed, ETA "), std::string::npos) << r.out;
}

// printf's rendering of v, for comparing the status line with log.jsonl's record.
std::string printed(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The status line carries Megatron's fields, each as log.jsonl records the step: loss, learning
// rate, gradient norm, step time, tokens/s and MFU.
TEST_F(TrainCli, StatusLineShowsTheStepLogJsonRecords) {
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const Output r = pipefisher("train --set model.preset=bert-tiny --set model.seq_len=16 --set parallel.micro_batches=1 "
                              "--set parallel.micro_batch_size=2 --set train.eval_batches=1 --steps 3 --set data.train_file=" +
                              sample + " --set data.valid_file=" + sample + " --set train.out_dir=" + out_.string(), dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<nlohmann::json> log;
  std::ifstream f(out_ / "log.jsonl");
  for (std::string line; std::getline(f, line);) log.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(log.size(), 3u);
  const std::regex status(R"(step (\d+)/3 \| loss (\S+) \| lr (\S+) \| grad norm (\S+) \| (\S+) ms \| (\S+) tok/s \| MFU (\S+)% \| )");
  int lines = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), status); it != std::sregex_iterator(); ++it, ++lines) {
    const std::smatch& m = *it;
    const nlohmann::json& j = log.at(std::stoul(m[1]) - 1);
    EXPECT_EQ(m[2], printed("%.4f", j["loss"])) << m[0];
    EXPECT_EQ(m[3], printed("%.2e", j["lr"])) << m[0];
    EXPECT_EQ(m[4], printed("%.4g", j["grad_norm"])) << m[0];
    EXPECT_EQ(m[5], printed("%.0f", 1000 * j["step_time_s"].get<double>())) << m[0];
    EXPECT_EQ(m[6], printed("%.0f", j["tokens_per_s"])) << m[0];
    EXPECT_EQ(m[7], printed("%.1f", 100 * j["mfu"].get<double>())) << m[0];
    EXPECT_GT(j["grad_norm"].get<double>(), 0) << m[0];
  }
  EXPECT_GE(lines, 2) << r.out;  // the first and the last step at least
  const auto [first, last] = bert_tiny_stage_parameters();
  EXPECT_NE(r.out.find("parameters: " + with_commas(first + last) + "\n"), std::string::npos) << r.out;
  std::ifstream s(out_ / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(s);
  EXPECT_EQ(summary["parameters"]["total"], first + last);
  EXPECT_EQ(summary["parameters"]["per_stage"], nlohmann::json({first + last}));
}

// parallel.data_parallel = auto (the default) takes the MPI world's size over the stages: 4 ranks
// of 2 stages train as 2 stages x 2 replicas, bit for bit as the number written out, and the run's
// config.toml records the number; 3 ranks over 2 stages are refused naming both, nothing written.
TEST_F(TrainCli, DataParallelIsTheWorldOverTheStagesByDefault) {
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const std::string job = "train --set model.preset=bert-tiny --set model.seq_len=16 --set parallel.micro_batches=2 "
                          "--set parallel.micro_batch_size=2 --set train.eval_every=0 --steps 2 --set parallel.stages=2 "
                          "--set data.train_file=" + sample + " --set data.valid_file=" + sample;
  auto launch = [&](int ranks, const fs::path& out, const std::string& extra) {
    const fs::path err = dir_ / "output.txt";
    const std::string cmd = std::string(PF_SOURCE_DIR) + "/scripts/pfrun -np " + std::to_string(ranks) + " " + PF_BINARY +
                            " " + job + " --set train.out_dir=" + out.string() + extra + " > " + err.string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(err);
    return CliRun{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string((std::istreambuf_iterator<char>(f)), {})};
  };
  auto text = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  const CliRun automatic = launch(4, dir_ / "auto", "");
  ASSERT_EQ(automatic.status, 0) << automatic.err;
  const CliRun written = launch(4, dir_ / "two", " --set parallel.data_parallel=2");
  ASSERT_EQ(written.status, 0) << written.err;
  EXPECT_NE(text(dir_ / "auto" / "config.toml").find("\ndata_parallel = 2\n"), std::string::npos);
  EXPECT_EQ(text(dir_ / "auto" / "model.safetensors"), text(dir_ / "two" / "model.safetensors"));
  EXPECT_NE(automatic.err.find("2 stages (1f1b) x 2 data-parallel"), std::string::npos) << automatic.err;

  // The start prints the parameters, total and by stage, and summary.json has them.
  const auto [first, last] = bert_tiny_stage_parameters();
  EXPECT_NE(automatic.err.find("parameters: " + with_commas(first + last) + " (stage 0: " + with_commas(first) +
                               ", stage 1: " + with_commas(last) + ")\n"), std::string::npos) << automatic.err;
  const nlohmann::json summary = nlohmann::json::parse(text(dir_ / "auto" / "summary.json"));
  EXPECT_EQ(summary["parameters"]["total"], first + last);
  EXPECT_EQ(summary["parameters"]["per_stage"], nlohmann::json({first, last}));

  const CliRun three = launch(3, dir_ / "three", "");
  EXPECT_EQ(three.status, 2) << three.err;
  EXPECT_NE(three.err.find("pipefisher: parallel.stages: the MPI world has 3 ranks, which 2 stages do not divide"),
            std::string::npos) << three.err;
  EXPECT_FALSE(fs::exists(dir_ / "three"));
}

// A Hugging Face folder with only pickled weights is refused by every command that takes --init,
// saying why and how to convert them; nothing is written.
TEST_F(TrainCli, PickledWeightsAreRefusedWithTheWayToConvertThem) {
  const fs::path folder = dir_ / "hf";
  fs::create_directories(folder);
  std::ofstream(folder / "config.json") << R"({"model_type": "bert"})";
  std::ofstream(folder / "pytorch_model.bin") << "not read";
  for (const std::string& command : {"train --steps 1 --set train.out_dir=" + out_.string(), std::string("eval")}) {
    const Output r = pipefisher(command + " --init " + folder.string(), dir_);
    EXPECT_EQ(r.status, 2) << command << r.err;
    EXPECT_EQ(r.err.rfind("pipefisher: --init: '" + folder.string() + "' holds pytorch_model.bin, PyTorch's pickled "
                          "weights, which are not read (unpickling runs code): convert them to model.safetensors", 0), 0u)
        << command << r.err;
    EXPECT_NE(r.err.find("save_pretrained(DIR, safe_serialization=True)\n"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(out_));
}

// An out_dir holding another run's outputs (another config) is refused, its files untouched;
// the same job runs again, --overwrite replaces them, and an MPI run checks the same.
TEST_F(TrainCli, AnotherRunsOutputsAreNotOverwritten) {
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const std::string job = "train --set model.preset=bert-tiny --set model.seq_len=16 --set parallel.micro_batches=2 "
                          "--set parallel.micro_batch_size=2 --set train.eval_every=0 --steps 2 --set data.train_file=" +
                          sample + " --set data.valid_file=" + sample + " --set train.out_dir=" + out_.string();
  ASSERT_EQ(pipefisher(job, dir_).status, 0);
  Output again = pipefisher(job, dir_);
  ASSERT_EQ(again.status, 0) << "the same job must run twice in a row\n" << again.err;
  const auto read = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  const std::string log = read(out_ / "log.jsonl"), weights = read(out_ / "model.safetensors");
  for (const std::string& launcher : {std::string(), std::string(PF_SOURCE_DIR) + "/scripts/pfrun -np 2 "}) {
    const std::string other = job + " --set optim.lr=0.003" + (launcher.empty() ? "" : " --set parallel.stages=2");
    const fs::path err = dir_ / "stderr.txt";
    const int rc = std::system((launcher + PF_BINARY + " " + other + " > /dev/null 2> " + err.string()).c_str());
    const std::string e = read(err);
    EXPECT_EQ(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, 2) << launcher << e;
    EXPECT_NE(e.find("pipefisher: train.out_dir: '" + out_.string() + "' holds the outputs of another run (its "
                     "config.toml differs at '[optim] lr': run has 0.01, this command 0.003); give this run its own "
                     "train.out_dir, or "
                     "--overwrite to replace them\n"), std::string::npos) << launcher << e;
    EXPECT_EQ(read(out_ / "log.jsonl"), log) << launcher;
    EXPECT_EQ(read(out_ / "model.safetensors"), weights) << launcher;
  }
  const Output replaced = pipefisher(job + " --set optim.lr=0.003 --overwrite", dir_);
  ASSERT_EQ(replaced.status, 0) << replaced.err;
  EXPECT_NE(read(out_ / "config.toml").find("lr = 0.003"), std::string::npos);
}

// `pipefisher --help` lists every command with a description written alike: a capital first, as
// CLI11 writes its own ("Print this help message and exit").
TEST_F(TrainCli, EveryCommandsHelpLineStartsWithACapital) {
  Output r = pipefisher("--help", dir_);
  ASSERT_EQ(r.status, 0) << r.err;
  const size_t at = r.out.find("Subcommands:\n");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::istringstream lines(r.out.substr(at + 13));
  int commands = 0;
  for (std::string line; std::getline(lines, line) && !line.empty();) {
    const size_t description = line.find_first_not_of(' ', line.find(' ', line.find_first_not_of(' ')));
    ASSERT_NE(description, std::string::npos) << line;
    EXPECT_TRUE(std::isupper(static_cast<unsigned char>(line[description]))) << line;
    ++commands;
  }
  EXPECT_EQ(commands, 8) << r.out;  // config, eval, generate, machine, plan, report, tokenize, train
}

// --dry-run checks what the run would read and prints what it would need and do, writing nothing:
// the memory per rank, and for a 2-stage PipeFisher layout plan's report of its schedule and plan
// (from the FLOPs cost model); a bad token file is refused as the run would refuse it.
TEST_F(TrainCli, DryRunChecksPredictsAndWritesNothing) {
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const std::string sets = "--set model.preset=bert-tiny --set model.seq_len=32 --set data.train_file=" + sample +
                           " --set data.valid_file=" + sample + " --set train.out_dir=" + out_.string() +
                           " --set parallel.micro_batches=4 --set parallel.micro_batch_size=2 --dry-run";
  const fs::path out = dir_ / "stdout.txt";
  auto dry = [&](const std::string& extra) {
    const std::string cmd = std::string(PF_BINARY) + " train " + sets + " " + extra + " > " + out.string() + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(out);
    return CliRun{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, std::string((std::istreambuf_iterator<char>(f)), {})};
  };
  const CliRun one = dry("");
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_NE(one.err.find("dry run: the configuration and every input check out; nothing was written"), std::string::npos)
      << one.err;
  EXPECT_NE(one.err.find("memory: at most "), std::string::npos) << one.err;
  EXPECT_EQ(one.err.find("plan: "), std::string::npos) << "one process: no schedule";
  // Without K-FAC too, the plan's memory model is the run's own model: its preset, blocks per
  // stage, micro-batch size and sequence length, not bert-base's.
  const CliRun plain = dry("--set parallel.stages=2");
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_NE(plain.err.find(" --layers-per-stage 1 --micro-batch-size 2 --seq-len 32 --model bert-tiny\n"), std::string::npos)
      << plain.err;
  auto memory_line = [](const std::string& text) {
    const size_t at = text.find("memory (worst device");
    return at == std::string::npos ? std::string() : text.substr(at, text.find('\n', at) - at);
  };
  const std::string flags = plain.err.substr(plain.err.find("plan: pipefisher plan ") + 22,
                                             plain.err.find(" --model bert-tiny\n") - plain.err.find("plan: pipefisher plan ") - 22);
  const Output tiny = pipefisher("plan " + flags + " --model bert-tiny", dir_), base = pipefisher("plan " + flags + " --model bert-base", dir_);
  ASSERT_FALSE(memory_line(plain.err).empty()) << plain.err;
  EXPECT_EQ(memory_line(plain.err), memory_line(tiny.out)) << tiny.out;
  EXPECT_NE(memory_line(tiny.out), memory_line(base.out)) << base.out;
  const CliRun pipe = dry("--set parallel.stages=2 --set kfac.enabled=true --set kfac.placement=bubbles");
  ASSERT_EQ(pipe.status, 0) << pipe.err;
  EXPECT_NE(pipe.err.find("plan: pipefisher plan --schedule 1f1b --stages 2 --micro-batches 4 --tf "), std::string::npos)
      << pipe.err;
  EXPECT_NE(pipe.err.find("PipeFisher (bert-tiny model shapes"), std::string::npos) << pipe.err;
  EXPECT_NE(pipe.err.find(" 1 |"), std::string::npos) << "the schedule's grid, device 1's row: " << pipe.err;
  EXPECT_FALSE(fs::exists(out_)) << "a dry run wrote its out_dir";
  const fs::path odd = dir_ / "odd.bin";
  std::ofstream(odd) << "abc";  // 3 bytes: no whole uint16 token file
  const CliRun bad = dry("--set data.train_file=" + odd.string());
  EXPECT_EQ(bad.status, 2) << bad.err;
  EXPECT_EQ(bad.err.rfind("pipefisher: data.train_file: ", 0), 0u) << bad.err;
  EXPECT_FALSE(fs::exists(out_));
}
