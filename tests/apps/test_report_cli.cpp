// `pipefisher report`: the loss chart of runs' log.jsonl, the target's crossing points, bad input.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

fs::path dir() { return pf_test::scratch_dir("report_cli"); }

// A run whose loss falls linearly, 10 - rate x step, each step taking dt seconds, validation
// every 50 steps.
fs::path fake_run(const std::string& name, int steps, double rate, double dt) {
  const fs::path d = dir() / name;
  fs::create_directories(d);
  std::ofstream f(d / "log.jsonl");
  for (int s = 1; s <= steps; ++s) {
    nlohmann::json j = {{"step", s}, {"loss", 10 - rate * s}, {"lr", 1e-3}, {"step_time_s", dt}};
    if (s % 50 == 0) j["valid_loss"] = 10.1 - rate * s;
    f << j.dump() << "\n";
  }
  return d;
}

pf_test::Launch report(const std::string& args) { return pf_test::run(std::string(PF_BINARY) + " report " + args); }

// A straight line passes the zero-phase filter unchanged (its response is symmetric and sums to
// one; the odd extension continues the line), so each run reaches 9.0 where the raw line does:
// step 1 / rate, at that many steps' time.
TEST(ReportCli, CrossingsOfTheTargetAndBothPictures) {
  const fs::path a = fake_run("slow", 400, 0.005, 0.5), b = fake_run("fast", 300, 0.01, 0.7);
  const fs::path svg = dir() / "fig.svg";
  pf_test::Launch r = report(a.string() + " " + b.string() + " --target 9 --json --out " + svg.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["name"], "slow");
  EXPECT_NEAR(j["runs"][0]["reaches_target"]["step"].get<double>(), 200, 0.5);
  EXPECT_NEAR(j["runs"][0]["reaches_target"]["time_s"].get<double>(), 100, 0.3);
  EXPECT_NEAR(j["runs"][1]["reaches_target"]["step"].get<double>(), 100, 0.5);
  EXPECT_NEAR(j["runs"][1]["reaches_target"]["time_s"].get<double>(), 70, 0.4);
  EXPECT_NEAR(j["runs"][0]["final_smoothed_loss"].get<double>(), 8.0, 0.05);  // the ends carry a transient
  EXPECT_NEAR(j["runs"][1]["final_valid_loss"].get<double>(), 7.1, 1e-9);
  EXPECT_NEAR(j["runs"][1]["time_s"].get<double>(), 210, 1e-6);
  std::stringstream body;
  body << std::ifstream(svg).rdbuf();
  for (const char* want : {"slow", "fast", "target 9", "step 200", "training time (s)", "70.0 s"})
    EXPECT_NE(body.str().find(want), std::string::npos) << want;
  if (std::system("command -v rsvg-convert >/dev/null 2>&1") == 0) {
    EXPECT_TRUE(fs::exists(dir() / "fig.png"));
    EXPECT_EQ(j["png"], (dir() / "fig.png").string());
  }
  // Beyond reach: no crossing.
  pf_test::Launch low = report(a.string() + " --target 2 --json --out " + (dir() / "low.svg").string());
  ASSERT_EQ(low.status, 0) << low.out;
  EXPECT_TRUE(nlohmann::json::parse(low.out)["runs"][0]["reaches_target"].is_null());
}

