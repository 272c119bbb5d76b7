#pragma once
// What the Adam-style optimizers (AdamW, NVLAMB) share: a slot's tensors and the moment
// constants.
#include "optim/optimizer.hpp"

#include <cstdint>
#include <vector>

namespace pf::optim_detail {

// Weights, gradient, first and second moments (state "exp_avg", "exp_avg_sq") of one parameter.
struct MomentTensors {
  float* w;
  const float* g;
  float* m;
  float* v;
  int64_t n;  // elements
};

// `state`: the slot's state tensors, "exp_avg" then "exp_avg_sq".
inline MomentTensors moment_tensors(Param& p, std::vector<Tensor>& state) {
  return {p.value.data(), p.grad.data(), state[0].data(), state[1].data(), p.value.numel()};
}

// beta and 1 - beta of both moments, each as float. 1 - beta in double: 1.0f - 0.999f is 1.3e-5
// (relative) away from 0.001.
struct Betas {
  float b1, c1, b2, c2;
};

inline Betas moment_betas(double beta1, double beta2) {
  return {static_cast<float>(beta1), static_cast<float>(1.0 - beta1), static_cast<float>(beta2),
          static_cast<float>(1.0 - beta2)};
}

}  // namespace pf::optim_detail
