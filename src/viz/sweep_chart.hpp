#pragma once
// The sweep chart (like the paper's Figure 6): two panels, PipeFisher throughput (sequences/s)
// and the (curvature+inversion)-bubble ratio. Over micro-batch size when the rows have several,
// one line per D (colour) and N = D, 2D, 3D (solid, dashed, dotted); over the depth D when they
// have one micro-batch size (durations from flags), one line per N = D, 2D, 3D. Y ticks at 1, 2,
// 5 x 10^k; a panel whose values are all 0 says so instead of drawing a line on its axis.
#include "sim/sweep.hpp"

#include <string>

namespace pf {

std::string sweep_svg(const std::vector<SweepRow>& rows, const std::string& title);

}  // namespace pf
