// The executor's step, action by action: each action stamped, and with kfac.placement = adaptive
// the filler's floating units (runtime/bubble_filler.hpp) run inside the waits they fit (a
// receive's, a gradient all-reduce's) or at their deadlines.
#include "comm/clock.hpp"
#include "runtime/executor.hpp"
#include "runtime/executor_chunk.hpp"

namespace pf {

int64_t Executor::run_timed(const StepRun& r, size_t i) {
  const Action& a = r.list[i];
  const bool kf = kfac_ && is_kfac(a.kind);
  const bool noisy = noise_.on();
  const bool stamp = r.times || kf || noisy || r.filler;
  const bool taps = r.times && kfac_ && is_pass(a.kind);
  const int64_t taps0 = taps ? kfac_->tap_ns() : 0;
  const int64_t t0 = stamp ? comm::steady_now_ns() : 0;
  finish_ns_ = 0;
  run_action(a, r.in);
  int64_t t1 = stamp ? comm::steady_now_ns() : 0;
  if (noisy && is_compute(a.kind)) t1 = with_noise(r.step, i, t1 - t0 - finish_ns_, t1);
  if (r.times) (*r.times)[i] = {.start = t0, .end = t1, .wait = finish_ns_, .taps = taps ? kfac_->tap_ns() - taps0 : 0};
  if (kf) kfac_ns_ += t1 - t0;
  return t1 - t0;
}

// Units whose window closes at action i, in the queue's order: the place the step still offers.
void Executor::run_floating(const StepRun& r, size_t i) {
  while (const std::optional<size_t> u = r.filler->next_due(i)) r.filler->ran(*u, run_timed(r, *u), false);
}

// Has what action i waits for come: a RECV's message, an ALLREDUCE's every bucket?
bool Executor::arrived(const Action& a) {
  if (a.kind != Kind::ALLREDUCE) return p2p_->test(receive_ticket(a));
  Chunk& c = chunk(a.pipeline, a.stage);
  return !c.grad_sync || c.synced || c.grad_sync->test();
}

// Arrival is tested between units, so the wait ends when the data comes; what the filler learns
// is when it came (bubble_filler.hpp: exact when waited for, else a lower bound).
void Executor::fill_wait(const StepRun& r, size_t i) {
  BubbleFiller& f = *r.filler;
  const int64_t start = comm::steady_now_ns();
  int64_t not_yet = 0;  // ns into the wait at the last test that found nothing
  bool filled = false, came = false, fits = true;  // fits: the last unit was predicted to end in time
  for (;;) {
    const int64_t now = comm::steady_now_ns();
    if ((came = arrived(r.list[i]))) break;
    not_yet = now - start;
    const std::optional<WaitPick> pick = f.next_for_wait(i, not_yet);
    if (!pick) break;
    f.ran(pick->unit, run_timed(r, pick->unit), true);
    if (r.times) (*r.times)[pick->unit].in_wait_of = static_cast<int64_t>(i);
    filled = true;
    fits = pick->fits;
  }
  if (came && r.list[i].kind != Kind::ALLREDUCE) {  // the test completed the receive
    const int64_t now = comm::steady_now_ns();
    if (r.times) (*r.times)[i] = {now, now, 0};
  } else {
    run_timed(r, i);  // the receive's wait, or the all-reduce's (at least its unpacking)
  }
  f.waited(i, came ? not_yet : comm::steady_now_ns() - start, filled, came && filled && !fits);
}

}  // namespace pf
