#pragma once
// The names of a transformer block's Linear layers as the model (and Hugging Face) calls them,
// in K-FAC layer order, without ".weight": e.g. block 3 of BERT gives
// bert.encoder.layer.3.attention.self.query ... bert.encoder.layer.3.output.dense, of GPT-2
// transformer.h.3.attn.c_attn ... transformer.h.3.mlp.c_proj. TransformerBlock names its
// weights from these; `plan` names planned K-FAC units by them.
#include "config/enums.hpp"

#include <string>
#include <vector>

namespace pf {

std::vector<std::string> block_linear_names(Arch arch, int layer);

}  // namespace pf
