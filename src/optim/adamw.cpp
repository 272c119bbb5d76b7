#include "optim/chunked.hpp"
#include "optim/moments.hpp"
#include "optim/optimizer.hpp"

#include <cmath>

namespace pf {

namespace {

// Over [b, e): decoupled decay first, then the Adam step (PyTorch's order). Constants by value.
void adamw_range(int64_t b, int64_t e, float* __restrict w, const float* __restrict g, float* __restrict m,
                 float* __restrict v, float b1, float c1, float b2, float c2, float shrink, float step,
                 float inv_sqrt_bc2, float eps, float grad_scale) {
  for (int64_t i = b; i < e; ++i) {
    float gi = g[i] * grad_scale;
    m[i] = b1 * m[i] + c1 * gi;
    v[i] = b2 * v[i] + c2 * gi * gi;
    w[i] = w[i] * shrink - step * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace

void AdamW::update(Slot& slot, double lr, int64_t t, float grad_scale) {
  const Param& p = *slot.param;
  const optim_detail::MomentTensors x = optim_detail::moment_tensors(*slot.param, slot.state);
  const optim_detail::Betas k = optim_detail::moment_betas(beta1_, beta2_);
  const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(t));
  const float shrink = p.decay ? static_cast<float>(1.0 - lr * weight_decay_) : 1.0f;
  const float step = static_cast<float>(lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float eps = static_cast<float>(eps_);
  optim_detail::for_chunks(x.n, [&](int64_t b, int64_t e) {
    adamw_range(b, e, x.w, x.g, x.m, x.v, k.b1, k.c1, k.b2, k.c2, shrink, step, inv_sqrt_bc2, eps, grad_scale);
  });
}

}  // namespace pf
