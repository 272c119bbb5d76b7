// Each optimizer against an independent double-precision reference written from the papers'
// formulas, plus the edge cases of NVLAMB's trust ratio and the gradient pre-normalisation.
#include "noise.hpp"
#include "optim/chunked.hpp"
#include "optim/optimizer.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

using namespace pf;
using pf::test::noise;

// ---- allocation counter (global operator new replaced in this test program) ----
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
static std::atomic<long> g_allocations{0};
void* operator new(std::size_t n) {
  ++g_allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

// A small model: a decay matrix, a non-decay bias, a tensor spanning several chunks, and a mirror.
struct Model {
  std::vector<std::unique_ptr<Param>> owned;
  std::vector<Param*> params;
  Model() {
    add("w", {3, 5}, true);
    add("b", {5}, false);
    add("big", {optim_detail::kChunk * 2 + 77}, true);
    add("ln.weight", {5}, false);
    for (Param* p : params)
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value[i] = static_cast<float>(0.5 * noise(7, i + 1000 * params.size()));
  }
  void add(const std::string& name, Shape s, bool decay) {
    owned.push_back(std::make_unique<Param>(name, s, decay));
    params.push_back(owned.back().get());
  }
  // Gradients of step t, scaled so that their global norm is `norm`.
  void set_grads(int t, double norm) {
    double sq = 0;
    for (size_t k = 0; k < params.size(); ++k)
      for (int64_t i = 0; i < params[k]->grad.numel(); ++i) sq += std::pow(noise(100 + t, i + 7919 * k), 2);
    for (size_t k = 0; k < params.size(); ++k)
      for (int64_t i = 0; i < params[k]->grad.numel(); ++i)
        params[k]->grad[i] = static_cast<float>(noise(100 + t, i + 7919 * k) * norm / std::sqrt(sq));
  }
};

// The reference: every quantity in double, one element at a time, straight from the formulas.
struct Ref {
  std::vector<std::vector<double>> p, m, v;
  std::vector<bool> decay;
  explicit Ref(const Model& model) {
    for (Param* q : model.params) {
      p.emplace_back(q->value.begin(), q->value.end());
      m.emplace_back(q->value.numel(), 0.0);
      v.emplace_back(q->value.numel(), 0.0);
      decay.push_back(q->decay);
    }
  }
  static std::vector<std::vector<double>> grads(const Model& model, double clip) {
    std::vector<std::vector<double>> g;
    double sq = 0;
    for (Param* q : model.params) {
      g.emplace_back(q->grad.begin(), q->grad.end());
      for (double x : g.back()) sq += x * x;
    }
    double norm = std::sqrt(sq);
    if (clip > 0 && norm > clip)
      for (auto& t : g)
        for (double& x : t) x /= norm / clip;
    return g;
  }
  void sgd(const Model& model, double lr, double mu, double wd, double clip) {
    auto g = grads(model, clip);
    for (size_t k = 0; k < p.size(); ++k)
      for (size_t i = 0; i < p[k].size(); ++i) {
        double d = g[k][i] + (decay[k] ? wd * p[k][i] : 0.0);
        m[k][i] = mu * m[k][i] + d;
        p[k][i] -= lr * m[k][i];
      }
  }
  void adamw(const Model& model, int t, double lr, double b1, double b2, double eps, double wd, double clip) {
    auto g = grads(model, clip);
    for (size_t k = 0; k < p.size(); ++k)
      for (size_t i = 0; i < p[k].size(); ++i) {
        if (decay[k]) p[k][i] *= 1 - lr * wd;
        m[k][i] = b1 * m[k][i] + (1 - b1) * g[k][i];
        v[k][i] = b2 * v[k][i] + (1 - b2) * g[k][i] * g[k][i];
        double mh = m[k][i] / (1 - std::pow(b1, t)), vh = v[k][i] / (1 - std::pow(b2, t));
        p[k][i] -= lr * mh / (std::sqrt(vh) + eps);
      }
  }
  void nvlamb(const Model& model, int t, double lr, double b1, double b2, double eps, double wd, double clip) {
    auto g = grads(model, clip);
    for (size_t k = 0; k < p.size(); ++k) {
      std::vector<double> u(p[k].size());
      double pn = 0, un = 0;
      for (size_t i = 0; i < p[k].size(); ++i) {
        m[k][i] = b1 * m[k][i] + (1 - b1) * g[k][i];
        v[k][i] = b2 * v[k][i] + (1 - b2) * g[k][i] * g[k][i];
        double mh = m[k][i] / (1 - std::pow(b1, t)), vh = v[k][i] / (1 - std::pow(b2, t));
        u[i] = mh / (std::sqrt(vh) + eps) + (decay[k] ? wd * p[k][i] : 0.0);
        pn += p[k][i] * p[k][i];
        un += u[i] * u[i];
      }
      double ratio = pn > 0 && un > 0 ? std::sqrt(pn) / std::sqrt(un) : 1.0;
      for (size_t i = 0; i < p[k].size(); ++i) p[k][i] -= lr * ratio * u[i];
    }
  }
};

// Largest relative difference, relative to max(|ref|, 0.1) (values are O(0.1..1)).
double max_rel_diff(const Model& model, const std::vector<std::vector<double>>& ref) {
  double worst = 0;
  for (size_t k = 0; k < model.params.size(); ++k)
    for (int64_t i = 0; i < model.params[k]->value.numel(); ++i)
      worst = std::max(worst, std::abs(model.params[k]->value[i] - ref[k][i]) / std::max(std::abs(ref[k][i]), 0.1));
  return worst;
}

// Gradient norms per step: above the clip (pre-normalised), below it (untouched), far above.
constexpr double kNorms[] = {3.0, 0.4, 0.9, 25.0, 0.05, 1.7};

}  // namespace

