// `pipefisher train` refuses bad configuration with exit status 2 and one line naming the key,
// before writing anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

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
  // and no output directory.
  void expect_refused(const std::string& sets, const std::string& prefix) {
    const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
    CliRun r = train("--set data.train_file=" + sample + " --set data.valid_file=" + sample +
                      " --set train.out_dir=" + out_.string() + " " + sets,
                  dir_);
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
