// The step drivers (step_driver.hpp): the list in order, or adaptive's units filling the waits.
#include "runtime/step_driver.hpp"

#include "comm/clock.hpp"
#include "comm/small.hpp"

#include <cstdio>
#include <optional>

namespace pf {

void InOrder::run(const std::vector<Action>& list, StepActions& step) {
  for (size_t i = 0; i < list.size(); ++i) step.run(i);
}

void FillingWaits::run(const std::vector<Action>& list, StepActions& step) {
  filler_.begin(list);
  for (size_t i = 0; i < list.size(); ++i) {
    if (filler_.floats(i)) continue;  // queued: it runs in a wait or at its deadline
    run_due(step, i);
    if (BubbleFiller::is_wait(list[i].kind)) fill_wait(list, step, i);
    else step.run(i);
  }
  run_due(step, list.size());
}

// Units whose window closes at action i, in the queue's order: the place the step still offers.
void FillingWaits::run_due(StepActions& step, size_t i) {
  while (const std::optional<size_t> u = filler_.next_due(i)) filler_.ran(*u, step.run(*u), false);
}

// Arrival is tested between units, so the wait ends when the data comes; what the filler learns
// is when it came (bubble_filler.hpp: exact when waited for, else a lower bound).
void FillingWaits::fill_wait(const std::vector<Action>& list, StepActions& step, size_t i) {
  const int64_t start = comm::steady_now_ns();
  int64_t not_yet = 0;  // ns into the wait at the last test that found nothing
  bool filled = false, came = false, fits = true;  // fits: the last unit was predicted to end in time
  for (;;) {
    const int64_t now = comm::steady_now_ns();
    if ((came = step.arrived(i))) break;
    not_yet = now - start;
    const std::optional<WaitPick> pick = filler_.next_for_wait(i, not_yet);
    if (!pick) break;
    filler_.ran(pick->unit, step.run(pick->unit), true);
    step.ran_in_wait(pick->unit, i);
    filled = true;
    fits = pick->fits;
  }
  if (came && list[i].kind != Kind::ALLREDUCE) step.received(i);  // the test completed the receive
  else step.run(i);  // the receive's wait, or the all-reduce's (at least its unpacking)
  filler_.waited(i, came ? not_yet : comm::steady_now_ns() - start, filled, came && filled && !fits);
}

// Where the units ran, summed over the ranks.
void FillingWaits::print_summary(bool root) const {
  const FillerStats& st = filler_.stats();
  double sums[3] = {static_cast<double>(st.in_wait), static_cast<double>(st.at_deadline),
                    static_cast<double>(st.waits_filled)};
  comm::allreduce_sum({sums, 3}, MPI_COMM_WORLD, "the filler's counts");
  if (root)
    std::printf("pipefisher: adaptive: %.0f units ran in %.0f waits, %.0f at their deadlines (all ranks)\n", sums[0],
                sums[2], sums[1]);
  std::fflush(stdout);
}

}  // namespace pf