TEST(Optimizers, SgdMatchesReference) {
  Model model;
  Ref ref(model);
  Sgd opt(0.9, 0.01, 1.0);
  for (int t = 1; t <= 6; ++t) {
    model.set_grads(t, kNorms[t - 1]);
    ref.sgd(model, 0.05, 0.9, 0.01, 1.0);
    opt.step(model.params, 0.05);
    EXPECT_LT(max_rel_diff(model, ref.p), 1e-6) << "step " << t;
  }
  // And the state matches the reference momentum.
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), model.params.size());
  EXPECT_EQ(st[0].first, "w.momentum_buffer");
  for (int64_t i = 0; i < st[0].second->numel(); ++i) EXPECT_NEAR((*st[0].second)[i], ref.m[0][i], 1e-6);
}

TEST(Optimizers, AdamWMatchesReference) {
  Model model;
  Ref ref(model);
  AdamW opt(0.9, 0.999, 1e-6, 0.01, 1.0);
  for (int t = 1; t <= 6; ++t) {
    model.set_grads(t, kNorms[t - 1]);
    ref.adamw(model, t, 1e-2, 0.9, 0.999, 1e-6, 0.01, 1.0);
    opt.step(model.params, 1e-2);
    EXPECT_LT(max_rel_diff(model, ref.p), 1e-6) << "step " << t;
  }
  EXPECT_EQ(opt.step_count(), 6);
}

TEST(Optimizers, NvLambMatchesReference) {
  Model model;
  Ref ref(model);
  auto opt = make_optimizer(OptimConfig{});  // the defaults are NVIDIA's recipe
  ASSERT_EQ(opt->name(), "nvlamb");
  for (int t = 1; t <= 6; ++t) {
    model.set_grads(t, kNorms[t - 1]);
    ref.nvlamb(model, t, 2e-2, 0.9, 0.999, 1e-6, 0.01, 1.0);
    opt->step(model.params, 2e-2);
    EXPECT_LT(max_rel_diff(model, ref.p), 1e-6) << "step " << t;
  }
  auto st = opt->state_tensors();
  ASSERT_EQ(st.size(), 2 * model.params.size());
  EXPECT_EQ(st[2].first, "b.exp_avg");
  EXPECT_EQ(st[3].first, "b.exp_avg_sq");
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_NEAR((*st[2].second)[i], ref.m[1][i], 1e-6 * std::abs(ref.m[1][i]) + 1e-12);
    EXPECT_NEAR((*st[3].second)[i], ref.v[1][i], 1e-6 * std::abs(ref.v[1][i]) + 1e-15);
  }
}

