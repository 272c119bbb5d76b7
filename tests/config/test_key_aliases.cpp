// [precond]'s keys (where and when K-FAC's or SOAP's periodic work runs) under their old kfac.*
// names: the same run either way, in a file or by --set; both names with different values in a file refused
// naming both; config.toml writes the new names, and an older one with the old names reads and
// compares as the same configuration.
#include "config/config.hpp"
#include "core/error.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

using pf::Config;

namespace {

// The moved keys, written out here rather than taken from the alias table under test.
const std::vector<std::pair<std::string, std::string>> kMoved = {
    {"kfac.placement", "precond.placement"},
    {"kfac.replan_on_drift", "precond.replan_on_drift"},
    {"kfac.min_refresh_steps", "precond.min_refresh_steps"},
    {"kfac.max_refresh_steps", "precond.max_refresh_steps"},
    {"kfac.plan_profile", "precond.plan_profile"},
    {"kfac.refresh_record", "precond.refresh_record"},
};

// `sets` with every moved key under its old name.
std::vector<std::string> old_spelling(std::vector<std::string> sets) {
  for (std::string& s : sets)
    for (const auto& [old_name, name] : kMoved)
      if (s.rfind(name + "=", 0) == 0) s = old_name + s.substr(name.size());
  return sets;
}

std::string error_of(const std::string& toml, const std::vector<std::string>& sets = {}) {
  try {
    Config::from_toml_string(toml, sets);
  } catch (const pf::UsageError& e) {
    return e.what();
  }
  return "";
}

// A text as an older build wrote config.toml: the [precond] keys in [kfac] under their old names.
std::string with_old_names(const std::string& toml) {
  const size_t at = toml.find("[precond]\n"), end = toml.find("\n[", at + 1);
  const std::string block = toml.substr(at + 10, end - at - 10);
  std::string out = toml.substr(0, at) + toml.substr(end + 1);
  out.insert(out.find("[kfac]\n") + 7, block);
  return out;
}

// The lines of `table` in a config.toml text.
std::string table_of(const std::string& toml, const std::string& table) {
  const size_t at = toml.find("[" + table + "]\n");
  return at == std::string::npos ? "" : toml.substr(at, toml.find("\n[", at + 1) - at);
}

// The configurations the moved keys matter in: K-FAC adaptive and bubbles, K-FAC replay, SOAP in
// the bubbles, and with a recorded plan.
const std::vector<std::vector<std::string>> kRuns = {
    {"kfac.enabled=true", "parallel.stages=2", "precond.placement=adaptive", "precond.min_refresh_steps=2",
     "precond.max_refresh_steps=8", "precond.replan_on_drift=false"},
    {"kfac.enabled=true", "parallel.stages=2", "precond.placement=bubbles", "precond.plan_profile=/tmp/p.json"},
    {"kfac.enabled=true", "precond.placement=replay", "precond.refresh_record=/tmp/r.json"},
    {"optim.name=soap", "parallel.stages=2", "precond.placement=bubbles", "precond.min_refresh_steps=20"},
    {"optim.name=soap", "precond.placement=replay", "precond.refresh_record=/tmp/s.json"},
};

}  // namespace

TEST(KeyAliases, OldAndNewNamesGiveTheSameConfig) {
  for (const auto& sets : kRuns) {
    const Config a = Config::from_toml_string("", sets), b = Config::from_toml_string("", old_spelling(sets));
    EXPECT_TRUE(a == b) << sets[2] << "\n" << a.to_toml() << "\n" << b.to_toml();
    EXPECT_EQ(a.to_toml(), b.to_toml());
    EXPECT_FALSE(a == Config::from_toml_string("")) << "the keys were read at all";
    // config.toml writes the new names only.
    EXPECT_NE(a.to_toml().find("[precond]\nmax_refresh_steps = "), std::string::npos) << a.to_toml();
    EXPECT_EQ(table_of(a.to_toml(), "kfac").find("placement = "), std::string::npos) << a.to_toml();
  }
  // In a file too, as a table or dotted keys.
  const Config t = Config::from_toml_string("[kfac]\nenabled = true\nplacement = \"skip\"\ninverse_every = 3\n");
  const Config u = Config::from_toml_string("[kfac]\nenabled = true\ninverse_every = 3\n[precond]\nplacement = \"skip\"\n");
  const Config v = Config::from_toml_string("kfac.enabled = true\nkfac.inverse_every = 3\nkfac.placement = \"skip\"\n");
  EXPECT_EQ(t.kfac.placement, pf::Placement::Skip);
  EXPECT_TRUE(t == u);
  EXPECT_TRUE(v == u);
}

