// The executor's step, action by action: each action stamped, and with kfac.placement = adaptive
// the filler's floating units (runtime/bubble_filler.hpp) run inside the waits they fit or at
// their deadlines.
#include "comm/clock.hpp"
#include "runtime/executor.hpp"

namespace pf {

int64_t Executor::run_timed(const StepRun& r, size_t i) {
  const Action& a = r.list[i];
  const bool kf = kfac_ && is_kfac(a.kind);
  const bool noisy = noise_.on();
  const bool stamp = r.times || kf || noisy || r.filler;
  const int64_t t0 = stamp ? comm::steady_now_ns() : 0;
  finish_ns_ = 0;
  run_action(a, r.in);
  int64_t t1 = stamp ? comm::steady_now_ns() : 0;
  if (noisy && is_compute(a.kind)) t1 = with_noise(r.step, i, t1 - t0 - finish_ns_, t1);
  if (r.times) (*r.times)[i] = {t0, t1, finish_ns_};
  if (kf) kfac_ns_ += t1 - t0;
  return t1 - t0;
}

// Units whose window closes here, in the queue's order: the place the step still offers.
void Executor::run_floating(const StepRun& r, size_t count) {
  while (r.filler->done() < count) r.filler->ran(run_timed(r, r.filler->head()), false);
}

// The message is tested between units, so the wait ends when it arrives; what the filler learns
// is when it came (bubble_filler.hpp: exact when waited for, else a lower bound).
void Executor::fill_wait(const StepRun& r, size_t i) {
  BubbleFiller& f = *r.filler;
  const comm::Ticket ticket = receive_ticket(r.list[i]);
  const int64_t start = comm::steady_now_ns();
  int64_t not_yet = 0;  // ns into the wait at the last test that found no message
  bool filled = false;
  for (;;) {
    const int64_t now = comm::steady_now_ns();
    if (p2p_->test(ticket)) {
      f.waited(i, not_yet, filled);
      if (r.times) (*r.times)[i] = {now, now, 0};
      return;
    }
    not_yet = now - start;
    const std::optional<size_t> unit = f.next_for_wait(i, not_yet);
    if (!unit) break;
    f.ran(run_timed(r, *unit), true);
    if (r.times) (*r.times)[*unit].in_wait_of = static_cast<int64_t>(i);
    filled = true;
  }
  const int64_t t0 = comm::steady_now_ns();
  p2p_->wait(ticket);
  const int64_t t1 = comm::steady_now_ns();
  f.waited(i, t1 - start, filled);
  if (r.times) (*r.times)[i] = {t0, t1, 0};
}

}  // namespace pf
