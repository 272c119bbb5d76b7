#pragma once
// A trainable tensor with its gradient and the facts the optimizer and the file formats need.
#include "core/tensor.hpp"

#include <string>

namespace pf {

struct Param {
  std::string name;            // Hugging Face tensor name, e.g. "bert.encoder.layer.0.output.dense.weight"
  Tensor value;
  Tensor grad;                 // same shape as value; backward accumulates (+=)
  bool decay = true;           // weight decay applies (false for biases and LayerNorm)
  bool hf_transposed = false;  // stored transposed in HF files (GPT-2's Conv1D weights are [in, out])
  // A mirror is a copy of a parameter owned by another block on another stage (the tied word
  // embedding seen by the LM head when the embedding lives on the first stage). Mirrors are kept
  // equal to their owner by the runtime; they are left out of global norms and of saved files.
  bool mirror = false;
  // A Linear layer's own weight [out, in] (optim.name = soap rotates these; the tied word
  // embedding, used by the LM head as a Linear, stays an embedding).
  bool linear = false;

  Param() = default;
  Param(std::string n, Shape s, bool decay_ = true)
      : name(std::move(n)), value(s), grad(s), decay(decay_) {}
};

}  // namespace pf