TEST(KeyAliases, BothNamesWithDifferentValuesAreRefusedNamingBoth) {
  EXPECT_EQ(error_of("[kfac]\nenabled = true\nplacement = \"inline\"\n[precond]\nplacement = \"skip\"\n"),
            "precond.placement: set twice with different values, as precond.placement = 'skip' and as "
            "kfac.placement = 'inline' (its old name): keep one");
  EXPECT_EQ(error_of("kfac.enabled = true\nkfac.min_refresh_steps = 3\nprecond.min_refresh_steps = 2\n"
                     "parallel.stages = 2\n"),
            "precond.min_refresh_steps: set twice with different values, as precond.min_refresh_steps = 2 and as "
            "kfac.min_refresh_steps = 3 (its old name): keep one");
  // Two --set under the two names: the later wins, as a later --set of one name does.
  const std::vector<std::string> later = {"kfac.enabled=true", "parallel.stages=2", "precond.min_refresh_steps=2",
                                          "kfac.min_refresh_steps=3"};
  EXPECT_EQ(Config::from_toml_string("", later).kfac.min_refresh_steps, 3);
  EXPECT_TRUE(Config::from_toml_string("", {"kfac.replan_on_drift=false", "precond.replan_on_drift=true"}).kfac.replan_on_drift);
  // A bad value is refused naming the name it was written under.
  EXPECT_EQ(error_of("", {"kfac.placement=bubble"}).rfind("kfac.placement: 'bubble' is not one of", 0), 0u);
  EXPECT_EQ(error_of("", {"precond.placement=bubble"}).rfind("precond.placement: 'bubble' is not one of", 0), 0u);
  // A misspelt old name is pointed at the new one.
  EXPECT_EQ(error_of("", {"kfac.placment=bubbles"}), "kfac.placment: unknown configuration key (did you mean "
                                                     "precond.placement?)");
  EXPECT_EQ(error_of("[precond]\nplacment = 'bubbles'\n"),
            "precond.placment: unknown configuration key (did you mean precond.placement?)");
}

TEST(KeyAliases, BothNamesWithTheSameValueAreOneKey) {
  for (const auto& sets : kRuns) {
    std::vector<std::string> both = sets;
    for (const std::string& s : old_spelling(sets))
      if (s.rfind("kfac.", 0) == 0 && s != "kfac.enabled=true") both.push_back(s);
    ASSERT_GT(both.size(), sets.size());
    EXPECT_TRUE(Config::from_toml_string("", both) == Config::from_toml_string("", sets)) << sets[2];
  }
}

// A file with one name and --set with either: the --set wins, as an override does (the file's
// other name is dropped); a path is the same file whether the file's (against its directory) or
// --set's (against the current one).
TEST(KeyAliases, SetWithTheOtherNameOverAFile) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("pf_key_aliases_" + std::to_string(::getpid()));
  fs::create_directories(d);
  const std::string file = (d / "c.toml").string();
  std::ofstream(file) << "[optim]\nname = \"soap\"\n[parallel]\nstages = 2\n[precond]\nplacement = \"bubbles\"\n";
  EXPECT_EQ(Config::load(file, {"kfac.placement=bubbles"}), Config::load(file));
  EXPECT_EQ(Config::load(file).kfac.placement, pf::Placement::Bubbles);
  EXPECT_EQ(Config::load(file, {"precond.placement=inline"}).kfac.placement, pf::Placement::Inline);
  EXPECT_EQ(Config::load(file, {"kfac.placement=inline"}).kfac.placement, pf::Placement::Inline);
  std::ofstream(file) << "[optim]\nname = \"soap\"\n[kfac]\nplacement = \"replay\"\nrefresh_record = \"s.json\"\n";
  const Config old_file = Config::load(file);
  EXPECT_EQ(old_file.kfac.refresh_record, (d / "s.json").string());
  EXPECT_EQ(Config::load(file, {"precond.refresh_record=" + (d / "s.json").string()}), old_file);
  EXPECT_EQ(Config::load(file, {"precond.placement=replay"}), old_file);
  EXPECT_EQ(Config::load(file, {"precond.refresh_record=" + (d / "t.json").string()}).kfac.refresh_record,
            (d / "t.json").string());
  fs::remove_all(d);
}

