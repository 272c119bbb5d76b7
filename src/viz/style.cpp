#include "viz/style.hpp"

#include <array>

namespace pf {

const KindStyle& kind_style(Kind k) {
  static const std::array<KindStyle, kNumKinds> table = {{
      {"#4C78A8", "forward", 'F'},             // F
      {"#59A14F", "backward", 'B'},            // B
      {"#8CD17D", "backward (input grad)", 'I'},   // I
      {"#2F6B3A", "backward (weight grad)", 'W'},  // W
      {"#D7D2CC", "send", '>'},                // SEND_F
      {"#D7D2CC", "recv", '<'},                // RECV_F
      {"#D7D2CC", "send", '>'},                // SEND_B
      {"#D7D2CC", "recv", '<'},                // RECV_B
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

}  // namespace pf