// Nothing written over the curves: the crossings' numbers are in the legend, the target in each
// panel's title; inside the panels' clip only lines and rings. Validation dots are drawn outside
// the clip (one on the right edge stays whole), and the loss axis is labelled.
TEST(ReportCli, LabelsStayOffTheCurves) {
  const fs::path late = fake_run("late", 300, 0.005, 1.0), early = fake_run("early", 300, 0.01, 1.0);
  const fs::path svg = dir() / "edges.svg";
  pf_test::Launch r = report(late.string() + " " + early.string() + " --target 8.6 --out " + svg.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::stringstream body;
  body << std::ifstream(svg).rdbuf();
  const std::string s = body.str();
  // late reaches 8.6 at step 280 (about 280 s of 300), early at step 140.
  EXPECT_TRUE(std::regex_search(s, std::regex(">late: reaches 8[.]6 at step 280 [(]2[78][0-9][.][0-9] s[)]<"))) << s;
  EXPECT_TRUE(std::regex_search(s, std::regex(">early: reaches 8[.]6 at step 140 [(]")));
  EXPECT_NE(s.find("training loss vs steps (dashed: target 8.6)"), std::string::npos);
  EXPECT_NE(s.find(">loss (nats)</text>"), std::string::npos);
  for (size_t at = s.find("<g clip-path="); at != std::string::npos; at = s.find("<g clip-path=", at + 1)) {
    const std::string inside = s.substr(at, s.find("</g>", at) - at);
    EXPECT_EQ(inside.find("<text"), std::string::npos) << inside.substr(0, 400);
    EXPECT_EQ(inside.find("stroke=\"#fff\""), std::string::npos) << "a validation dot inside the clip";
  }
  EXPECT_NE(s.find("stroke=\"#fff\""), std::string::npos) << "validation dots drawn";
}

TEST(ReportCli, BadInputExitsTwoNamingIt) {
  const pf_test::Launch missing = report((dir() / "absent").string());
  EXPECT_EQ(missing.status, 2) << missing.out;
  EXPECT_NE(missing.out.find("absent"), std::string::npos) << missing.out;
  fs::create_directories(dir() / "bad");
  std::ofstream(dir() / "bad" / "log.jsonl") << "{\"step\": 1, \"loss\": 3}\nnot json\n";
  const pf_test::Launch bad = report((dir() / "bad").string());
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("log.jsonl:2"), std::string::npos) << bad.out;
  const fs::path a = fake_run("one", 10, 0.1, 1);
  const pf_test::Launch labels = report(a.string() + " --label x --label y");
  EXPECT_EQ(labels.status, 2) << labels.out;
  EXPECT_NE(labels.out.find("--label"), std::string::npos) << labels.out;
}

// A run too short for the paper's filter (5 steps, as the default job's): report warns and
// smooths it with a faster filter, whose line ends near the raw loss (a line falling 0.8 here),
// not flat above it; --json names the cutoff.
TEST(ReportCli, AShortRunIsSmoothedFasterAndSaysSo) {
  const fs::path a = fake_run("five", 5, 0.2, 1);
  const pf_test::Launch r = report(a.string() + " --out " + (dir() / "five.svg").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("warning: 5 finite steps, fewer than the 80 the paper's filter needs: smoothed with "
                       "cutoff 0.8 of the Nyquist frequency"),
            std::string::npos)
      << r.out;
  const pf_test::Launch js = report(a.string() + " --json --out " + (dir() / "five.svg").string());
  ASSERT_EQ(js.status, 0) << js.out;
  const nlohmann::json run = nlohmann::json::parse(js.out)["runs"][0];
  EXPECT_DOUBLE_EQ(run["smoothing_cutoff"].get<double>(), 0.8);
  EXPECT_NEAR(run["final_smoothed_loss"].get<double>(), 9.0, 0.02) << run;
  const pf_test::Launch long_run = report(fake_run("long", 100, 0.01, 1).string() + " --out " + (dir() / "long.svg").string());
  ASSERT_EQ(long_run.status, 0) << long_run.out;
  EXPECT_EQ(long_run.out.find("warning"), std::string::npos) << long_run.out;
}

