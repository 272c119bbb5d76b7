#include "core/kernel_clock.hpp"

#include <chrono>

namespace pf {

namespace {
constexpr int kMaxDepth = 32;

struct ClockState {
  KernelTally tally;
  std::array<Kernel, kMaxDepth> open{};
  int depth = 0;
  int heads = 0;     // open Kernel::head scopes
  int64_t last = 0;  // ns of the last scope boundary
};
ClockState state;
thread_local bool owner = false;  // the thread that started the clock

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The time since the last boundary goes to the innermost open scope.
void charge(int64_t now) {
  if (state.depth > 0) state.tally.seconds[static_cast<int>(state.open[state.depth - 1])] += (now - state.last) * 1e-9;
  state.last = now;
}
}  // namespace

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::block_products: return "products: blocks";
    case Kernel::head_products: return "products: head";
    case Kernel::attention_products: return "products: attention";
    case Kernel::softmax_loss: return "softmax + loss";
    case Kernel::embedding: return "embedding";
    case Kernel::norms: return "norms";
    case Kernel::activations: return "GELU/SwiGLU";
    case Kernel::attention_softmax: return "attention softmax";
    case Kernel::elementwise: return "adds, dropout, copies";
    case Kernel::zero_grads: return "zero gradients";
    case Kernel::optimizer: return "optimizer";
    case Kernel::data: return "data";
    case Kernel::head: return "head (other)";
    case Kernel::count: break;
  }
  return "?";
}

namespace kernel_clock {
namespace detail {
std::atomic<bool> running{false};

void enter(Kernel k, double bytes, double flops, bool& entered) {
  if (!owner || state.depth == kMaxDepth) return;
  if (state.depth > 0 && state.open[state.depth - 1] == Kernel::optimizer) return;  // opaque
  if (k == Kernel::block_products && state.heads > 0) k = Kernel::head_products;
  charge(now_ns());
  state.open[state.depth++] = k;
  state.heads += k == Kernel::head;
  state.tally.bytes[static_cast<int>(k)] += bytes;
  state.tally.flops[static_cast<int>(k)] += flops;
  entered = true;
}

void leave() {
  if (state.depth == 0) return;  // the clock was restarted inside the scope
  if (owner) charge(now_ns());
  state.heads -= state.open[--state.depth] == Kernel::head;
}

void add(Kernel k, double bytes, double flops) {
  if (!owner) return;
  state.tally.bytes[static_cast<int>(k)] += bytes;
  state.tally.flops[static_cast<int>(k)] += flops;
}
}  // namespace detail

void start() {
  state = ClockState{};
  state.last = now_ns();
  owner = true;
  detail::running.store(true, std::memory_order_relaxed);
}

KernelTally stop() {
  detail::running.store(false, std::memory_order_relaxed);
  owner = false;
  return state.tally;
}
}  // namespace kernel_clock

}  // namespace pf
