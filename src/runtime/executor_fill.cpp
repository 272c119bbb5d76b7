// The executor's step, action by action, as its driver asks (runtime/step_driver.hpp): each
// action stamped; a wait's data tested for (adaptive fills the wait while it has not come).
#include "comm/clock.hpp"
#include "runtime/executor.hpp"

namespace pf {

int64_t Executor::run_timed(const StepRun& r, size_t i) {
  const Action& a = r.list[i];
  const bool kf = kfac_ && is_kfac(a.kind);
  const bool noisy = noise_.on();
  const bool stamp = r.times || kf || noisy || r.stamp_all;
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

int64_t Executor::StepRun::run(size_t i) { return e.run_timed(*this, i); }

// Has what action i waits for come: a RECV's message, an ALLREDUCE's every bucket?
bool Executor::StepRun::arrived(size_t i) {
  const Action& a = list[i];
  if (a.kind != Kind::ALLREDUCE) return e.p2p_->test(e.receive_ticket(a));
  HostedChunk& c = e.chunks_.at(a.pipeline, a.stage);
  return !c.grad_sync || c.synced || c.grad_sync->test();
}

void Executor::StepRun::received(size_t i) {
  const int64_t now = comm::steady_now_ns();
  if (times) (*times)[i] = {now, now, 0};
}

void Executor::StepRun::ran_in_wait(size_t u, size_t i) {
  if (times) (*times)[u].in_wait_of = static_cast<int64_t>(i);
}

}  // namespace pf
