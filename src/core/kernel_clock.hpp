#pragma once
// Where a training step's time goes, by kernel class (bench/bench_breakdown.cpp). Each kernel
// opens a KernelScope; while the clock runs, the time between scope boundaries goes to the
// innermost open scope's class (exclusive time), with the bytes the kernel must move at least and
// the flops of a product. Only the thread that started the clock records: inside an OpenMP loop
// that is thread 0, whose share of the loop stands for the loop (the others do the same work), so
// a loop's barrier wait falls outside every class. Time outside all scopes is the step's "other".
// Stopped (the default), a scope costs one relaxed atomic load.
#include <array>
#include <atomic>
#include <cstdint>

namespace pf {

enum class Kernel : uint8_t {
  block_products,      // the blocks' Linear layers (forward, input and weight gradients)
  head_products,       // the head's Linear layers (the vocabulary decoder)
  attention_products,  // Q K^T, P V and their gradients
  softmax_loss,        // the head's softmax, cross-entropy and its gradient
  embedding,           // the embedding's gather and its gradient's scatter-add
  norms,               // LayerNorm, RMSNorm
  activations,         // GELU, SwiGLU
  attention_softmax,   // the attention scores' softmax and its gradient
  elementwise,         // residual adds, dropout, copies, gathers
  zero_grads,          // zeroing the gradients before a step
  optimizer,           // the gradient norm and the optimizer's update (opaque: inner scopes fold in)
  data,                // the step's micro-batches read from the token file
  head,                // a context, not a class: products inside it are head_products
  count
};
constexpr int kKernelClasses = static_cast<int>(Kernel::count);

// A short name per class, for tables ("other" is the step minus every class).
const char* kernel_name(Kernel k);

struct KernelTally {
  std::array<double, kKernelClasses> seconds{}, bytes{}, flops{};
};

namespace kernel_clock {
namespace detail {
extern std::atomic<bool> running;
void enter(Kernel k, double bytes, double flops, bool& entered);
void leave();
void add(Kernel k, double bytes, double flops);
}  // namespace detail
// Zero the tally and start recording on the calling thread.
void start();
// Stop and return what was recorded since start().
KernelTally stop();
inline bool running() { return detail::running.load(std::memory_order_relaxed); }
// Bytes or flops of work whose time is recorded elsewhere (a parallel loop's other iterations).
inline void add(Kernel k, double bytes, double flops = 0) {
  if (running()) detail::add(k, bytes, flops);
}
}  // namespace kernel_clock

class KernelScope {
 public:
  explicit KernelScope(Kernel k, double bytes = 0, double flops = 0) {
    if (kernel_clock::running()) kernel_clock::detail::enter(k, bytes, flops, entered_);
  }
  ~KernelScope() {
    if (entered_) kernel_clock::detail::leave();
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  bool entered_ = false;
};

}  // namespace pf
