// The paper's profile CSV (sim/profile.hpp), then the profile made from each row.
#include "fuzz_common.hpp"
#include "sim/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pf_fuzz::write_input(data, size, ".csv");
  pf_fuzz::refuse_or_accept([&] {
    for (const pf::ProfileRow& row : pf::read_paper_csv(path)) (void)pf::profile_from_row(row, 2);
  });
  return 0;
}
