// The start-up choice of BLAS kernels and OpenMP waiting (core/machine), as a pure decision and
// end to end: `pipefisher train` runs the best kernel family this CPU has unless the user chose one.
#include "core/machine.hpp"

#include "../support/launch.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

using namespace pf;

namespace {

// A fake environment for environment_fix: only the variables in `vars` are set.
std::map<std::string, std::string> vars;
const char* fake_env(const char* name) {
  auto it = vars.find(name);
  return it == vars.end() ? nullptr : it->second.c_str();
}

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p);
  return {std::istreambuf_iterator<char>(f), {}};
}

// `pipefisher train` for one step of bert-tiny on the committed sample, with `env` before it;
// returns summary.json's text ("" if the run failed, with the output in the failure message).
std::string one_step_summary(const std::string& env, const std::string& name) {
  const auto out = pf_test::scratch_dir("machine") / name;
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const auto r = pf_test::run(env + " " + PF_BINARY + " train --set model.preset=bert-tiny --steps 1 --set data.train_file=" +
                              sample + " --set data.valid_file=" + sample + " --set train.out_dir=" + out.string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.rfind("machine: ", 0), 0u) << "the first line says where the run ran:\n" << r.out;
  return read(out / "summary.json");
}

}  // namespace

TEST(Machine, KernelFamiliesHaveTheirInstructionSets) {
  EXPECT_EQ(kernel_isa_level("Prescott"), IsaLevel::kBaseline);
  EXPECT_EQ(kernel_isa_level("Sandybridge"), IsaLevel::kAvx);
  EXPECT_EQ(kernel_isa_level("Haswell"), IsaLevel::kAvx2);
  EXPECT_EQ(kernel_isa_level("zen"), IsaLevel::kAvx2);
  EXPECT_EQ(kernel_isa_level("SkylakeX"), IsaLevel::kAvx512);
  EXPECT_EQ(kernel_isa_level("Cooperlake"), IsaLevel::kAvx512);
  EXPECT_EQ(kernel_isa_level("no such core"), IsaLevel::kBaseline);
  for (IsaLevel l : {IsaLevel::kAvx, IsaLevel::kAvx2, IsaLevel::kAvx512})
    EXPECT_EQ(kernel_isa_level(best_kernel_for(l)), l) << best_kernel_for(l);
  EXPECT_EQ(best_kernel_for(IsaLevel::kBaseline), "");
}

TEST(Machine, GenericKernelsOnABetterCpuAreReplaced) {
  vars = {};
  EnvironmentFix f = environment_fix("Prescott", IsaLevel::kAvx512, fake_env);
  EXPECT_EQ(f.coretype, "SkylakeX");
  EXPECT_TRUE(f.short_spin);
  EXPECT_EQ(environment_fix("Prescott", IsaLevel::kAvx2, fake_env).coretype, "Haswell");
  // What OpenBLAS recognised by itself is kept.
  EXPECT_EQ(environment_fix("Zen", IsaLevel::kAvx2, fake_env).coretype, "");
  EXPECT_EQ(environment_fix("Cooperlake", IsaLevel::kAvx512, fake_env).coretype, "");
  EXPECT_EQ(environment_fix("Prescott", IsaLevel::kBaseline, fake_env).coretype, "");
}

TEST(Machine, TheUsersOwnSettingsWin) {
  vars = {{"OPENBLAS_CORETYPE", "Prescott"}, {"OMP_WAIT_POLICY", "ACTIVE"}};
  EnvironmentFix f = environment_fix("Prescott", IsaLevel::kAvx512, fake_env);
  EXPECT_FALSE(f.needed());
  vars = {{"GOMP_SPINCOUNT", "10000"}};
  EXPECT_FALSE(environment_fix("SkylakeX", IsaLevel::kAvx512, fake_env).short_spin);
  vars = {};
}

// Issue 20 item 3: under ulimit -v OpenBLAS must not start its threads as it loads (each maps a
// 128 MiB buffer; one that cannot spins for ever and then blocks the exit of a refused run).
TEST(Machine, UnderAnAddressSpaceLimitOpenBlasStartsNoThreadsAtLoad) {
  vars = {{"OPENBLAS_CORETYPE", "Haswell"}, {"GOMP_SPINCOUNT", "10000"}};
  EXPECT_FALSE(environment_fix("Haswell", IsaLevel::kAvx2, fake_env, false).needed());
  const EnvironmentFix f = environment_fix("Haswell", IsaLevel::kAvx2, fake_env, true);
  EXPECT_TRUE(f.blas_pool_later);
  EXPECT_TRUE(f.needed());
  vars["OPENBLAS_NUM_THREADS"] = "4";  // the user's own count is kept
  EXPECT_FALSE(environment_fix("Haswell", IsaLevel::kAvx2, fake_env, true).needed());
  vars = {};
}

TEST(Machine, TrainRunsTheBestKernelsOfThisCpu) {
  const std::string s = one_step_summary("env -u OPENBLAS_CORETYPE -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u PF_BLAS_REPLACED -u PF_NO_REEXEC", "auto");
  // Whatever this CPU is: the kernel that ran is at its instruction-set level, or OpenBLAS's own
  // choice was at least as good.
  const auto at = s.find("\"blas_kernel\": \"");
  ASSERT_NE(at, std::string::npos) << s;
  const std::string kernel = s.substr(at + 16, s.find('"', at + 16) - at - 16);
  EXPECT_GE(kernel_isa_level(kernel), cpu_isa_level()) << s;
  EXPECT_NE(s.find("\"openmp_wait\": \"GOMP_SPINCOUNT=10000\""), std::string::npos) << s;
}

TEST(Machine, AnExplicitCoreTypeIsKeptAndReported) {
  // Prescott's kernels run on every x86-64 CPU.
  const std::string s = one_step_summary("env -u GOMP_SPINCOUNT OPENBLAS_CORETYPE=Prescott OMP_WAIT_POLICY=ACTIVE", "forced");
  EXPECT_NE(s.find("\"blas_kernel\": \"Prescott\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"blas_kernel_chosen_by\": \"OPENBLAS_CORETYPE=Prescott\""), std::string::npos) << s;
  EXPECT_NE(s.find("\"openmp_wait\": \"OMP_WAIT_POLICY=ACTIVE\""), std::string::npos) << s;
}
