// Configuration TOML: parse, apply overrides, validate, print.
#include "config/config.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pf_fuzz::refuse_or_accept([&] {
    pf::Config c = pf::Config::from_toml_string(std::string(pf_fuzz::as_text(data, size)));
    c.validate();
    (void)c.to_toml();
  });
  return 0;
}
