#pragma once
// One colour and label per action kind, shared by every rendering (SVG, terminal, trace), so
// forward/backward and the K-FAC and communication kinds later issues add look the same
// everywhere. Colours: a Tableau-like palette, K-FAC kinds in warm hues as in the paper's figures.
#include "schedule/action.hpp"

#include <string_view>

namespace pf {

struct KindStyle {
  std::string_view color;  // SVG fill
  std::string_view label;  // legend text
  char glyph;              // terminal letter
};

const KindStyle& kind_style(Kind k);

}  // namespace pf
