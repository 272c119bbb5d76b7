// SOAP against the float64 reference written from the paper (soap_reference.hpp).
#include "soap_reference.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

using namespace soap_ref;

// A small Linear stack (two Linears, one of them wide, with biases, a layer norm's gain and an
// embedding-like matrix that is not a Linear's): 8 steps with a refresh every 2 of SOAP's steps,
// so the bases come from the eigensolver (step 1) and three power iterations (steps 3, 5, 7).
TEST(Soap, MatchesTheFloat64ReferenceOverThreeRefreshes) {
  Stack s;
  s.add("fc1.weight", {8, 8}, true, true);
  s.add("fc1.bias", {8}, false, false);
  s.add("fc2.weight", {4, 8}, true, true);
  s.add("fc2.bias", {4}, false, false);
  s.add("ln.weight", {8}, false, false);
  s.add("wte.weight", {6, 8}, false, true);
  auto opt = s.ours();
  ASSERT_EQ(opt->name(), "soap");
  expect_steps_match_reference(s, *opt, 8, 8);
}

// precond.placement = skip: L and R take a gradient only on the first step and on the steps that
// end with a refresh (every 3 of SOAP's steps here: steps 4 and 7), as the reference with the same
// rule; inline's statistics (every step) give other weights.
TEST(Soap, SkipGathersStatisticsOnlyOnTheRefreshSteps) {
  Stack skip, every;
  for (Stack* s : {&skip, &every}) {
    s->h.freq = 3, s->h.skip = s == &skip;
    s->add("fc1.weight", {8, 8}, true, true);
    s->add("fc2.weight", {4, 8}, true, true);
    s->add("fc2.bias", {4}, false, false);
  }
  auto opt = skip.ours();
  expect_steps_match_reference(skip, *opt, 8, 8);
  for (int t = 1; t <= 8; ++t) every.ref_step(t, kNorms[t - 1]);
  double apart = 0;
  for (size_t k = 0; k < skip.params.size(); ++k)
    for (int64_t i = 0; i < skip.params[k]->value.numel(); ++i)
      apart = std::max(apart, std::abs(skip.params[k]->value[i] - every.ref[k].w.v[i]));
  std::printf("skip against inline's reference: %.3g (tolerance %.3g)\n", apart, skip.tolerance(8, 8));
  EXPECT_GT(apart, 10 * skip.tolerance(8, 8));
}

// SOAP's refreshes as units (kfac.placement = bubbles: each factor's in some step's bubbles, before
// that step's update): one factor at a time, as a refresh record says, against the reference
// refreshing the same factors before the same steps. Without refresh_by_units the frequency (1:
// every step) would refresh all of them after every update.
TEST(Soap, FactorByFactorRefreshesMatchTheReferenceFollowingTheSameRecord) {
  Stack s;
  s.h.freq = 1, s.h.by_units = true;
  s.add("fc1.weight", {8, 8}, true, true);
  s.add("fc1.bias", {8}, false, false);
  s.add("fc2.weight", {4, 8}, true, true);
  s.add("ln.weight", {8}, false, false);
  auto opt = s.ours();
  auto& soap = dynamic_cast<Soap&>(*opt);
  soap.refresh_by_units(true);
  // Before step t, (rotated weight, side): L and R of a weight at other steps, both at one.
  const std::multimap<int, std::pair<int, int>> record = {{3, {0, 0}}, {3, {1, 1}}, {4, {0, 1}}, {6, {1, 0}},
                                                          {6, {0, 0}}, {6, {0, 1}}, {7, {1, 1}}};
  const int linear[] = {0, 2};  // the Stack's index of each rotated weight
  for (int t = 1; t <= 8; ++t) {
    for (auto [it, end] = record.equal_range(t); it != end; ++it) {
      soap.refresh_factor(it->second.first, it->second.second);
      refresh_side(s.ref[linear[it->second.first]], it->second.second);
    }
    s.ref_step(t, kNorms[t - 1]);
    opt->step(s.params, s.h.lr);
    const double w = s.worst();
    std::printf("step %d: largest difference %.3g (tolerance %.3g)\n", t, w, s.tolerance(t, 8));
    EXPECT_LT(w, s.tolerance(t, 8)) << "step " << t;
  }
  EXPECT_EQ(Soap::rotated_weights(s.params), (std::vector<int>{0, 2}));
}

