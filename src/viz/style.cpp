#include "viz/style.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

namespace pf {

const KindStyle& kind_style(Kind k) {
  static const std::array<KindStyle, kNumKinds> table = {{
      {"#4C78A8", "forward", 'F'},             // F
      {"#59A14F", "backward", 'B'},            // B
      {"#8CD17D", "backward (input grad)", 'I'},   // I
      {"#2F6B3A", "backward (weight grad)", 'W'},  // W
      {"#3D3D3D", "send", '>'},                // SEND_F (dark: drawn in a thin lane)
      {"#9C9C9C", "recv (waiting)", '<'},      // RECV_F
      {"#3D3D3D", "send", '>'},                // SEND_B
      {"#9C9C9C", "recv (waiting)", '<'},      // RECV_B
      {"#1F3F6E", "sync-grad", 'a'},           // ALLREDUCE
      {"#BCBD22", "optimizer", 'o'},           // OPT
      {"#F28E2B", "curvature A", 'c'},         // CURV_A
      {"#EDC948", "curvature B", 'c'},         // CURV_B
      {"#9D7660", "sync-curvature", 's'},      // SYNC_CURV
      {"#E15759", "inversion A", 'i'},         // INV_A
      {"#8F1D21", "inversion B", 'i'},         // INV_B
      {"#B07AA1", "precondition", 'p'},        // PREC
      {"#76B7B2", "broadcast inverse A", 'x'}, // BCAST_INV_A
      {"#A0CBE8", "broadcast inverse B", 'x'}, // BCAST_INV_B
      {"#17BECF", "SOAP eigenbasis L", 'e'},   // EIG_L
      {"#0B6E79", "SOAP eigenbasis R", 'e'},   // EIG_R
      {"#1B9E77", "SOAP statistics", 't'},     // STAT
  }};
  return table[static_cast<int>(k)];
}

std::string_view ink_on(std::string_view fill) {
  if (fill.size() != 7 || fill[0] != '#') return "#ffffff";
  auto channel = [&](int at) {  // sRGB to linear light
    const double c = std::stoi(std::string(fill.substr(at, 2)), nullptr, 16) / 255.0;
    return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
  };
  const double luminance = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
  // Where black text contrasts more than white (WCAG: (L + 0.05) / 0.05 > 1.05 / (L + 0.05)).
  return luminance > 0.179 ? "#222222" : "#ffffff";
}

double nice_tick(double range, int target) {
  if (!(range > 0) || !std::isfinite(range) || target < 1) return 0;
  const double raw = range / target, p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * p * (1 + 1e-9)) return m * p;
  return 10 * p;
}

std::string tick_text(double value, double tick) {
  const int decimals = tick > 0 ? std::clamp(static_cast<int>(std::ceil(-std::log10(tick) - 1e-9)), 0, 12) : 0;
  std::string s = fmt::format("{:.{}f}", value, decimals);
  return s == "-0" ? "0" : s;
}

}  // namespace pf
