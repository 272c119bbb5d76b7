#pragma once
// Runs the built `pipefisher plan` (PF_BINARY) for the CLI tests: exit status, stdout, stderr.
#include "../support/scratch.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <sys/wait.h>

namespace pf::test {

struct PlanRun {
  int status = -1;
  std::string out, err;
};

inline std::string tmp(const std::string& name) {
  return (pf_test::scratch_dir("test_plan") / name).string();
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

inline PlanRun plan(const std::string& args) {
  const std::string err = tmp("stderr.txt");
  std::string cmd = std::string(PF_BINARY) + " plan " + args + " 2>" + err;
  PlanRun r;
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err);
  return r;
}

inline void expect_usage(const std::string& args, const std::string& reason) {
  PlanRun r = plan(args);
  EXPECT_EQ(r.status, 2) << args;
  EXPECT_EQ(r.err.find(reason), 0u) << args << "\n" << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line expected:\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace pf::test
