#pragma once
// Model FLOPs, what MFU counts (PaLM's appendix B, Megatron's "model FLOPs"): the forward's
// matrix products at 2 flops per multiply-add, times 3 for a training step (the backward computes
// two products per forward product: the input's and the weight's gradients). Counted from the
// shapes this code runs, per token of a step:
//   each block   4 h^2 + 2 h f  (Q, K, V, output; the two FFN Linears)
//                + 2 s h         (scores Q K^T and P V; full s x s even when causal, as computed)
//   head, bert   r (h^2 + h V) / s    (transform and decoder over the r labelled positions of a
//                                      sequence only) + with NSP (h^2 + 2 h) / s (pooler, classifier)
//   head, gpt    h V            (every position is labelled)
// Embeddings, layer norms, softmax and GELU are not counted, and neither is work the model does not
// need: recomputation, the optimizer, K-FAC's curvature, inversion and precondition. Such work
// lowers MFU, which is the point of the number.
#include "config/config.hpp"

namespace pf {

// Multiply-adds of one token's forward through one transformer block.
double block_forward_macs_per_token(const ModelConfig& m);
// Multiply-adds of one token's forward; `labelled` = r, the head's positions per sequence (gpt: s).
double forward_macs_per_token(const ModelConfig& m, double labelled);
// 6 x forward_macs_per_token: one token of a training step.
double model_flops_per_token(const ModelConfig& m, double labelled);

}  // namespace pf
