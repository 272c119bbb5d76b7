#pragma once
// One unit of pipeline work on one device: a small value (kind, stage, pipeline, micro-batch,
// layer). Generators emit compute kinds (F, B, or the split backward I + W); the lowering pass
// adds communication; the PipeFisher planner adds the K-FAC kinds. The runtime maps each kind to
// one handler, the simulator to one duration.
//
// Text token grammar (one token per action, no spaces; regex in action.cpp):
//   token  := stage KIND [micro_batch] ["p" pipeline] ["l" layer] ["b" block]
//   stage, micro_batch, pipeline, layer, block := decimal integers; KIND := upper-case name below
// Examples: "3F1" (stage 3 forward of micro-batch 1, pipeline 0), "0B5p1" (Chimera's up
// pipeline), "2CURV_A1l4" (curvature A of layer 4 for micro-batch 1 on stage 2), "2INV_Al4",
// "2INV_Bl4b1" (diagonal block 1 of B_4, a split inversion piece), "1PREC", "1SEND_F0" (stage 1 sends the output activation of micro-batch 0 to stage 2).
// "2BCAST_INV_Al4b1" (broadcast of that piece's inverse among the stage's replicas).
// "1EIG_Rl2" (SOAP's refresh of the basis of R for stage 1's third rotated weight), "1STATl2".
// Kinds without a micro-batch (INV_*, BCAST_INV_*, PREC, ALLREDUCE, OPT, SYNC_CURV, EIG_*, STAT) omit the number.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pf {

enum class Kind : uint8_t {
  F,          // forward of one micro-batch on one stage
  B,          // full backward (input and weight gradient)
  I,          // zero-bubble split backward: input gradient (on the critical path)
  W,          // zero-bubble split backward: weight gradient (deferrable)
  SEND_F,     // send stage output activation to the next stage
  RECV_F,     // receive stage input activation from the previous stage
  SEND_B,     // send input gradient to the previous stage
  RECV_B,     // receive output gradient from the next stage
  ALLREDUCE,  // gradient all-reduce among the copies of a stage (data parallel, Chimera)
  OPT,        // optimizer step of a stage
  CURV_A,     // K-FAC curvature A_l (input activations) of one layer for one micro-batch
  CURV_B,     // K-FAC curvature B_l (output errors) of one layer for one micro-batch
  SYNC_CURV,  // all-reduce of the curvature factors of a stage
  INV_A,      // inversion of A_l
  INV_B,      // inversion of B_l
  PREC,       // precondition the gradients of a stage
  BCAST_INV_A,  // broadcast of the inverse of A_l (or one diagonal block) from the replica that
  BCAST_INV_B,  // inverted it to the stage's other replicas (PipeFisher, W > 1), upper triangle
  EIG_L,      // SOAP: the eigenbasis refresh of Linear l's statistic L (its output side), before the
  EIG_R,      // step's update; of R (its input side). The layer is the stage's l-th rotated weight
  STAT,       // SOAP: rotated weight l's statistics L and R take its previous step's gradient (every step)
};
inline constexpr int kNumKinds = 21;

std::string_view kind_name(Kind k);             // "F", "SEND_F", "CURV_A", ...
std::optional<Kind> kind_from_name(std::string_view name);
bool has_micro_batch(Kind k);                   // F B I W SEND/RECV CURV_A/B
bool is_compute(Kind k);                        // counts as busy device time
bool is_pass(Kind k);                           // F, B, I, W: a forward or backward pass over a chunk
bool is_p2p(Kind k);                            // SEND_* / RECV_*
bool is_collective(Kind k);                     // ALLREDUCE, SYNC_CURV, BCAST_INV_*: all copies start together
bool is_kfac(Kind k);                           // CURV_*, SYNC_CURV, INV_*, BCAST_INV_*, PREC
bool is_bcast_inv(Kind k);                      // BCAST_INV_A / BCAST_INV_B
bool is_inversion(Kind k);                      // INV_A / INV_B (a whole factor or one diagonal block)
bool is_curvature(Kind k);                      // CURV_A / CURV_B
bool is_eigenbasis(Kind k);                     // EIG_L / EIG_R (SOAP's)
bool is_soap(Kind k);                           // EIG_L / EIG_R / STAT: SOAP's work the planner adds
// A factor's periodic refresh, which the planner packs as one class: K-FAC's inversions, SOAP's
// eigenbasis refreshes.
bool is_factor_refresh(Kind k);
Kind eigenbasis_kind(int side);  // EIG_L (side 0: L) / EIG_R
// K-FAC's kinds by factor side, 0 = A (the layer's input), 1 = B (its output gradient):
// side_index(CURV_A) == side_index(INV_A) == side_index(BCAST_INV_A) == 0, the _B kinds 1.
int side_index(Kind curv_inv_or_bcast);  // EIG_L 0, EIG_R 1
Kind curvature_kind(int side);  // CURV_A / CURV_B
Kind inversion_kind(int side);  // INV_A / INV_B

struct Action {
  Kind kind = Kind::F;
  int stage = 0;        // stage index within its pipeline
  int pipeline = 0;     // 0 = down, 1 = up (Chimera); 0 for every other schedule
  int micro_batch = -1; // -1 for kinds without a micro-batch
  int layer = -1;       // layer within the stage (K-FAC kinds), -1 otherwise
  int block = -1;       // INV_A/INV_B (BCAST_INV_*) of one diagonal block of a factor split by the PipeFisher
                        // planner (block-diagonal approximation), -1 = the whole factor

  friend bool operator==(const Action&, const Action&) = default;
};

// Shorthands for generators and tests.
inline Action act(Kind k, int stage, int mb, int pipeline = 0) { return {k, stage, pipeline, mb, -1}; }

std::string to_token(const Action& a);
// Parses a token; throws UsageError naming `where` (file:line:column) if malformed.
Action parse_token(std::string_view token, const std::string& where);

}  // namespace pf
