#include "optim/chunked.hpp"
#include "optim/optimizer.hpp"

namespace pf {

void Sgd::update(Slot& slot, double lr, int64_t t, float grad_scale) {
  Param& p = *slot.param;
  float* w = p.value.data();
  const float* g = p.grad.data();
  float* buf = slot.state[0].data();
  const float mu = static_cast<float>(momentum_);
  const float wd = p.decay ? static_cast<float>(weight_decay_) : 0.0f;
  const float step = static_cast<float>(lr);
  optim_detail::for_chunks(p.value.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float d = g[i] * grad_scale + wd * w[i];
      buf[i] = mu * buf[i] + d;  // on the first step buf is 0, so buf = d as in PyTorch
      w[i] -= step * buf[i];
    }
  });
}

}  // namespace pf
