#include "sim/cost.hpp"

#include <cmath>

namespace pf {

double CostModel::duration(const Action& a) const {
  const StageCost& c = stage(a.stage);
  const double half_layer = 2.0 * (c.layers > 0 ? c.layers : 1);
  switch (a.kind) {
    case Kind::F: return c.forward;
    case Kind::B: return c.backward;
    case Kind::I: return c.input_grad >= 0 ? c.input_grad : c.backward / 2;
    case Kind::W: return c.weight_grad >= 0 ? c.weight_grad : c.backward / 2;
    case Kind::SEND_F: case Kind::RECV_F: case Kind::SEND_B: case Kind::RECV_B: return 0;
    case Kind::ALLREDUCE: return allreduce_alpha + allreduce_beta * c.grad_bytes;
    case Kind::SYNC_CURV: return allreduce_alpha + allreduce_beta * c.curvature_bytes;
    case Kind::OPT: return c.optimizer;
    case Kind::CURV_A: case Kind::CURV_B: return c.curvature / half_layer;
    case Kind::INV_A: case Kind::INV_B: return c.inversion / half_layer;
    case Kind::PREC: return c.precondition;
    // Timed by the PipeFisher planner from its broadcast model (PlanInput::bcast_*).
    case Kind::BCAST_INV_A: case Kind::BCAST_INV_B: return 0;
    // SOAP's: timed by the planner from its input's measured units (StageKfacCost).
    case Kind::EIG_L: case Kind::EIG_R: case Kind::STAT: return 0;
  }
  return 0;
}

double weight_grad_share(int hidden, int ffn, int seq_len) {
  const double h = hidden, linears = 4 * h * h + 2 * h * ffn, attention = 4.0 * seq_len * h;
  return linears / (2 * linears + attention);
}

void add_recomputation(CostModel& cost) {
  for (StageCost& c : cost.stages) {
    const double i = c.input_grad >= 0 ? c.input_grad : c.backward / 2;  // the split before the sum
    const double w = c.weight_grad >= 0 ? c.weight_grad : c.backward / 2;
    c.input_grad = i + c.forward;
    c.weight_grad = w;
    c.backward += c.forward;
  }
}

double CostModel::p2p_time(int s) const {
  const StageCost& c = stage(s);
  return p2p_latency + (p2p_bandwidth > 0 ? c.activation_bytes / p2p_bandwidth : 0);
}

double CostModel::backward_forward_ratio() const {
  double f = 0, b = 0;
  for (const StageCost& c : stages) f += c.forward, b += c.backward;
  const double r = b / f;
  return f > 0 && b > 0 && std::isfinite(r) ? r : 2.0;
}

ZbSpec zb_spec(const CostModel& cost, double memory) {
  ZbSpec z{.forward = 0, .input_grad = 0, .weight_grad = 0, .comm = 0, .memory = memory};
  const int n = static_cast<int>(cost.stages.size());
  for (int s = 0; s < n; ++s) {
    z.forward += cost.duration(act(Kind::F, s, 0)) / n;
    z.input_grad += cost.duration(act(Kind::I, s, 0)) / n;
    z.weight_grad += cost.duration(act(Kind::W, s, 0)) / n;
    z.comm += cost.p2p_time(s) / n;
  }
  return z;
}

}  // namespace pf