// A refresh timed for the planner leaves the state as it was: the next steps are the same bits.
TEST(Soap, TimingARefreshLeavesTheStateAsItWas) {
  Stack a, b;
  for (Stack* s : {&a, &b}) s->add("fc1.weight", {8, 8}, true, true), s->add("fc2.weight", {4, 8}, true, true);
  auto opt_a = a.ours(), opt_b = b.ours();
  for (auto* o : {opt_a.get(), opt_b.get()}) dynamic_cast<Soap&>(*o).refresh_by_units(true);
  for (int t = 1; t <= 5; ++t) {
    a.set_grads(t, kNorms[t - 1]), b.set_grads(t, kNorms[t - 1]);
    if (t == 3)
      for (int w : {0, 1})
        for (int side : {0, 1}) EXPECT_GE(dynamic_cast<Soap&>(*opt_a).time_refresh_factor(w, side), 0.0);
    opt_a->step(a.params, a.h.lr), opt_b->step(b.params, b.h.lr);
  }
  for (size_t k = 0; k < a.params.size(); ++k)
    EXPECT_EQ(std::memcmp(a.params[k]->value.data(), b.params[k]->value.data(), a.params[k]->value.numel() * 4), 0);
}

// Statistics one step late (defer_statistics: bubbles, STAT in the next step's bubbles) are
// inline SOAP's to the bit. After update t the statistics hold exactly inline's after update t - 1
// (one step stale); whatever reads them first adds the pending gradient: the STAT unit before or
// after the step's refreshes, a refresh of that side before its STAT, the next update when no STAT
// ran, settle() for a checkpoint. Weights and every state tensor match inline's bit for bit.
TEST(Soap, DeferredStatisticsAreInlineSoapsOneStepLate) {
  Stack a, b;
  for (Stack* s : {&a, &b}) {
    s->h.freq = 1;
    s->add("fc1.weight", {8, 8}, true, true);
    s->add("fc1.bias", {8}, false, false);
    s->add("fc2.weight", {4, 8}, true, true);
  }
  auto opt_a = a.ours(), opt_b = b.ours();
  auto &inline_soap = dynamic_cast<Soap&>(*opt_a), &late = dynamic_cast<Soap&>(*opt_b);
  inline_soap.refresh_by_units(true), late.refresh_by_units(true);
  opt_a->init(a.params), opt_b->init(b.params);
  const std::multimap<int, std::pair<int, int>> record = {{3, {0, 0}}, {4, {0, 1}}, {4, {1, 0}}, {6, {0, 0}}, {7, {1, 1}}};
  auto tensor = [](Optimizer& o, const std::string& name) {
    for (auto& [n, t] : o.state_tensors())
      if (n == name) return std::vector<float>(t->begin(), t->end());
    ADD_FAILURE() << "no state " << name;
    return std::vector<float>{};
  };
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  for (int t = 1; t <= 8; ++t) {
    late.defer_statistics(t >= 2);
    const bool stat_first = t % 2 == 1, no_stat = t == 5;
    auto stat = [&] { late.update_statistics(0), late.update_statistics(1); };  // each rotated weight's STAT
    if (stat_first && !no_stat) stat();
    for (auto [it, end] = record.equal_range(t); it != end; ++it) {
      inline_soap.refresh_factor(it->second.first, it->second.second);
      late.refresh_factor(it->second.first, it->second.second);
    }
    if (!stat_first && !no_stat) stat();
    const std::vector<float> inline_L = tensor(*opt_a, "fc1.weight.L"), inline_R = tensor(*opt_a, "fc2.weight.R");
    a.set_grads(t, kNorms[t - 1]), b.set_grads(t, kNorms[t - 1]);
    opt_a->step(a.params, a.h.lr), opt_b->step(b.params, b.h.lr);
    if (t >= 2) {
      EXPECT_TRUE(same(tensor(*opt_b, "fc1.weight.L"), inline_L)) << "step " << t << ": not inline's L of step " << t - 1;
      EXPECT_TRUE(same(tensor(*opt_b, "fc2.weight.R"), inline_R)) << "step " << t;
      EXPECT_FALSE(same(tensor(*opt_b, "fc1.weight.L"), tensor(*opt_a, "fc1.weight.L"))) << "step " << t;
    }
    for (size_t k = 0; k < a.params.size(); ++k)
      EXPECT_EQ(std::memcmp(a.params[k]->value.data(), b.params[k]->value.data(), a.params[k]->value.numel() * 4), 0)
          << a.params[k]->name << " at step " << t;
  }
  opt_b->settle();
  auto sa = opt_a->state_tensors(), sb = opt_b->state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t k = 0; k < sa.size(); ++k)
    EXPECT_EQ(std::memcmp(sa[k].second->data(), sb[k].second->data(), sa[k].second->numel() * 4), 0) << sa[k].first;
}

