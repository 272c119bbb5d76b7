// Logs that last: `--resume` into the same run keeps one record per step in log.jsonl and
// metrics.csv and a summary of the whole run; records carry a timestamp, the run's elapsed time
// and, with K-FAC, what the step refreshed and how long K-FAC's work took.
#include "cli.hpp"
#include "core/peak_flops.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <regex>

namespace {

using namespace pf_test;

fs::path dir() { return work_dir("run_log"); }

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

nlohmann::json json_file(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

TEST(RunLog, ResumeIntoTheSameRunAppendsAndSummarisesTheWholeRun) {
  tiny_config(dir());
  const fs::path out = dir() / "out-same", ck = dir() / "same-ckpt";
  const std::string sets = "--set train.checkpoint_dir=" + ck.string() + " --set train.checkpoint_every=3";
  Launch first = run(train_cmd(dir(), "same", sets));
  ASSERT_EQ(first.status, 0) << first.out;
  const auto whole = read_log(out / "log.jsonl");
  const auto whole_summary = json_file(out / "summary.json");
  ASSERT_EQ(whole.size(), 6u);
  // As if killed after step 6 before its checkpoint: the log holds steps 4..6 past step 3's.
  fs::remove_all(ck / "step-000006");
  Launch resumed = run(train_cmd(dir(), "same", sets + " --resume " + ck.string()));
  ASSERT_EQ(resumed.status, 0) << resumed.out;

  const auto lines = lines_of(out / "log.jsonl");
  ASSERT_EQ(lines.size(), 6u) << "each step once";
  double elapsed = 0;
  const std::regex iso(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::json::parse(lines[i]);
    const int64_t s = static_cast<int64_t>(i) + 1;
    EXPECT_EQ(j.at("step").get<int64_t>(), s);
    EXPECT_EQ(j.at("loss").get<double>(), whole.at(s).at("loss").get<double>()) << "step " << s;  // deterministic
    EXPECT_TRUE(std::regex_match(j.at("time").get<std::string>(), iso)) << j.dump();
    EXPECT_GE(j.at("elapsed_s").get<double>(), elapsed) << "the run's clock goes on across the resume";
    elapsed = j.at("elapsed_s").get<double>();
  }
  const auto summary = json_file(out / "summary.json");
  EXPECT_EQ(summary.at("steps"), 6);
  EXPECT_EQ(summary.at("first_loss"), whole_summary.at("first_loss"));
  EXPECT_EQ(summary.at("final_loss"), whole_summary.at("final_loss"));
  EXPECT_EQ(summary.at("tokens"), whole_summary.at("tokens"));
  EXPECT_GE(summary.at("wall_time_s").get<double>(), whole.at(3).at("elapsed_s").get<double>());

  // metrics.csv: the header, then the same six steps.
  const auto csv = lines_of(out / "metrics.csv");
  ASSERT_EQ(csv.size(), 7u);
  EXPECT_EQ(csv[0].rfind("step,time,elapsed_s,loss,valid_loss,lr,grad_norm,tokens,step_time_s,tokens_per_s,"
                         "model_flops_per_token,flops_per_s,mfu,peak_rss_bytes", 0), 0u);
  for (int s = 1; s <= 6; ++s) EXPECT_EQ(csv[s].rfind(std::to_string(s) + ",", 0), 0u) << csv[s];
}

TEST(RunLog, KfacRecordsSayWhatEachStepRefreshed) {
  tiny_config(dir());
  const std::string k = "--set kfac.enabled=true --set kfac.placement=skip --set kfac.inverse_every=2";
  Launch r = run(train_cmd(dir(), "kfac-log", k));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "nvlamb + K-FAC (skip: refreshed every 2 steps)")) << r.out;
  const auto log = read_log(dir() / "out-kfac-log" / "log.jsonl");
  ASSERT_EQ(log.size(), 6u);
  for (const auto& [step, j] : log) {
    const bool refresh = (step - 1) % 2 == 0;  // record `step` is 0-based step - 1
    EXPECT_EQ(j.at("kfac_curvature").get<bool>(), refresh) << j.dump();
    EXPECT_EQ(j.at("kfac_inversion").get<bool>(), refresh) << j.dump();
    EXPECT_GE(j.at("kfac_damping_raised").get<int>(), 0);
    EXPECT_GT(j.at("kfac_time_s").get<double>(), 0.0) << "preconditioning runs every step";
    EXPECT_LT(j.at("kfac_time_s").get<double>(), j.at("step_time_s").get<double>());
  }
  const auto csv = lines_of(dir() / "out-kfac-log" / "metrics.csv");
  ASSERT_EQ(csv.size(), 7u);
  EXPECT_NE(csv[0].find(",kfac_curvature,kfac_inversion,kfac_damping_raised,kfac_time_s"), std::string::npos);
  EXPECT_EQ(csv[1].substr(0, 2), "1,");
  // Without K-FAC the records have no K-FAC fields.
  Launch plain = run(train_cmd(dir(), "plain-log", ""));
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_FALSE(read_log(dir() / "out-plain-log" / "log.jsonl").at(1).contains("kfac_time_s"));
}

