// The refresh record a PipeFisher run leaves and a replay follows (kfac/refresh_record.hpp): read,
// then extended over a run twice its length, as kfac.placement = replay does.
#include "fuzz_common.hpp"
#include "kfac/refresh_record.hpp"

#include <algorithm>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = pf_fuzz::write_input(data, size, ".json");
  pf_fuzz::refuse_or_accept([&] {
    const pf::RefreshRecord rec = pf::read_refresh_record(path, "kfac.refresh_record");
    // Past the record's end (bounded: train.steps bounds it in a run).
    const pf::RefreshPattern pattern(rec, std::min<int64_t>(2 * rec.steps + 1, 4096), "kfac.refresh_record");
    for (int64_t s = 0; s < pattern.steps(); ++s) (void)pattern.events_at(s), (void)pattern.splits_at(s);
  });
  return 0;
}