TEST(Optimizers, NvLambTrustRatioIsOneWhenANormIsZero) {
  Param zero_w("zero_weights", {2}), zero_u("zero_update", {2}, /*decay=*/false), both("both_zero", {3});
  zero_w.grad[0] = 0.5f;
  zero_w.grad[1] = -0.25f;  // global norm < 1: no pre-normalisation
  zero_u.value[0] = 1.0f;
  zero_u.value[1] = -2.0f;  // no gradient and no decay: u = 0
  NvLamb opt(0.9, 0.999, 1e-6, 0.01, 1.0);
  std::vector<Param*> ps{&zero_w, &zero_u, &both};
  opt.step(ps, 0.1);
  // ||p|| = 0: ratio 1, p = -lr * u with u = g / (|g| + eps) on the first step.
  EXPECT_FLOAT_EQ(zero_w.value[0], static_cast<float>(-0.1 * 0.5 / (0.5 + 1e-6)));
  EXPECT_FLOAT_EQ(zero_w.value[1], static_cast<float>(0.1 * 0.25 / (0.25 + 1e-6)));
  // ||u|| = 0: ratio 1, nothing moves and nothing becomes NaN.
  EXPECT_EQ(zero_u.value[0], 1.0f);
  EXPECT_EQ(zero_u.value[1], -2.0f);
  for (float x : both.value) EXPECT_EQ(x, 0.0f);
}

TEST(Optimizers, PreNormalisationOnlyAboveTheThreshold) {
  Sgd probe(0.0, 0.0, 1.0);
  EXPECT_EQ(probe.clip_scale(0.5), 1.0);
  EXPECT_EQ(probe.clip_scale(1.0), 1.0);
  EXPECT_EQ(probe.clip_scale(4.0), 0.25);
  EXPECT_EQ(Sgd(0.0, 0.0, 0.0).clip_scale(100.0), 1.0);  // 0 = off

  // NVLAMB with clip 1 on gradients of norm 10 then 0.5 behaves as NVLAMB without clipping fed
  // the gradients divided by 10 then unchanged; without clipping the second step differs.
  auto run = [](double clip, double first_norm) {
    Model model;
    NvLamb opt(0.9, 0.999, 1e-6, 0.01, clip);
    model.set_grads(1, first_norm);
    std::vector<float> g0(model.params[0]->grad.begin(), model.params[0]->grad.end());
    opt.step(model.params, 0.01);
    // The gradient itself is left as it was.
    EXPECT_EQ(std::memcmp(g0.data(), model.params[0]->grad.data(), g0.size() * 4), 0);
    model.set_grads(2, 0.5);
    opt.step(model.params, 0.01);
    return std::vector<float>(model.params[0]->value.begin(), model.params[0]->value.end());
  };
  auto clipped = run(1.0, 10.0), prescaled = run(0.0, 1.0), unclipped = run(0.0, 10.0);
  double diff_same = 0, diff_other = 0;
  for (size_t i = 0; i < clipped.size(); ++i) {
    diff_same = std::max(diff_same, std::abs(double(clipped[i]) - prescaled[i]));
    diff_other = std::max(diff_other, std::abs(double(clipped[i]) - unclipped[i]));
  }
  EXPECT_LT(diff_same, 1e-6);
  EXPECT_GT(diff_other, 1e-4);
}

TEST(Optimizers, MirrorsAreLeftOutOfTheGlobalNorm) {
  Param a("a", {2}), mirror("a", {2});
  mirror.mirror = true;
  a.grad[0] = 3.0f;
  a.grad[1] = 4.0f;
  mirror.grad[0] = 3.0f;
  mirror.grad[1] = 4.0f;
  Sgd opt(0.0, 0.0, 1.0);
  std::vector<Param*> ps{&a, &mirror};
  EXPECT_EQ(opt.grad_sq_norm(ps), 25.0);
  opt.step(ps, 1.0);  // norm 5 -> both stepped by g / 5, and stay equal
  EXPECT_FLOAT_EQ(a.value[0], -0.6f);
  EXPECT_FLOAT_EQ(a.value[1], -0.8f);
  EXPECT_EQ(a.value[0], mirror.value[0]);
  EXPECT_EQ(a.value[1], mirror.value[1]);
}

