// K-FAC unit costs (sim/kfac_cost.hpp): the K-FAC Linears of a transformer block and the split
// of block-level costs into per-factor units (curvature ~ d^2 per token, inversion ~ d^3).
#include "core/error.hpp"
#include "sim/kfac_cost.hpp"

#include <algorithm>
#include <cmath>

namespace pf {

std::vector<LinearShape> block_linears(const std::string& arch, int d, int ffn, int kv) {
  if (kv == 0) kv = d;
  if (d < 1 || ffn < 1) usage_error("--model", "hidden and ffn sizes must be >= 1 (got {} and {})", d, ffn);
  if (arch == "bert") return {{d, d}, {d, d}, {d, d}, {d, d}, {d, ffn}, {ffn, d}};
  if (arch == "gpt") return {{d, 3 * d}, {d, d}, {d, ffn}, {ffn, d}};
  if (arch == "llama") return {{d, d}, {d, kv}, {d, kv}, {d, d}, {d, ffn}, {d, ffn}, {ffn, d}};
  usage_error("--model", "no K-FAC layer shapes for architecture '{}' (expected bert, gpt or llama)", arch);
}

std::vector<LinearShape> block_linears(const ModelConfig& m) {
  return block_linears(name_of(m.arch), m.hidden, m.ffn, kv_width(m));
}

StageKfacCost split_stage_cost(const std::vector<LinearShape>& layers, double curvature, double inversion,
                               double precondition, double sync) {
  PF_CHECK(!layers.empty(), "a stage needs at least one K-FAC layer");
  double sq = 0, cube = 0;
  for (const LinearShape& l : layers) {
    const double a = l.d_in, b = l.d_out;
    sq += a * a + b * b;
    cube += a * a * a + b * b * b;
  }
  StageKfacCost c;
  for (const LinearShape& l : layers) {
    const double a = l.d_in, b = l.d_out;
    c.curv_a.push_back(curvature * a * a / sq);
    c.curv_b.push_back(curvature * b * b / sq);
    c.inv_a.push_back(inversion * a * a * a / cube);
    c.inv_b.push_back(inversion * b * b * b / cube);
    c.dim_a.push_back(l.d_in);
    c.dim_b.push_back(l.d_out);
  }
  c.precondition = precondition;
  c.sync = sync;
  return c;
}

namespace {
// StageKfacCost::unit, const or not.
template <class Cost>
auto& unit_of(Cost& c, Kind kind, int layer) {
  switch (kind) {
    case Kind::CURV_A: return c.curv_a.at(layer);
    case Kind::CURV_B: return c.curv_b.at(layer);
    case Kind::INV_A: return c.inv_a.at(layer);
    case Kind::INV_B: return c.inv_b.at(layer);
    case Kind::EIG_L: return c.eig_l.at(layer);
    case Kind::EIG_R: return c.eig_r.at(layer);
    case Kind::SYNC_CURV: return c.sync;
    case Kind::PREC: return c.precondition;
    case Kind::STAT: return c.statistics.at(layer);
    default: break;
  }
  PF_CHECK(false, "{} has no K-FAC cost", kind_name(kind));
  return c.sync;  // not reached
}
}  // namespace

double StageKfacCost::unit(Kind kind, int layer) const { return unit_of(*this, kind, layer); }
double& StageKfacCost::unit(Kind kind, int layer) { return unit_of(*this, kind, layer); }

StageKfacCost planner_cost(const StageKfacCost& measured, double scale) {
  StageKfacCost c = measured;
  for (std::vector<double>* unit : {&c.curv_a, &c.curv_b, &c.inv_a, &c.inv_b, &c.eig_l, &c.eig_r, &c.statistics})
    for (double& ms : *unit) ms *= scale;
  c.precondition = measured.precondition * scale;
  c.sync = std::max(measured.sync, 1e-3) * scale;
  return c;
}

std::vector<double> precondition_by_layer(const StageKfacCost& c) {
  std::vector<double> flops;
  for (int l = 0; l < c.layers(); ++l) {
    const double a = c.dim_a[l], b = c.dim_b[l];
    const bool diagonal = !c.diag_b.empty() && c.diag_b[l] != 0;
    flops.push_back(a * b * (a + (diagonal ? 1 : b)));
  }
  double total = 0;
  for (double f : flops) total += f;
  for (double& f : flops) f = total > 0 ? c.precondition * f / total : 0;
  return flops;
}

double block_cost(double whole, int d, int k, int j) {
  PF_CHECK(d >= 1 && k >= 1 && k <= d && j >= 0 && j < k, "block {} of {} for d={}", j, k, d);
  // Sizes as kfac's split_blocks: the first d % k blocks get one more row.
  const double n = d / k + (j < d % k ? 1 : 0);
  return whole * std::pow(n / d, 3);
}

}  // namespace pf
