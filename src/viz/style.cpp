#include "viz/style.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

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
      {"#79706E", "sync-grad", 'a'},           // ALLREDUCE
      {"#BAB0AC", "optimizer", 'o'},           // OPT
      {"#F28E2B", "curvature A", 'c'},         // CURV_A
      {"#FFBE7D", "curvature B", 'c'},         // CURV_B
      {"#9D7660", "sync-curvature", 's'},      // SYNC_CURV
      {"#E15759", "inversion A", 'i'},         // INV_A
      {"#FF9D9A", "inversion B", 'i'},         // INV_B
      {"#B07AA1", "precondition", 'p'},        // PREC
      {"#76B7B2", "broadcast inverse A", 'x'}, // BCAST_INV_A
      {"#A0CBE8", "broadcast inverse B", 'x'}, // BCAST_INV_B
  }};
  return table[static_cast<int>(k)];
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
