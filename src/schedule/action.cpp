#include "schedule/action.hpp"

#include "core/error.hpp"

#include <array>
#include <regex>

namespace pf {

namespace {
constexpr std::array<std::string_view, kNumKinds> kNames = {
    "F",   "B",      "I",      "W",         "SEND_F", "RECV_F", "SEND_B", "RECV_B",
    "ALLREDUCE", "OPT", "CURV_A", "CURV_B", "SYNC_CURV", "INV_A", "INV_B", "PREC",
    "BCAST_INV_A", "BCAST_INV_B", "EIG_L", "EIG_R", "STAT"};
}

std::string_view kind_name(Kind k) { return kNames[static_cast<int>(k)]; }

std::optional<Kind> kind_from_name(std::string_view name) {
  for (int i = 0; i < kNumKinds; ++i)
    if (kNames[i] == name) return static_cast<Kind>(i);
  return std::nullopt;
}

bool has_micro_batch(Kind k) {
  switch (k) {
    case Kind::F: case Kind::B: case Kind::I: case Kind::W:
    case Kind::SEND_F: case Kind::RECV_F: case Kind::SEND_B: case Kind::RECV_B:
    case Kind::CURV_A: case Kind::CURV_B:
      return true;
    default:
      return false;
  }
}
bool is_p2p(Kind k) {
  return k == Kind::SEND_F || k == Kind::RECV_F || k == Kind::SEND_B || k == Kind::RECV_B;
}
bool is_bcast_inv(Kind k) { return k == Kind::BCAST_INV_A || k == Kind::BCAST_INV_B; }
bool is_inversion(Kind k) { return k == Kind::INV_A || k == Kind::INV_B; }
bool is_curvature(Kind k) { return k == Kind::CURV_A || k == Kind::CURV_B; }
bool is_eigenbasis(Kind k) { return k == Kind::EIG_L || k == Kind::EIG_R; }
bool is_soap(Kind k) { return is_eigenbasis(k) || k == Kind::STAT; }
bool is_factor_refresh(Kind k) { return is_inversion(k) || is_eigenbasis(k); }
Kind eigenbasis_kind(int side) { return side == 0 ? Kind::EIG_L : Kind::EIG_R; }
bool is_collective(Kind k) { return k == Kind::ALLREDUCE || k == Kind::SYNC_CURV || is_bcast_inv(k); }
bool is_compute(Kind k) { return !is_p2p(k) && !is_collective(k); }
bool is_pass(Kind k) { return k == Kind::F || k == Kind::B || k == Kind::I || k == Kind::W; }
int side_index(Kind k) {
  PF_CHECK(k == Kind::CURV_A || k == Kind::CURV_B || is_inversion(k) || is_bcast_inv(k) || is_eigenbasis(k),
           "{} has no factor side", kind_name(k));
  return k == Kind::CURV_A || k == Kind::INV_A || k == Kind::BCAST_INV_A || k == Kind::EIG_L ? 0 : 1;
}
Kind curvature_kind(int side) { return side == 0 ? Kind::CURV_A : Kind::CURV_B; }
Kind inversion_kind(int side) { return side == 0 ? Kind::INV_A : Kind::INV_B; }
bool is_kfac(Kind k) {
  return k == Kind::CURV_A || k == Kind::CURV_B || k == Kind::SYNC_CURV || k == Kind::INV_A ||
         k == Kind::INV_B || k == Kind::PREC || is_bcast_inv(k);
}

std::string to_token(const Action& a) {
  std::string s = std::to_string(a.stage);
  s += kind_name(a.kind);
  if (has_micro_batch(a.kind)) s += std::to_string(a.micro_batch);
  if (a.pipeline != 0) s.append("p").append(std::to_string(a.pipeline));
  if (a.layer >= 0) s.append("l").append(std::to_string(a.layer));
  if (a.block >= 0) s.append("b").append(std::to_string(a.block));
  return s;
}

namespace {
// A number of an action token; refused (not std::out_of_range) beyond what any schedule uses.
int token_number(const std::string& digits, std::string_view token, const std::string& where) {
  if (digits.size() > 7) usage_error(where, "action '{}': number {} is too large", token, digits);
  return std::stoi(digits);
}
}  // namespace

Action parse_token(std::string_view token, const std::string& where) {
  static const std::regex re(R"(^(\d+)([A-Z_]+)(\d+)?(?:p(\d+))?(?:l(\d+))?(?:b(\d+))?$)");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_match(token.begin(), token.end(), m, re))
    usage_error(where, "malformed action '{}' (expected e.g. 3F1, 0B5p1, 2CURV_A1l4, 2INV_Al4)",
                token);
  Action a;
  a.stage = token_number(m[1].str(), token, where);
  auto kind = kind_from_name(m[2].str());
  if (!kind) usage_error(where, "unknown action kind '{}' in '{}'", m[2].str(), token);
  a.kind = *kind;
  if (has_micro_batch(a.kind) != m[3].matched)
    usage_error(where, "action '{}': kind {} {} a micro-batch number", token, m[2].str(),
                has_micro_batch(a.kind) ? "needs" : "takes no");
  if (m[3].matched) a.micro_batch = token_number(m[3].str(), token, where);
  if (m[4].matched) a.pipeline = token_number(m[4].str(), token, where);
  if (m[5].matched) a.layer = token_number(m[5].str(), token, where);
  if (m[6].matched) a.block = token_number(m[6].str(), token, where);
  return a;
}

}  // namespace pf