TEST(Optimizers, WeightDecaySkipsNonDecayParams) {
  // With zero gradients only the weight decay moves a parameter.
  for (std::string name : {"sgd", "adamw", "nvlamb", "soap"}) {  // soap: AdamW on these (not Linears)
    Param w("w", {2}, /*decay=*/true), b("b", {2}, /*decay=*/false);
    w.value.fill(2.0f);
    b.value.fill(2.0f);
    OptimConfig c;
    c.name = parse_name<OptimName>(name).value();
    c.weight_decay = 0.1;
    auto opt = make_optimizer(c);
    std::vector<Param*> ps{&w, &b};
    opt->step(ps, 0.5);
    EXPECT_EQ(b.value[0], 2.0f) << name;
    EXPECT_EQ(b.value[1], 2.0f) << name;
    // sgd, adamw and soap: p -= lr * wd * p; nvlamb: u = wd p, ratio 1/wd, p -= lr * p.
    float expect = name == "nvlamb" ? 2.0f * (1 - 0.5f) : 2.0f * (1 - 0.5f * 0.1f);
    EXPECT_FLOAT_EQ(w.value[0], expect) << name;
  }
}

TEST(Optimizers, SameBitsForAnyThreadCount) {
  auto run = [](int threads) {
    omp_set_num_threads(threads);
    Model model;
    auto opt = make_optimizer(OptimConfig{});
    for (int t = 1; t <= 3; ++t) {
      model.set_grads(t, kNorms[t - 1]);
      opt->step(model.params, 0.01);
    }
    return std::vector<float>(model.params[2]->value.begin(), model.params[2]->value.end());
  };
  int before = omp_get_max_threads();
  auto one = run(1), two = run(2), three = run(3);
  omp_set_num_threads(before);
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * 4), 0);
  EXPECT_EQ(std::memcmp(one.data(), three.data(), one.size() * 4), 0);
}

TEST(Optimizers, StepAllocatesNothingAfterInit) {
  for (std::string name : {"sgd", "adamw", "nvlamb", "soap"}) {
    Model model;
    model.params[0]->linear = true;  // soap: a Linear's weight, rotated
    OptimConfig c;
    c.name = parse_name<OptimName>(name).value();
    c.soap.precondition_frequency = 1;  // soap: steps 2 and 3 refresh the bases (step 1 decomposes)
    auto opt = make_optimizer(c);
    model.set_grads(1, 2.0);
    opt->step(model.params, 0.01);  // allocates the state and SOAP's scratch (and warms up the thread pool)
    long before = g_allocations.load();
    opt->step(model.params, 0.01);
    opt->step(model.params, 0.01);
    EXPECT_EQ(g_allocations.load(), before) << name;
  }
}

TEST(Optimizers, StateExportImportResumesBitExactly) {
  Model a, b;
  auto opt_a = make_optimizer(OptimConfig{});
  for (int t = 1; t <= 3; ++t) {
    a.set_grads(t, kNorms[t - 1]);
    opt_a->step(a.params, 0.01);
  }
  // "Checkpoint": weights, state tensors by name, step count.
  auto opt_b = make_optimizer(OptimConfig{});
  opt_b->init(b.params);
  for (size_t k = 0; k < a.params.size(); ++k) b.params[k]->value = a.params[k]->value;
  auto sa = opt_a->state_tensors(), sb = opt_b->state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t k = 0; k < sa.size(); ++k) {
    ASSERT_EQ(sa[k].first, sb[k].first);
    *sb[k].second = *sa[k].second;
  }
  opt_b->set_step_count(opt_a->step_count());
  for (int t = 4; t <= 5; ++t) {
    a.set_grads(t, kNorms[t - 1]);
    b.set_grads(t, kNorms[t - 1]);
    opt_a->step(a.params, 0.01);
    opt_b->step(b.params, 0.01);
  }
  for (size_t k = 0; k < a.params.size(); ++k)
    EXPECT_EQ(std::memcmp(a.params[k]->value.data(), b.params[k]->value.data(), a.params[k]->value.numel() * 4), 0);
}

TEST(Optimizers, FactoryAndMisuse) {
  OptimConfig c;
  for (std::string name : {"sgd", "adamw", "nvlamb", "soap"}) {
    c.name = parse_name<OptimName>(name).value();
    EXPECT_EQ(make_optimizer(c)->name(), name);
  }
  try {  // an unknown name never reaches the factory: it is refused where the config is read
    Config::from_toml_string("", {"optim.name=adam"});
    FAIL() << "accepted an unknown optimizer";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.name"), std::string::npos) << e.what();
  }
  // Stepping other parameters than those it was initialised with is a bug, caught.
  Model a, b;
  auto opt = make_optimizer(OptimConfig{});
  opt->step(a.params, 0.01);
  EXPECT_THROW(opt->step(b.params, 0.01), std::logic_error);
}
