#include "optim/chunked.hpp"
#include "optim/optimizer.hpp"

#include <cmath>

namespace pf {

using namespace optim_detail;

void NvLamb::update(Slot& slot, double lr, int64_t t, float grad_scale) {
  Param& p = *slot.param;
  float* w = p.value.data();
  const float* g = p.grad.data();
  float* m = slot.state[0].data();
  float* v = slot.state[1].data();
  const int64_t n = p.value.numel();
  // 1 - beta in double: 1.0f - 0.999f is 1.3e-5 away from 0.001.
  const float b1 = static_cast<float>(beta1_), c1 = static_cast<float>(1.0 - beta1_);
  const float b2 = static_cast<float>(beta2_), c2 = static_cast<float>(1.0 - beta2_);
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(beta1_, static_cast<double>(t))));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(beta2_, static_cast<double>(t))));
  const float eps = static_cast<float>(eps_);
  const float wd = p.decay ? static_cast<float>(weight_decay_) : 0.0f;
  // The update direction; recomputed in the second pass from the same values (same bits) rather
  // than stored, so the optimizer needs no scratch tensor.
  auto direction = [&](int64_t i) { return (m[i] * inv_bc1) / (std::sqrt(v[i] * inv_bc2) + eps) + wd * w[i]; };

  // Pass 1: moments, and the norms of the weights and of the update.
  auto norms = chunked_sums<2>(n, slot.partial, [&](int64_t b, int64_t e, auto& s) {
    Lanes pp, uu;
    for (int64_t i = b; i < e; ++i) {
      float gi = g[i] * grad_scale;
      m[i] = b1 * m[i] + c1 * gi;
      v[i] = b2 * v[i] + c2 * gi * gi;
      float u = direction(i);
      pp.add(i, static_cast<double>(w[i]) * w[i]);
      uu.add(i, static_cast<double>(u) * u);
    }
    s[0] = pp.total();
    s[1] = uu.total();
  });
  // Pass 2: the layer-wise trust ratio scales the step.
  const double p_norm = std::sqrt(norms[0]), u_norm = std::sqrt(norms[1]);
  const double ratio = p_norm > 0 && u_norm > 0 ? p_norm / u_norm : 1.0;
  const float step = static_cast<float>(lr * ratio);
  for_chunks(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) w[i] -= step * direction(i);
  });
}

}  // namespace pf
