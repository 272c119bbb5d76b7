#pragma once
// The two GELU forms: erf (BERT) and tanh (GPT-2). The kernels compute them (core/kernels.hpp);
// model.gelu names them (config/enums.hpp).

namespace pf {

enum class Gelu { Erf, Tanh };

}  // namespace pf
