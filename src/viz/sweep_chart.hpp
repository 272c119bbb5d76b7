#pragma once
// The sweep chart (like the paper's Figure 6): two panels over micro-batch size, PipeFisher
// throughput (sequences/s) and the (curvature+inversion)-bubble ratio, one line per D
// (colour) and N = D, 2D, 3D (solid, dashed, dotted).
#include "sim/sweep.hpp"

#include <string>

namespace pf {

std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title);

}  // namespace pf
