#pragma once
// Set-up and copy helpers the model's blocks share (blocks.cpp: embedding and head;
// transformer_block.cpp). Internal to src/nn.
#include "config/config.hpp"
#include "core/error.hpp"
#include "core/kernel_clock.hpp"
#include "core/kernels.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "nn/block.hpp"
#include "nn/layers.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace pf::block_helpers {

// Grows a shared temporary at set-up time (never during forward/backward).
inline void reserve(Tensor& t, int64_t n) {
  if (t.capacity() < n) t = Tensor(Shape{n});
}

inline void copy(float* dst, const float* src, int64_t n) {
  KernelScope clock(Kernel::elementwise, 8.0 * n);
#pragma omp parallel for schedule(dynamic, kPieceElements / 4096) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i += 4096) std::memcpy(dst + i, src + i, std::min<int64_t>(4096, n - i) * sizeof(float));
}

// The gradient a residual branch with dropout sees: d itself without dropout, else Drop'(d),
// written to dst (a Linear's output gradient, kept for its W).
inline void dropout_grad(float* dst, const float* d, const std::vector<uint8_t>& keep, int64_t n, float p) {
  copy(dst, d, n);
  if (p > 0) dropout_backward(dst, keep.data(), n, p);
}

inline void init_layernorm(LayerNorm& ln) {
  ln.weight.value.fill(1.0f);
  ln.bias.value.zero();
}

// Checks that a caller's activation tensor can hold n floats (no allocation on the way).
inline void check_holds(const Tensor& t, int64_t n, const char* what) {
  PF_CHECK(t.numel() >= n, "{} holds {} floats, needs {}", what, t.numel(), n);
}

// A state's output gradients (nn/block.hpp): its own with a split backward, else the block's one
// shared set, grown to fit. G::fit(dims...) sizes G's tensors.
template <class G, class... Dims>
std::shared_ptr<G> output_grads(BackwardMode mode, std::shared_ptr<G>& shared, Dims... dims) {
  if (mode == BackwardMode::split) {
    auto g = std::make_shared<G>();
    g->fit(dims...);
    return g;
  }
  if (!shared) shared = std::make_shared<G>();
  shared->fit(dims...);
  return shared;
}

// I hands its output gradients to W (begin_weight_grads at I, end at W): a W must follow its own
// state's I with no other I of a state sharing the set in between.
template <class G>
G& begin_weight_grads(BlockState& st) {
  st.grads->pending = &st;
  return static_cast<G&>(*st.grads);
}
template <class G>
G& end_weight_grads(BlockState& st, const std::string& block) {
  PF_CHECK(st.grads->pending == &st, "{}: W without its own I just before it (a split backward needs a state made "
           "with BackwardMode::split)", block);
  st.grads->pending = nullptr;
  return static_cast<G&>(*st.grads);
}

}  // namespace pf::block_helpers
