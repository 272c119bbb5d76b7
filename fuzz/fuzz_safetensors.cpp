// safetensors files: open (every header check), then read every floating-point tensor.
#include "fuzz_common.hpp"
#include "io/safetensors.hpp"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pf_fuzz::write_input(data, size, ".safetensors");
  pf_fuzz::refuse_or_accept([&] {
    pf::SafetensorsReader r(path);
    for (const pf::SafetensorsEntry& e : r.tensors()) {
      if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64") continue;
      if (pf::shape_numel(e.shape) > (1 << 22)) continue;  // accepted, but too big to copy per input
      std::vector<float> out(static_cast<size_t>(pf::shape_numel(e.shape)));
      r.read_f32(e, out);
    }
  });
  return 0;
}