// A convergence study keeps a finished run as its small record (bench/convergence/record.py):
// restored, the record reads in `report` as the run did (losses to 8 digits, times to 0.1 ms a
// step) and carries the final weights' language-model loss as `pipefisher eval` gives it, with
// its micro-batches' shares.
TEST(ReportCli, AStudyRunsRecordReadsAsTheRun) {
  const fs::path run = dir() / "study-run", restored = dir() / "study-restored", record = dir() / "study.json";
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const pf_test::Launch train = pf_test::run(
      "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + std::string(PF_BINARY) +
      " train --steps 6 --set model.layers=1 --set model.hidden=32 --set model.heads=2 --set model.ffn=64"
      " --set model.seq_len=16 --set parallel.micro_batches=1 --set parallel.micro_batch_size=2 --set train.threads=1"
      " --set train.eval_every=3 --set train.eval_batches=2 --set data.train_file=" + sample +
      " --set data.valid_file=" + sample + " --set train.out_dir=" + run.string());
  ASSERT_EQ(train.status, 0) << train.out;
  std::ofstream(run / "args") << "the run's arguments\n";
  std::ofstream(run / "status") << "0\n";
  const std::string py = "/usr/bin/python3 " + std::string(PF_SOURCE_DIR) + "/bench/convergence/record.py ";
  const pf_test::Launch save = pf_test::run(py + "save " + run.string() + " " + record.string() + " " + PF_BINARY);
  ASSERT_EQ(save.status, 0) << save.out;
  const pf_test::Launch back = pf_test::run(py + "restore " + record.string() + " " + restored.string());
  ASSERT_EQ(back.status, 0) << back.out;

  const pf_test::Launch r = report(run.string() + " " + restored.string() + " --json --out " + (dir() / "study.svg").string());
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json runs = nlohmann::json::parse(r.out)["runs"];
  for (const char* key : {"final_loss", "final_smoothed_loss", "final_valid_loss"})
    EXPECT_NEAR(runs[1][key].get<double>(), runs[0][key].get<double>(), 1e-6) << key;
  EXPECT_NEAR(runs[1]["time_s"].get<double>(), runs[0]["time_s"].get<double>(), 6 * 0.5e-4);
  EXPECT_EQ(runs[1]["steps"], 6);
  const pf_test::Launch eval = pf_test::run(std::string(PF_BINARY) + " eval --config " + (run / "config.toml").string() +
                                            " --init " + (run / "model.safetensors").string() + " --batches 0 --json");
  ASSERT_EQ(eval.status, 0) << eval.out;
  const double lm = nlohmann::json::parse(eval.out.substr(eval.out.rfind("{\"")))["lm_loss"].get<double>();
  double kept = 0;
  std::ifstream(restored / "lm_loss") >> kept;
  EXPECT_EQ(kept, lm);
  // And each held-out micro-batch's share of it, for paired comparisons (eval --per-batch):
  // summed in eval's order they give the loss exactly.
  const nlohmann::json per = nlohmann::json::parse(std::ifstream(restored / "lm_shares.json"));
  ASSERT_EQ(per["lm_shares"].size(), per["batch_positions"].size());
  double sum = 0;
  for (const auto& share : per["lm_shares"]) sum += share.get<double>();
  EXPECT_EQ(sum, lm);
  std::string args;
  std::getline(std::ifstream(restored / "args") >> std::ws, args);
  EXPECT_EQ(args, "the run's arguments");
}

// The program's own log of a run with a skipped step (its loss non-finite, logged as null: the
// test seam --test-poison poisons step 2's loss scale): report reads it, counts the step, and draws
// it as a gap (the raw and smoothed lines each break there) without a NaN anywhere in the picture.
TEST(ReportCli, ReadsTheProgramsOwnLogWithASkippedStep) {
  const fs::path out = dir() / "skipped";
  const std::string sample = std::string(PF_SOURCE_DIR) + "/data/sample/moby-dick-1-20.bert.bin";
  const pf_test::Launch train = pf_test::run(
      "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + std::string(PF_BINARY) +
      " train --steps 4 --test-poison 2:nan --set model.layers=1 --set model.hidden=32 --set model.heads=2"
      " --set model.ffn=64 --set model.seq_len=16 --set parallel.micro_batches=1 --set parallel.micro_batch_size=2"
      " --set train.threads=1 --set train.eval_every=0 --set data.train_file=" + sample + " --set data.valid_file=" + sample +
      " --set train.out_dir=" + out.string());
  ASSERT_EQ(train.status, 0) << train.out;
  std::stringstream log;
  log << std::ifstream(out / "log.jsonl").rdbuf();
  ASSERT_NE(log.str().find("\"loss\":null"), std::string::npos) << log.str();

  const fs::path svg = dir() / "skipped.svg";
  const pf_test::Launch r = report(out.string() + " --json --out " + svg.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out)["runs"][0];
  EXPECT_EQ(j["skipped_steps"], 1);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_TRUE(j["final_loss"].is_number()) << j.dump();
  EXPECT_TRUE(j["final_smoothed_loss"].is_number()) << j.dump();
  std::stringstream read;
  read << std::ifstream(svg).rdbuf();
  const std::string body = read.str();
  EXPECT_EQ(body.find("nan"), std::string::npos);
  EXPECT_NE(body.find("skipped (1 step skipped: gaps)"), std::string::npos);
  // Both lines of the run, in each panel, are drawn in two pieces: step 1 (a dot: a zero-length
  // segment with round caps), then steps 3-4.
  const std::regex path("<path d=\"([^\"]*)\"");
  int lines = 0;
  for (auto it = std::sregex_iterator(body.begin(), body.end(), path); it != std::sregex_iterator(); ++it, ++lines) {
    const std::string d = (*it)[1].str();
    const std::string xy = "[0-9.]+,[0-9.]+ ";
    EXPECT_TRUE(std::regex_match(d, std::regex("M" + xy + "l0,0 M" + xy + "L" + xy))) << d;
  }
  EXPECT_EQ(lines, 4);

  const pf_test::Launch text = report(out.string() + " --out " + (dir() / "skipped-text.svg").string());
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("skipped: 4 steps"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find(", 1 step skipped (non-finite loss)"), std::string::npos) << text.out;
}

