#include "optim/chunked.hpp"
#include "optim/moments.hpp"
#include "optim/optimizer.hpp"

#include <cmath>

namespace pf {

using namespace optim_detail;

namespace {

// Constants of one NVLAMB step of one tensor, passed by value so the loops keep them in registers.
struct LambStep {
  float b1, c1, b2, c2;   // beta and 1 - beta (computed in double)
  float inv_bc1, inv_bc2; // bias corrections 1 / (1 - beta^t)
  float eps, wd, grad_scale;
};

// The update direction u = m_hat / (sqrt(v_hat) + eps) + wd * p. Pass 2 recomputes it from the
// same values (same bits) instead of storing it, so the optimizer needs no scratch tensor.
inline float direction(const LambStep& k, float m, float v, float w) {
  return (m * k.inv_bc1) / (std::sqrt(v * k.inv_bc2) + k.eps) + k.wd * w;
}

// Pass 1 over [b, e): moments, and the squared norms of the weights and of the update.
void moments(LambStep k, int64_t b, int64_t e, const float* __restrict w, const float* __restrict g,
             float* __restrict m, float* __restrict v, std::array<double, 2>& sums) {
  Lanes pp, uu;
  for_lanes(b, e, [&](int64_t i, int lane) {
    float gi = g[i] * k.grad_scale;
    m[i] = k.b1 * m[i] + k.c1 * gi;
    v[i] = k.b2 * v[i] + k.c2 * gi * gi;
    float u = direction(k, m[i], v[i], w[i]);
    pp.v[lane] += static_cast<double>(w[i]) * w[i];
    uu.v[lane] += static_cast<double>(u) * u;
  });
  sums = {pp.total(), uu.total()};
}

// Pass 2 over [b, e): p -= lr * ratio * u.
void apply(LambStep k, float step, int64_t b, int64_t e, float* __restrict w, const float* __restrict m,
           const float* __restrict v) {
  for (int64_t i = b; i < e; ++i) w[i] -= step * direction(k, m[i], v[i], w[i]);
}

}  // namespace

void NvLamb::update(Slot& slot, double lr, int64_t t, float grad_scale) {
  const Param& p = *slot.param;
  const MomentTensors x = moment_tensors(*slot.param, slot.state);
  const Betas beta = moment_betas(beta1_, beta2_);
  const LambStep k{beta.b1,
                   beta.c1,
                   beta.b2,
                   beta.c2,
                   static_cast<float>(1.0 / (1.0 - std::pow(beta1_, static_cast<double>(t)))),
                   static_cast<float>(1.0 / (1.0 - std::pow(beta2_, static_cast<double>(t)))),
                   static_cast<float>(eps_),
                   p.decay ? static_cast<float>(weight_decay_) : 0.0f,
                   grad_scale};

  auto norms = chunked_sums<2>(x.n, slot.partial,
                               [&](int64_t b, int64_t e, auto& s) { moments(k, b, e, x.w, x.g, x.m, x.v, s); });
  // The layer-wise trust ratio ||p|| / ||u|| scales the step (1 if either norm is 0).
  const double p_norm = std::sqrt(norms[0]), u_norm = std::sqrt(norms[1]);
  const double ratio = p_norm > 0 && u_norm > 0 ? p_norm / u_norm : 1.0;
  const float step = static_cast<float>(lr * ratio);
  for_chunks(x.n, [&](int64_t b, int64_t e) { apply(k, step, b, e, x.w, x.m, x.v); });
}

}  // namespace pf