TEST(KeyAliases, DescribeListsTheNewKeysWithTheirOldNames) {
  const std::string d = pf::describe_config();
  EXPECT_NE(d.find("\n## [precond]\n"), std::string::npos);
  for (const auto& [old_name, name] : kMoved) {
    EXPECT_NE(d.find("| `" + name + "` |"), std::string::npos) << name;
    EXPECT_EQ(d.find("| `" + old_name + "` |"), std::string::npos) << old_name << " is no key of its own";
    EXPECT_NE(d.find("(old name: `" + old_name + "`) |"), std::string::npos) << old_name;
    EXPECT_EQ(pf::current_key_name(old_name), name);
    EXPECT_EQ(pf::old_key_name(name), old_name);
  }
  EXPECT_NE(d.find("| `precond.min_refresh_steps` | integer | `1` | [1, 1000] |"), std::string::npos);
  EXPECT_NE(d.find("| `precond.placement` | one of bubbles, inline, skip, replay, adaptive | `'bubbles'` |"),
            std::string::npos);
  EXPECT_EQ(pf::current_key_name("kfac.damping"), "kfac.damping");
  EXPECT_EQ(pf::old_key_name("kfac.damping"), "");
}

// An older run's config.toml (its [kfac] table held placement, ...) is the same configuration:
// it loads to the same Config and compares equal to the new text, so the run continues.
TEST(KeyAliases, AnOlderConfigTomlWithTheOldNamesIsTheSameRun) {
  for (const auto& sets : kRuns) {
    const Config a = Config::from_toml_string("", sets);
    const std::string old_text = with_old_names(a.to_toml());
    ASSERT_EQ(old_text.find("[precond]"), std::string::npos) << old_text;
    ASSERT_NE(table_of(old_text, "kfac").find("\nplacement = "), std::string::npos) << old_text;
    EXPECT_TRUE(Config::from_toml_string(old_text) == a) << old_text;
    const pf::KeyDifference same = pf::first_difference(old_text, a.to_toml());
    EXPECT_EQ(same.key, "") << same.key << ": " << same.a << " vs " << same.b;
    // A value that differs is still found, under the new name.
    const Config other = Config::from_toml_string("", {"optim.name=soap"});
    const pf::KeyDifference d = pf::first_difference(with_old_names(other.to_toml()), a.to_toml());
    EXPECT_FALSE(d.key.empty());
  }
  const Config soap = Config::from_toml_string("", {"optim.name=soap"});
  const Config bubbles = Config::from_toml_string("", {"optim.name=soap", "parallel.stages=2", "precond.placement=bubbles"});
  const pf::KeyDifference d = pf::first_difference(with_old_names(soap.to_toml()), with_old_names(bubbles.to_toml()),
                                                   {"parallel.stages"});
  EXPECT_EQ(d.key, "precond.placement");
  EXPECT_EQ(d.a, "'inline'");
  EXPECT_EQ(d.b, "'bubbles'");
}

// SOAP's planned refreshes keep precond.min_refresh_steps (runtime/soap/soap_placement.hpp); it
// is still refused where no plan is made.
TEST(KeyAliases, MinRefreshStepsAppliesToSoapInTheBubbles) {
  const Config s = Config::from_toml_string("", {"optim.name=soap", "parallel.stages=2", "precond.placement=bubbles",
                                                 "precond.min_refresh_steps=20"});
  EXPECT_EQ(s.kfac.min_refresh_steps, 20);
  EXPECT_EQ(error_of("", {"optim.name=soap", "precond.min_refresh_steps=20"}),
            "precond.min_refresh_steps: only applies with precond.placement = bubbles or adaptive (and kfac.enabled = "
            "true or optim.name = soap)");
}
