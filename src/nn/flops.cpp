#include "nn/flops.hpp"

namespace pf {

double block_forward_macs_per_token(const ModelConfig& m) {
  const double h = m.hidden, f = m.ffn, s = m.seq_len;
  if (m.arch == Arch::Llama) return 2 * h * h + 2 * h * kv_width(m) + 3 * h * f + 2 * s * h;
  return 4 * h * h + 2 * h * f + 2 * s * h;
}

double forward_macs_per_token(const ModelConfig& m, double labelled) {
  const double h = m.hidden, s = m.seq_len, v = m.vocab;
  const double block = block_forward_macs_per_token(m);
  double head = h * v;
  if (m.arch == Arch::Bert) head = labelled * (h * h + h * v) / s + (m.nsp ? (h * h + 2 * h) / s : 0.0);
  return m.layers * block + head;
}

double model_flops_per_token(const ModelConfig& m, double labelled) { return 6 * forward_macs_per_token(m, labelled); }

}  // namespace pf
