#pragma once
// A test program's scratch directory for `name`: /tmp/pf_tests_<pid>/<name>, made on first use;
// the program's whole /tmp/pf_tests_<pid> is removed when its tests end, unless one failed (then
// its path is printed, for a look at what the failing run wrote). Each name has its own folder, so
// suites run in one process (a --gtest_filter over several) do not read each other's files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>

namespace pf_test {

struct RemoveScratchAtEnd : ::testing::Environment {
  std::filesystem::path dir;
  void TearDown() override {
    if (::testing::UnitTest::GetInstance()->Failed()) {
      std::printf("scratch directory kept: %s\n", dir.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

inline std::filesystem::path scratch_dir(const std::string& name) {
  static const std::filesystem::path root = [] {
    auto p = std::filesystem::temp_directory_path() / ("pf_tests_" + std::to_string(::getpid()));
    auto* env = new RemoveScratchAtEnd;  // gtest owns it
    env->dir = p;
    ::testing::AddGlobalTestEnvironment(env);
    return p;
  }();
  const std::filesystem::path d = root / name;
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace pf_test
