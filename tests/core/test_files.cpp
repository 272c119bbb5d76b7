// core/files.hpp: the one rule every output follows (a temporary renamed over a regular file; a
// link, device or FIFO refused unless the user named it, then written in place), outputs naming
// one file, and the clean-up of a killed write's temporaries.
#include "core/error.hpp"
#include "core/files.hpp"
#include "../support/scratch.hpp"

#include <gmock/gmock.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path dir() { return pf_test::scratch_dir("test_files"); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const pf::UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Files, TheRuleForEachKindOfPath) {
  const fs::path file = dir() / "rule-file", link = dir() / "rule-link", dangling = dir() / "rule-dangling";
  std::ofstream(file) << "x";
  fs::create_symlink(file, link);
  fs::create_symlink(dir() / "nothing", dangling);
  EXPECT_EQ(pf::check_output({file.string()}), pf::OutputMode::replace);
  EXPECT_EQ(pf::check_output({(dir() / "absent").string()}), pf::OutputMode::replace);
  EXPECT_EQ(pf::check_output({link.string(), "--save", true}), pf::OutputMode::in_place);
  EXPECT_THAT(error_of([&] { pf::check_output({link.string(), "train.out_dir"}); }),
              HasSubstr("train.out_dir: '" + link.string() + "' is a symbolic link, not a regular file"));
  EXPECT_THAT(error_of([&] { pf::check_output({dir().string(), "--save", true}); }),
              HasSubstr("--save: '" + dir().string() + "' is a directory"));
  EXPECT_THAT(error_of([&] { pf::check_output({dangling.string(), "--save", true}); }),
              HasSubstr("is a symbolic link to nothing"));
  // Written through the link the user named: the link stays, what it names holds the text.
  pf::write_output({link.string(), "--save", true}, "through");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(file), "through");
}

TEST(Files, ADeviceIsWrittenInPlaceAndAFailedWriteLeavesNothing) {
  const fs::path null = dir() / "null", full = dir() / "full";
  if (::mknod(null.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0 ||
      ::mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0)
    GTEST_SKIP() << "cannot make a device node here";
  pf::write_output({null.string(), "--svg", true}, "discarded");
  struct stat st {};
  ASSERT_EQ(::lstat(null.c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node was replaced";
  EXPECT_THAT(error_of([&] { pf::write_output({full.string(), "--save", true}, "x"); }),
              HasSubstr("--save: cannot write '" + full.string() + "': No space left on device"));
  EXPECT_THAT(error_of([&] { pf::write_output({null.string()}, "x"); }), HasSubstr("is a character device"));
  // A temporary that cannot be created: an error naming it, nothing left behind.
  EXPECT_THAT(error_of([&] { pf::write_file_atomic((dir() / "no" / "x").string(), "x"); }), HasSubstr("cannot create"));
  for (const auto& e : fs::directory_iterator(dir())) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
}

TEST(Files, OutputsNamingOneFileAreFound) {
  const fs::path a = dir() / "shared-a", hard = dir() / "shared-hard";
  std::ofstream(a) << "x";
  fs::create_hard_link(a, hard);
  EXPECT_THAT(error_of([&] { pf::refuse_shared_files({{a.string(), "--save"}, {hard.string(), "--log-json"}}); }),
              HasSubstr("--log-json: '" + hard.string() + "' is also --save"));
  const std::string fresh = (dir() / "new").string(), dotted = (dir() / "." / "new").string();
  EXPECT_THAT(error_of([&] { pf::refuse_shared_files({{fresh, "--out"}}, {{dotted, "--in"}}); }),
              HasSubstr("--out: '" + fresh + "' is also --in, which is read"));
  EXPECT_EQ(error_of([&] { pf::refuse_shared_files({{"/dev/null", "--save"}, {"/dev/null", "--log-json"}, {"", "x"}}); }),
            "(no UsageError)");
}

TEST(Files, OnlyTheTemporariesOfNamedOutputsAreRemoved) {
  const fs::path d = dir() / "stale";
  fs::create_directories(d / "log.jsonl.tmp.3");
  for (const char* n : {"log.jsonl.tmp.12", "log.jsonl.tmp.", "log.jsonl.tmp.1x", "other.tmp.4", "log.jsonl"})
    std::ofstream(d / n) << "x";
  fs::create_symlink(d / "log.jsonl", d / "log.jsonl.tmp.5");
  pf::remove_stale_temporaries(d.string(), {"log.jsonl", "summary.json"});
  EXPECT_FALSE(fs::exists(d / "log.jsonl.tmp.12"));
  for (const char* n :
       {"log.jsonl.tmp.", "log.jsonl.tmp.1x", "other.tmp.4", "log.jsonl", "log.jsonl.tmp.3", "log.jsonl.tmp.5"})
    EXPECT_TRUE(fs::exists(fs::symlink_status(d / n))) << n;
}

}  // namespace
