// `pipefisher report`: the loss chart of runs' log.jsonl, the target's crossing points, bad input.
#include "../support/launch.hpp"
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
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

// A crossing in the right half of a panel is labelled leftward (text-anchor end), so that the
// panel's clip does not cut the label; one in the left half rightward.
TEST(ReportCli, CrossingLabelsReadAwayFromTheNearerEdge) {
  const fs::path late = fake_run("late", 300, 0.005, 1.0), early = fake_run("early", 300, 0.01, 1.0);
  const fs::path svg = dir() / "edges.svg";
  pf_test::Launch r = report(late.string() + " " + early.string() + " --target 8.6 --out " + svg.string());
  ASSERT_EQ(r.status, 0) << r.out;
  std::stringstream body;
  body << std::ifstream(svg).rdbuf();
  // late reaches 8.6 at step 280 (about 280 s of 300), early at step 140 (of 300: left of the middle).
  EXPECT_TRUE(std::regex_search(body.str(), std::regex("text-anchor=\"end\" fill=\"#[0-9a-fA-F]+\">step 280<")));
  EXPECT_TRUE(std::regex_search(body.str(), std::regex("text-anchor=\"end\" fill=\"#[0-9a-fA-F]+\">2[78][0-9][.][0-9] s<")));
  EXPECT_TRUE(std::regex_search(body.str(), std::regex("text-anchor=\"start\" fill=\"#[0-9a-fA-F]+\">step 140<")));
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

}  // namespace

namespace {

// The PNG converter runs through argv: a run directory named to break out of a shell command
// runs nothing. A stand-in rsvg-convert first on PATH records its arguments and writes the PNG,
// so the test does not depend on the real one being installed. (With std::system and the names
// in quotes, the name below created PWNED.)
TEST(ReportCli, RunsNoCommandFromAName) {
  const std::string name = "run';touch PWNED;'";
  fake_run(name, 3, 0.1, 0.01);
  const fs::path bin = dir() / "fake-bin";
  fs::create_directories(bin);
  std::ofstream(bin / "rsvg-convert") << "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$(dirname \"$0\")/args\"\necho PNG > \"$2\"\n";
  fs::permissions(bin / "rsvg-convert", fs::perms::owner_all);
  fs::remove(dir() / "PWNED");
  const pf_test::Launch r = pf_test::run("cd " + dir().string() + " && PATH=" + bin.string() + ":$PATH " +
                                         PF_BINARY + " report \"" + name + "\"");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_FALSE(fs::exists(dir() / "PWNED")) << "a shell ran a command from the run's name";
  std::ifstream args(bin / "args");
  const std::string recorded((std::istreambuf_iterator<char>(args)), std::istreambuf_iterator<char>());
  EXPECT_EQ(recorded, "-o\n" + name + "/loss.png\n" + name + "/loss.svg\n");  // each name one argument
  EXPECT_TRUE(fs::exists(dir() / name / "loss.png"));
}

}  // namespace
