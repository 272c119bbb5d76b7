#pragma once
// A test program's scratch directory: /tmp/pf_<name>_<pid>, made on first use and removed when
// the program's tests end, unless one failed (then its path is printed, for a look at what the
// failing run wrote). ctest runs each test in its own process, so runs never share one.
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
  static const std::filesystem::path d = [&] {
    auto p = std::filesystem::temp_directory_path() / ("pf_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    auto* env = new RemoveScratchAtEnd;  // gtest owns it
    env->dir = p;
    ::testing::AddGlobalTestEnvironment(env);
    return p;
  }();
  return d;
}

}  // namespace pf_test
