// The runtime's profile JSON (sim/profile.hpp).
#include "fuzz_common.hpp"
#include "sim/profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pf_fuzz::write_input(data, size, ".json");
  pf_fuzz::refuse_or_accept([&] { (void)pf::read_profile_json(path); });
  return 0;
}