struct BadLog {
  std::string text, message;  // the log's content; the error after "pipefisher: LOG:"
  friend std::ostream& operator<<(std::ostream& os, const BadLog& b) { return os << b.message; }
};

class ReportBadLog : public ::testing::TestWithParam<BadLog> {};

// A malformed log: status 2 and one line naming the file, the line and what is wrong with it.
TEST_P(ReportBadLog, ExitsTwoWithOneLineNamingFileAndLine) {
  const fs::path log = dir() / ("bad-" + std::to_string(std::hash<std::string>{}(GetParam().text)) + ".jsonl");
  std::ofstream(log) << GetParam().text;
  const pf_test::Launch r = report(log.string() + " --out " + (dir() / "bad.svg").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_EQ(r.out, "pipefisher: " + log.string() + ":" + GetParam().message + "\n");
  EXPECT_FALSE(fs::exists(dir() / "bad.svg"));
}

INSTANTIATE_TEST_SUITE_P(
    Logs, ReportBadLog,
    ::testing::Values(
        BadLog{"{\"step\":1,\"loss\":3}\nnot json\n{\"step\":3,\"loss\":2}\n",
               "2: not JSON (a run log has one JSON object per line)"},
        BadLog{"[1, 2]\n", "1: not a run log record (a JSON object with step, loss, step_time_s)"},
        BadLog{"{\"step\":1,\"loss\":\"low\"}\n", "1: \"loss\" must be a number, got string"},
        BadLog{"{\"loss\":3}\n", "1: \"step\" must be a whole number >= 0 (a run log record has step, loss, step_time_s)"},
        BadLog{"{\"step\":1,\"loss\":3}\n{\"step\":2}\n", "2: no \"loss\" (a run log record has step, loss, step_time_s)"},
        BadLog{"{\"step\":1,\"loss\":3,\"step_time_s\":1}\n{\"step\":2,\"loss\":3,\"step_time_s\":-5.0}\n",
               "2: \"step_time_s\" must be a non-negative number of seconds, got -5.0"},
        BadLog{"{\"step\":1,\"loss\":3,\"step_time_s\":null}\n",
               "1: \"step_time_s\" must be a non-negative number of seconds, got null"},
        BadLog{"{\"step\":1,\"loss\":3,\"step_time_s\":1e300}\n", "1: \"step_time_s\" = 1e+300 is beyond any value a run logs"},
        BadLog{"{\"step\":1,\"loss\":3,\"valid_loss\":true}\n", "1: \"valid_loss\" must be a number, got boolean"}));

// A run stopped mid-write leaves half a line at the end of its log: the steps before it report,
// and the text says the last line was left out.
TEST(ReportCli, ALastLineCutShortIsLeftOut) {
  const fs::path log = dir() / "cut.jsonl";
  std::ofstream(log) << "{\"step\":1,\"loss\":3,\"step_time_s\":1}\n{\"step\":2,\"loss\":2.5,\"step_time_s\":1}\n\n{\"step\":3,\"lo";
  const pf_test::Launch r = report(log.string() + " --out " + (dir() / "cut.svg").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("cut.jsonl: 2 steps, 2.0 s, final loss 2.5000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("last line is cut short"), std::string::npos) << r.out;
}

TEST(ReportCli, TargetMustBeAFiniteLoss) {
  const fs::path a = fake_run("target", 10, 0.1, 1);
  for (const std::string t : {"nan", "inf", "-inf", "1e300"}) {
    const pf_test::Launch r = report(a.string() + " --target " + t + " --out " + (dir() / "t.svg").string());
    EXPECT_EQ(r.status, 2) << t << ": " << r.out;
    EXPECT_EQ(r.out.rfind("pipefisher: --target: must be a finite loss", 0), 0u) << r.out;
    EXPECT_FALSE(fs::exists(dir() / "t.svg")) << t;
  }
}

}  // namespace

namespace {

// The PNG converter runs through argv: a run directory named to break out of a shell command
// runs nothing. A stand-in rsvg-convert first on PATH records its arguments and writes the PNG to
// stdout (which report writes to RUN/loss.png like every output), so the test does not depend on
// the real one being installed. (With std::system and the names in quotes, the name below created
// PWNED.) Without a converter on PATH: the SVG alone, exit 0.
TEST(ReportCli, RunsNoCommandFromAName) {
  const std::string name = "run';touch PWNED;'";
  fake_run(name, 3, 0.1, 0.01);
  const fs::path bin = dir() / "fake-bin";
  fs::create_directories(bin);
  std::ofstream(bin / "rsvg-convert") << "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$(dirname \"$0\")/args\"\necho PNG\n";
  fs::permissions(bin / "rsvg-convert", fs::perms::owner_all);
  fs::remove(dir() / "PWNED");
  const std::string cd = "cd " + dir().string() + " && ";
  const pf_test::Launch r = pf_test::run(cd + "PATH=" + bin.string() + ":$PATH " + PF_BINARY + " report \"" + name + "\"");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir() / "PWNED")) << "a shell ran a command from the run's name";
  std::ifstream args(bin / "args");
  const std::string recorded((std::istreambuf_iterator<char>(args)), std::istreambuf_iterator<char>());
  EXPECT_EQ(recorded, name + "/loss.svg\n");  // the name is one argument
  std::ifstream png(dir() / name / "loss.png");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(png)), std::istreambuf_iterator<char>()), "PNG\n");
  EXPECT_NE(r.out.find("report: " + name + "/loss.svg, " + name + "/loss.png"), std::string::npos) << r.out;
  fs::remove(dir() / name / "loss.png");
  const pf_test::Launch none = pf_test::run(cd + "PATH=" + (dir() / "empty-bin").string() + " " + PF_BINARY +
                                            " report \"" + name + "\"");
  EXPECT_EQ(none.status, 0) << none.out;
  EXPECT_NE(none.out.find("report: " + name + "/loss.svg\n"), std::string::npos) << none.out;
  EXPECT_FALSE(fs::exists(dir() / name / "loss.png"));
  EXPECT_FALSE(fs::exists(dir() / "PWNED"));
}

}  // namespace