TEST(RunLog, PipeFisherRecordsCarryKfacWork) {
  tiny_config(dir());
  Launch r = run(mpi_train_cmd(2, dir(), "kfac-pipe", "--set parallel.stages=2 --set kfac.enabled=true "
                                                      "--set kfac.placement=bubbles --set kfac.replan_on_drift=false"));
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "nvlamb + K-FAC (in the pipeline bubbles: PipeFisher)")) << r.out;
  const auto log = read_log(dir() / "out-kfac-pipe" / "log.jsonl");
  ASSERT_EQ(log.size(), 6u);
  int curvature = 0, inversion = 0;
  for (const auto& [step, j] : log) {
    curvature += j.at("kfac_curvature").get<bool>();
    inversion += j.at("kfac_inversion").get<bool>();
    EXPECT_GT(j.at("kfac_time_s").get<double>(), 0.0) << "every step preconditions: " << j.dump();
    EXPECT_TRUE(j.at("kfac_damping_raised").is_null()) << "not gathered under MPI";
    EXPECT_EQ(j.at("peak_rss_bytes").size(), 2u) << "every rank's peak: " << j.dump();
  }
  const auto summary = json_file(dir() / "out-kfac-pipe" / "summary.json");
  EXPECT_EQ(summary.at("peak_flops_per_s").get<double>(),
            2 * summary.at("machine").at("sgemm_peak_flops_per_s").get<double>()) << "two processes' peak";
  // The first steps profile K-FAC inline (a whole refresh each), later ones run the plan's units.
  EXPECT_GE(curvature, 1);
  EXPECT_GE(inversion, 1);
}

// MFU: model FLOPs per token (counted by hand below) x tokens per second, over the sgemm peak,
// which the first run on a machine measures and caches and later runs read: a cache holding
// 1 TFLOP/s is what the next run divides by. Peak memory: what the kernel says of the process.
TEST(RunLog, RecordsAndSummaryGiveMfuAgainstTheCachedPeakAndThePeakMemory) {
  tiny_config(dir());
  const fs::path cache = dir() / "peak-cache";
  const std::string env = "PF_CACHE_DIR=" + cache.string() + " ";
  Launch first = run(env + train_cmd(dir(), "mfu-measured", ""));
  ASSERT_EQ(first.status, 0) << first.out;
  rusage children{};
  getrusage(RUSAGE_CHILDREN, &children);  // the largest peak of this program's children: that run
  const double kernel_peak = static_cast<double>(children.ru_maxrss) * 1024;
  const auto measured = json_file(dir() / "out-mfu-measured" / "summary.json");
  const double run_peak = measured.at("memory").at("peak_rss_bytes").at(0).get<double>();
  EXPECT_NEAR(run_peak, kernel_peak, 0.1 * kernel_peak);
  const auto last = read_log(dir() / "out-mfu-measured" / "log.jsonl").at(6);
  EXPECT_NEAR(last.at("peak_rss_bytes").at(0).get<double>(), kernel_peak, 0.1 * kernel_peak);

  // The measurement is cached unless the machine was busy (it would understate every later run's peak).
  const fs::path cached = cache / ("sgemm-peak-" + pf::peak_key(1) + ".json");
  if (measured.at("machine").at("sgemm_peak_measured_busy").get<bool>()) {
    EXPECT_FALSE(fs::exists(cached)) << "a busy machine's measurement was cached";
  } else {
    ASSERT_TRUE(fs::exists(cached)) << "the run measured the peak and cached it";
    EXPECT_EQ(measured.at("machine").at("sgemm_peak_flops_per_s"), json_file(cached).at("flops_per_s"));
  }
  EXPECT_GT(measured.at("machine").at("sgemm_peak_flops_per_s").get<double>(), 1e8);
  fs::create_directories(cache);
  std::ofstream(cached) << nlohmann::json{{"key", pf::peak_key(1)}, {"flops_per_s", 1e12}}.dump();

  Launch second = run(env + train_cmd(dir(), "mfu-cached", ""));
  ASSERT_EQ(second.status, 0) << second.out;
  // tiny.toml: 4 layers, h 32, f 64, s 16, V 30522, round(0.15 x 14) = 2 masked positions. A block:
  // 4 x 32^2 + 2 x 32 x 64 + 2 x 16 x 32 = 9216, four: 36864; the head 2 x (32^2 + 32 x 30522) / 16
  // = 122216; a training step 6 x (36864 + 122216) = 954480 per token.
  const double flops_per_token = 954480;
  const auto summary = json_file(dir() / "out-mfu-cached" / "summary.json");
  EXPECT_EQ(summary.at("model_flops_per_token").get<double>(), flops_per_token);
  EXPECT_EQ(summary.at("peak_flops_per_s").get<double>(), 1e12);
  const double flops = summary.at("flops_per_s").get<double>();
  EXPECT_NEAR(flops, flops_per_token * summary.at("tokens_per_s").get<double>(), 1e-12 * flops);
  EXPECT_NEAR(summary.at("mfu").get<double>(), flops / 1e12, 1e-12 * flops / 1e12);
  double previous_peak = 0;
  for (const auto& [step, j] : read_log(dir() / "out-mfu-cached" / "log.jsonl")) {
    const double f = j.at("flops_per_s").get<double>();
    EXPECT_EQ(j.at("model_flops_per_token").get<double>(), flops_per_token);
    EXPECT_NEAR(f, flops_per_token * j.at("tokens_per_s").get<double>(), 1e-12 * f) << j.dump();
    EXPECT_NEAR(j.at("mfu").get<double>(), f / 1e12, 1e-12 * f / 1e12) << j.dump();
    const double peak = j.at("peak_rss_bytes").at(0).get<double>();
    EXPECT_GE(peak, previous_peak) << "a peak so far never falls";
    previous_peak = peak;
  }
  // The last line says it all.
  const std::string last_line = second.out.substr(second.out.rfind("summary: "));
  EXPECT_TRUE(std::regex_search(last_line, std::regex(R"(FLOP/s = \d+\.\d% MFU \(peak 1 TFLOP/s\), [0-9.]+ s, peak memory)")))
      << last_line;
  EXPECT_EQ(std::count(last_line.begin(), last_line.end(), '\n'), 1) << "the summary is the run's last line";
}

}  // namespace
