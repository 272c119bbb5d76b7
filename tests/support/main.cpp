// The main() of every test program: the BLAS fitted to the machine first, as every pipefisher
// process does (core/machine.hpp), so a reference computed in the test process runs the same
// kernels as the `pipefisher` runs it launches. A forced OPENBLAS_CORETYPE (scripts/test-kernels.sh)
// is kept, and reaches those runs through the environment.
#include "core/machine.hpp"

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  pf::fit_process_to_machine(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