// Issue 34, item 10: a 300,000-step log draws as the points each pixel column can show (its
// first, last, lowest and highest), so the SVG stays small enough for a renderer and the PNG is
// made; a one-step spike survives the thinning.
TEST(ReportCli, ALongLogIsThinnedToThePixelsAndKeepsItsSpikes) {
  const fs::path d = dir() / "long";
  fs::create_directories(d);
  {
    std::ofstream f(d / "log.jsonl");
    for (int s = 1; s <= 300000; ++s)
      f << nlohmann::json({{"step", s}, {"loss", s == 150001 ? 9.0 : 5.0}, {"step_time_s", 0.01}}).dump() << "\n";
  }
  const pf_test::Launch r = report(d.string() + " --json --out " + (dir() / "long.svg").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_LT(fs::file_size(dir() / "long.svg"), size_t{1} << 20);
  const bool converter = pf_test::run("command -v rsvg-convert").status == 0;
  if (converter) EXPECT_TRUE(fs::exists(dir() / "long.png")) << r.out;
  // The raw loss (the half-opaque path) of the steps panel still reaches two heights: 5 and the spike.
  std::ifstream in(dir() / "long.svg");
  const std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // (Searched by hand: std::regex recurses per character, too deep for a path this long.)
  const size_t attrs = svg.find("stroke-opacity=\"0.5\"");
  ASSERT_NE(attrs, std::string::npos);
  const size_t begin = svg.rfind("<path d=\"", attrs) + 9, end = svg.find('"', begin);
  const std::string d_attr = svg.substr(begin, end - begin);
  std::set<std::string> ys;
  for (size_t at = d_attr.find_first_of("ML"); at != std::string::npos; at = d_attr.find_first_of("ML", at + 1)) {
    const size_t comma = d_attr.find(',', at), space = d_attr.find(' ', comma);
    ys.insert(d_attr.substr(comma + 1, space - comma - 1));
  }
  EXPECT_EQ(ys.size(), 2u) << d_attr.substr(0, 400);
}

namespace {

// Issue 50, item 16: a log whose lines are out of order (or that holds two runs) is refused naming
// the file and line, not reported as the run its last line belongs to.
TEST(ReportCli, ALogOutOfOrderIsRefusedNamingTheLine) {
  fs::create_directories(dir() / "disorder");
  std::ofstream(dir() / "disorder" / "log.jsonl") << "{\"step\": 1, \"loss\": 3}\n{\"step\": 3, \"loss\": 2}\n"
                                                  << "{\"step\": 2, \"loss\": 2.5}\n";
  for (const std::string json : {"", " --json"}) {
    const pf_test::Launch r = report((dir() / "disorder").string() + json);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("log.jsonl:3: step 2 after step 3"), std::string::npos) << r.out;
  }
  fs::create_directories(dir() / "twice");
  std::ofstream(dir() / "twice" / "log.jsonl") << "{\"step\": 1, \"loss\": 3}\n{\"step\": 1, \"loss\": 3}\n";
  const pf_test::Launch t = report((dir() / "twice").string());
  EXPECT_EQ(t.status, 2) << t.out;
  EXPECT_NE(t.out.find("log.jsonl:2: step 1 after step 1"), std::string::npos) << t.out;
}

// Issue 50, item 17: `--out photo.svg` never replaces a photo.png (or an SVG) this command did not
// draw; its own chart is redrawn in place; --overwrite replaces the others.
TEST(ReportCli, APictureItDidNotDrawIsNotReplaced) {
  const fs::path run = fake_run("pictures", 20, 0.1, 1), pics = dir() / "pictures-out";
  fs::create_directories(pics);
  std::ofstream(pics / "photo.png") << "a photo";
  const pf_test::Launch r = report(run.string() + " --out " + (pics / "photo.svg").string());
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("--out: '" + (pics / "photo.png").string() + "' exists and is no chart"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(pics / "photo.svg"));
  std::ofstream(pics / "drawing.svg") << "<svg xmlns=\"http://www.w3.org/2000/svg\"/>";
  const pf_test::Launch d = report(run.string() + " --out " + (pics / "drawing.svg").string());
  EXPECT_EQ(d.status, 2) << d.out;
  EXPECT_NE(d.out.find("drawing.svg' exists and is no chart"), std::string::npos) << d.out;
  std::ifstream photo(pics / "photo.png");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(photo), {}), "a photo");
  // Its own chart, twice: the second replaces the first's SVG and PNG.
  for (int k = 0; k < 2; ++k) {
    const pf_test::Launch own = report(run.string() + " --out " + (pics / "chart.svg").string());
    EXPECT_EQ(own.status, 0) << own.out;
  }
  const pf_test::Launch o = report(run.string() + " --out " + (pics / "photo.svg").string() + " --overwrite");
  EXPECT_EQ(o.status, 0) << o.out;
}

}  // namespace
