// Token files (data/token_file.hpp): the first two bytes give the vocabulary size.
#include "data/token_file.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int vocab = data[0] | data[1] << 8;
  const std::string path = pf_fuzz::write_input(data + 2, size - 2, ".bin");
  pf_fuzz::refuse_or_accept([&] {
    for (uint16_t id : pf::read_token_file(path, vocab))
      if (id >= vocab) __builtin_trap();
  });
  return 0;
}
