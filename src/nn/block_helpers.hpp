#pragma once
// Set-up and copy helpers the model's blocks share (blocks.cpp: embedding and head;
// transformer_block.cpp). Internal to src/nn.
#include "config/config.hpp"
#include "core/error.hpp"
#include "core/kernels.hpp"
#include "core/parallel.hpp"
#include "core/tensor.hpp"
#include "nn/layers.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace pf::block_helpers {

// Grows a shared temporary at set-up time (never during forward/backward).
inline void reserve(Tensor& t, int64_t n) {
  if (t.capacity() < n) t = Tensor(Shape{n});
}

inline void copy(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(dynamic, kPieceElements / 4096) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i += 4096) std::memcpy(dst + i, src + i, std::min<int64_t>(4096, n - i) * sizeof(float));
}

inline void init_layernorm(LayerNorm& ln) {
  ln.weight.value.fill(1.0f);
  ln.bias.value.zero();
}

// Checks that a caller's activation tensor can hold n floats (no allocation on the way).
inline void check_holds(const Tensor& t, int64_t n, const char* what) {
  PF_CHECK(t.numel() >= n, "{} holds {} floats, needs {}", what, t.numel(), n);
}

}  // namespace pf::block_helpers
