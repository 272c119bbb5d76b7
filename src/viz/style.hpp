#pragma once
// One colour and label per action kind, shared by every rendering (SVG, terminal, trace), so
// forward/backward and the K-FAC and communication kinds later issues add look the same
// everywhere. Colours: a Tableau-like palette, K-FAC kinds in warm hues as in the paper's figures.
#include "schedule/action.hpp"

#include <string>
#include <string_view>

namespace pf {

struct KindStyle {
  std::string_view color;  // SVG fill
  std::string_view label;  // legend text
  char glyph;              // terminal letter
};

const KindStyle& kind_style(Kind k);
// Text colour on a "#rrggbb" fill: dark on light fills, white on dark ones (the higher contrast).
std::string_view ink_on(std::string_view fill);

// Axis ticks at 1, 2 or 5 times a power of ten, about `target` of them over `range` (e.g. range
// 37, target 10: 5). 0 when the range is empty or not finite (no ticks).
double nice_tick(double range, int target);
// A tick's value printed with no more decimals than the tick spacing needs (0.30000000000000004
// with spacing 0.1 prints "0.3").
std::string tick_text(double value, double tick);

}  // namespace pf
