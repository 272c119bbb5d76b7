// Checkpoint manifests (io/checkpoint.hpp).
#include "fuzz_common.hpp"
#include "io/checkpoint.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pf_fuzz::refuse_or_accept([&] { (void)pf::parse_checkpoint_manifest(pf_fuzz::as_text(data, size), "manifest.json"); });
  return 0;
}
