// Schedule files (schedule/schedule.hpp): the first input byte picks text or CSV; a parsed
// schedule is validated and printed back.
#include "fuzz_common.hpp"
#include "schedule/schedule.hpp"
#include "schedule/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(pf_fuzz::as_text(data + 1, size - 1));
  pf_fuzz::refuse_or_accept([&] {
    pf::Schedule s = data[0] & 1 ? pf::parse_csv(text, "fuzz.csv") : pf::parse_text(text, "fuzz.txt");
    (void)pf::to_text(s);
    (void)pf::to_csv(s);
    pf::validate(s);
  });
  return 0;
}
