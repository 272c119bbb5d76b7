// The main() of every test program: the BLAS fitted to the machine first, as every pipefisher
// process does (core/machine.hpp), so a reference computed in the test process runs the same
// kernels as the `pipefisher` runs it launches. A forced OPENBLAS_CORETYPE (scripts/test-kernels.sh)
// is kept, and reaches those runs through the environment, as does the cache directory of their
// machine measurements (the build tree's, unless PF_CACHE_DIR is set).
#include "core/machine.hpp"

#include <gtest/gtest.h>

#include <cstdlib>

int main(int argc, char** argv) {
  pf::fit_process_to_machine(argv);
  setenv("PF_CACHE_DIR", PF_TEST_CACHE_DIR, /*overwrite=*/0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