// optim.soap.max_precond_dim: a side longer than it has no statistic and no basis (one-sided
// rotation); a weight with neither is Adam in soap.py's form. A side equal to it is rotated.
TEST(Soap, ASideOverMaxPrecondDimIsNotRotated) {
  Stack s;
  s.h.max_dim = 8;
  s.add("wide.weight", {6, 12}, true, true);   // Q_L only
  s.add("tall.weight", {12, 8}, true, true);   // Q_R only (8 = max_precond_dim)
  s.add("big.weight", {12, 10}, true, true);   // neither
  auto opt = s.ours();
  opt->init(s.params);
  std::map<std::string, Shape> st;
  for (auto& [name, t] : opt->state_tensors()) st[name] = t->shape();
  const std::map<std::string, Shape> expected = {
      {"wide.weight.exp_avg", {6, 12}}, {"wide.weight.exp_avg_sq", {6, 12}}, {"wide.weight.L", {6, 6}},
      {"wide.weight.Q_L", {6, 6}},      {"tall.weight.exp_avg", {12, 8}},    {"tall.weight.exp_avg_sq", {12, 8}},
      {"tall.weight.R", {8, 8}},        {"tall.weight.Q_R", {8, 8}},         {"big.weight.exp_avg", {12, 10}},
      {"big.weight.exp_avg_sq", {12, 10}}};
  EXPECT_EQ(st, expected);
  expect_steps_match_reference(s, *opt, 7, 8);
}

// Everything SOAP carries from step to step is in state_tensors() and the step count: an
// optimizer given them (a checkpoint's) continues bit for bit, across a refresh.
TEST(Soap, StateExportImportResumesBitExactly) {
  Stack a, b;
  for (Stack* s : {&a, &b}) {
    s->add("fc1.weight", {8, 8}, true, true);
    s->add("fc2.weight", {4, 8}, true, true);
    s->add("fc2.bias", {4}, false, false);
  }
  auto opt_a = a.ours(), opt_b = b.ours();
  for (int t = 1; t <= 4; ++t) {
    a.set_grads(t, kNorms[t - 1]);
    opt_a->step(a.params, a.h.lr);
  }
  opt_b->init(b.params);
  for (size_t k = 0; k < a.params.size(); ++k) b.params[k]->value = a.params[k]->value;
  auto sa = opt_a->state_tensors(), sb = opt_b->state_tensors();
  ASSERT_EQ(sa.size(), 2u * 6 + 2);
  for (size_t k = 0; k < sa.size(); ++k) {
    ASSERT_EQ(sa[k].first, sb[k].first);
    *sb[k].second = *sa[k].second;
  }
  opt_b->set_step_count(opt_a->step_count());
  for (int t = 5; t <= 8; ++t) {  // SOAP's steps 4..7: refreshes at 4 and 6
    a.set_grads(t, kNorms[t - 1]);
    b.set_grads(t, kNorms[t - 1]);
    opt_a->step(a.params, a.h.lr);
    opt_b->step(b.params, b.h.lr);
  }
  for (size_t k = 0; k < a.params.size(); ++k)
    EXPECT_EQ(std::memcmp(a.params[k]->value.data(), b.params[k]->value.data(), a.params[k]->value.numel() * 4), 0)
        << a.params[k]->name;
}

// Unlike the elementwise optimizers, SOAP's bits depend on the thread count (its products and
// LAPACK's solvers split their sums by thread), as the model's do: the same thread count gives
// the same bits (train.deterministic's promise), another one the same weights to rounding.
TEST(Soap, SameBitsForTheSameThreadCount) {
  auto run = [](int threads) {
    set_threads(threads);  // OpenMP's and OpenBLAS's
    Stack s;
    s.add("fc1.weight", {24, 40}, true, true);  // wide: every gradient's rows in one row space
    s.add("fc1.bias", {24}, false, false);
    auto opt = s.ours();
    for (int t = 1; t <= 6; ++t) {
      s.set_grads(t, kNorms[t - 1]);
      opt->step(s.params, s.h.lr);
    }
    return std::vector<float>(s.params[0]->value.begin(), s.params[0]->value.end());
  };
  const int before = num_threads();
  const auto one = run(1), one_again = run(1), two = run(2), two_again = run(2);
  set_threads(before);
  EXPECT_EQ(std::memcmp(one.data(), one_again.data(), one.size() * 4), 0);
  EXPECT_EQ(std::memcmp(two.data(), two_again.data(), two.size() * 4), 0);
  double worst = 0;
  for (size_t i = 0; i < one.size(); ++i) worst = std::max(worst, std::abs(double(one[i]) - two[i]));
  EXPECT_LT(worst, Stack().tolerance(6, 40));
}
