#include "optim/chunked.hpp"
#include "optim/optimizer.hpp"

namespace pf {

namespace {

// Over [b, e): buf = mu * buf + (g + wd * p); p -= lr * buf. On the first step buf is 0, so
// buf = g + wd * p exactly, as PyTorch initialises it.
void sgd_range(int64_t b, int64_t e, float* __restrict w, const float* __restrict g, float* __restrict buf,
               float mu, float wd, float step, float grad_scale) {
  for (int64_t i = b; i < e; ++i) {
    buf[i] = mu * buf[i] + (g[i] * grad_scale + wd * w[i]);
    w[i] -= step * buf[i];
  }
}

}  // namespace

void Sgd::update(Slot& slot, double lr, int64_t t, float grad_scale) {
  Param& p = *slot.param;
  float* w = p.value.data();
  const float* g = p.grad.data();
  float* buf = slot.state[0].data();
  const float mu = static_cast<float>(momentum_);
  const float wd = p.decay ? static_cast<float>(weight_decay_) : 0.0f;
  const float step = static_cast<float>(lr);
  optim_detail::for_chunks(p.value.numel(),
                           [&](int64_t b, int64_t e) { sgd_range(b, e, w, g, buf, mu, wd, step, grad_scale); });
}

}  // namespace pf
