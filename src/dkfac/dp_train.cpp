#include "dkfac/dp_train.hpp"

#include "comm/collectives.hpp"
#include "comm/perf_model.hpp"
#include "comm/rank_monitor.hpp"
#include "comm/small.hpp"
#include "core/blas.hpp"
#include "core/error.hpp"
#include "core/files.hpp"
#include "dkfac/distributed_kfac.hpp"
#include "io/hf_model.hpp"
#include "io/safetensors.hpp"
#include "kfac/factor.hpp"
#include "train/preflight.hpp"
#include "train/run_log.hpp"
#include "train/trainer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

namespace pf {

bool is_dp_kfac_run(const Config& cfg) { return cfg.kfac.enabled && cfg.parallel.stages == 1; }

int run_dp_kfac_training(const comm::World& world, Config cfg, const DpKfacArgs& a) {
  const bool root = world.rank() == 0;
  const ParallelConfig& p = cfg.parallel;
  if (p.data_parallel != world.size())
    usage_error("parallel.data_parallel", "is {} but {} ranks were started (one replica per rank with stages = 1)",
                p.data_parallel, world.size());
  if (!a.profile_dir.empty())
    usage_error("--profile-dir", "the action profiler covers the pipeline runtime; data-parallel K-FAC "
                "(parallel.stages = 1) writes its K-FAC timings to train.out_dir/dkfac.json instead");
  cfg.check_files();
  if (!a.init.empty() && !std::filesystem::is_regular_file(a.init)) usage_error("--init", "no such file '{}'", a.init);
  // Every output path writable and the directories locked, before anything is allocated.
  std::unique_ptr<RunLocks> locks;
  comm::on_root_agreed(world.rank(), [&] {
    const RunOutputs outputs{a.save, "", false, false, a.overwrite};
    check_output_paths(cfg, outputs);
    locks = lock_output_dirs(cfg, outputs);
  });
  comm::Groups groups = comm::make_groups(world, 1, p.data_parallel);
  const int threads = comm::threads_per_rank(cfg.train.threads);
  set_threads(threads);

  auto train_data = make_batcher(cfg.model, cfg.data, false);
  auto valid_data = make_batcher(cfg.model, cfg.data, true);
  auto model = build_model(cfg.model, 0, num_blocks(cfg.model) - 1);
  model->init(cfg.train.seed);
  if (!a.init.empty()) load_safetensors(a.init, model->params());
  ModelState st = model->make_state(p.micro_batch_size, cfg.model.seq_len);
  std::vector<Param*> params = model->params();
  auto optim = make_optimizer(cfg.optim);
  optim->init(params);
  const LrSchedule lr = make_run_lr_schedule(cfg);
  KfacPreconditioner kfac(model->linears(), cfg.kfac, cfg.model.vocab);

  // Gradient all-reduce, buffers in the order the backward finishes them (last block first).
  std::vector<std::span<float>> buffers;
  const auto& blocks = model->blocks();
  std::vector<std::vector<size_t>> ready_after(blocks.size());
  std::vector<const Param*> seen;
  for (size_t j = blocks.size(); j-- > 0;)
    for (Param* q : blocks[j]->params()) {
      if (std::find(seen.begin(), seen.end(), q) != seen.end()) continue;  // the tied embedding, once
      seen.push_back(q);
      ready_after[j].push_back(buffers.size());
      buffers.push_back(q->grad.span());
    }
  comm::BucketedAllReduce grad_sync(groups.data_parallel.get(), std::move(buffers));

  // K-FAC's own streams of collectives, apart from the gradients'.
  comm::Comm factor_comm = groups.data_parallel.dup(), inverse_comm = groups.data_parallel.dup();
  const comm::PerfModel perf = comm::load_or_measure_perf_model(factor_comm.get(), time_one_inversion, threads,
                                                                a.perf_cache);
  DistributedKfac dk(kfac, factor_comm.get(), inverse_comm.get(), perf, dkfac_options(cfg.kfac));
  dk.set_progress_hook([&] { grad_sync.progress(); });

  const std::string& out = cfg.train.out_dir;
  std::unique_ptr<RunLog> log;
  comm::on_root_agreed(world.rank(), [&] {
    log = open_run_outputs(cfg);
  });

  std::vector<MicroBatch> mbs(static_cast<size_t>(p.data_parallel) * p.micro_batches);
  for (MicroBatch& mb : mbs) mb.resize(p.micro_batch_size, cfg.model.seq_len);
  const int64_t tokens = static_cast<int64_t>(mbs.size()) * p.micro_batch_size * cfg.model.seq_len;
  if (root) {
    const auto& m = cfg.model;
    const InversionPlacement& pl = dk.placement();
    std::printf("pipefisher train: %s (%s, %d layers, hidden %d, %d heads), %lld tokens/step (%d x %d x %d sequences "
                "of %d), %s + K-FAC (%s%s), %d steps; %d data-parallel ranks; %zu factors, %d inverses broadcast, "
                "perf model %s\n",
                preset_of(m).c_str(), m.arch.c_str(), m.layers, m.hidden, m.heads,
                static_cast<long long>(tokens), p.data_parallel, p.micro_batches, p.micro_batch_size, m.seq_len,
                cfg.optim.name.c_str(), cfg.kfac.distributed.c_str(),
                cfg.kfac.distributed != "spd-kfac" ? ""
                : cfg.kfac.spd_pipelining && cfg.kfac.spd_balance ? ""
                : cfg.kfac.spd_pipelining ? ", no balance" : cfg.kfac.spd_balance ? ", no pipelining"
                                                                                   : ", no pipelining, no balance",
                cfg.train.steps, world.size(), dk.factors(), pl.communicated(),
                perf.from_cache ? "cached" : "measured");
    std::fflush(stdout);
  }

  const Tensor none;
  Tensor no_output, no_input;
  auto t0 = std::chrono::steady_clock::now();
  double valid = 0, step_time_sum = 0;
  int timed_steps = 0;
  const int w = groups.replica, N = p.micro_batches;
  std::string write_error;  // rank 0's log could not be written (a full disk): every rank stops
  comm::StepsRunning running;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    comm::monitor_step(s);
    auto ts = std::chrono::steady_clock::now();
    StepStats stats;
    stats.step = s;
    fill_step(*train_data, s, p.micro_batch_size, mbs);
    model->zero_grad();
    model->set_dropout_step(cfg.train.seed, static_cast<uint64_t>(s));
    stats.kfac_curvature = kfac.curvature_step(s);
    if (stats.kfac_curvature) dk.begin_step(mbs[static_cast<size_t>(w) * N + N - 1].index), dk.attach();
    double loss = 0;
    for (int m = 0; m < N; ++m) {
      const MicroBatch& mb = mbs[static_cast<size_t>(w) * N + m];
      loss += model->forward(mb, none, no_output, st);
      // Model::backward block by block: after the last micro-batch, a block's gradients are final.
      const Tensor* d = &none;
      for (size_t j = blocks.size(); j-- > 0;) {
        Tensor& din = j == 0 ? no_input : ((blocks.size() - j) % 2 ? st.grad_a : st.grad_b);
        blocks[j]->backward(mb, *d, din, *st.blocks[j]);
        d = &din;
        if (m + 1 == N)
          for (size_t i : ready_after[j]) grad_sync.ready(i);
        grad_sync.progress();
      }
    }
    stats.lr = lr.at(s);
    if (stats.kfac_curvature) {
      dk.detach();
      dk.finish_curvature(mbs.front().loss_scale);
    }
    stats.kfac_inversion = kfac.inversion_step(s);
    if (stats.kfac_inversion) {
      const InversionSummary inv = dk.invert_all();
      stats.kfac_raised = inv.raised;
      stats.kfac_kept = inv.kept;
    }
    grad_sync.wait();
    kfac.precondition_all();
    stats.kfac_nu = kfac.kl_clip(stats.lr);
    stats.grad_norm = std::sqrt(optim->grad_sq_norm(params));
    optim->step(params, stats.lr, stats.grad_norm);
    comm::allreduce_sum({&loss, 1}, groups.data_parallel.get(), "the step's loss");
    stats.loss = loss;
    stats.tokens = tokens;
    stats.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    if (s >= 2) step_time_sum += stats.step_time_s, ++timed_steps;
    std::optional<double> v;
    if (s + 1 == cfg.train.steps || (cfg.train.eval_every > 0 && (s + 1) % cfg.train.eval_every == 0)) {
      // Every replica holds the same weights: each evaluates the held-out micro-batches itself.
      double vl = 0;
      MicroBatch& mb = mbs[0];
      const EvalScales scale = eval_scales(*valid_data, cfg.train.eval_batches, p.micro_batch_size, mb);
      for (int b = 0; b < cfg.train.eval_batches; ++b) {
        valid_data->fill(static_cast<int64_t>(b) * p.micro_batch_size, p.micro_batch_size, mb);
        mb.index = 0;
        mb.loss_scale = scale.loss;
        mb.nsp_scale = scale.nsp;
        model->set_training(false);
        vl += model->forward(mb, none, no_output, st);
        model->set_training(true);
      }
      v = valid = vl;
    }
    if (root) {
      try {
        log->step(stats, v);
      } catch (const UsageError& e) {
        write_error = e.what();
      }
    }
    double failed = write_error.empty() ? 0 : 1;
    comm::allreduce_sum({&failed, 1}, MPI_COMM_WORLD, "the write-error flag");
    if (failed > 0) throw UsageError(write_error.empty() ? "a write error on rank 0" : write_error);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Time totals averaged over ranks, for the benchmark.
  const DkfacTimes& t = dk.times();
  std::vector<double> tot = {t.factor_inflight, t.factor_wait, t.inversion, t.inverse_wait, step_time_sum};
  comm::allreduce_sum(tot, groups.data_parallel.get(), "the K-FAC time totals");
  for (double& x : tot) x /= world.size();
  comm::on_root_agreed(world.rank(), [&] {
    std::vector<const Param*> ps;
    for (Param* q : params) ps.push_back(q);
    require_finite(ps, out + "/model.safetensors");
    save_hf_model(out, ps, cfg.model);
    if (!a.save.empty()) save_trained_weights(a.save, ps);
    write_file_atomic(out + "/summary.json", log->summary(valid, wall));
    const InversionPlacement& pl = dk.placement();
    const double ks = std::max(1, t.steps), is = std::max(1, t.inversion_steps);
    nlohmann::json j = {
        {"strategy", cfg.kfac.distributed},
        {"pipelining", cfg.kfac.distributed == "spd-kfac" && cfg.kfac.spd_pipelining},
        {"balance", cfg.kfac.distributed == "spd-kfac" && cfg.kfac.spd_balance},
        {"ranks", world.size()},
        {"factors", dk.factors()},
        {"fused_messages", {{"A", dk.groups(Side::A).size()}, {"B", dk.groups(Side::B).size()}}},
        {"placement", {{"owner", pl.owner}, {"communicated", pl.communicated()}, {"model_load_s", pl.load}}},
        {"perf_model", nlohmann::json::parse(comm::perf_model_to_json(perf))},
        {"timed_steps", timed_steps},
        {"step_time_s", timed_steps ? tot[4] / timed_steps : 0.0},
        {"factor_inflight_s", tot[0] / ks},
        {"factor_wait_s", tot[1] / ks},
        {"factor_hidden_fraction", tot[0] > 0 ? 1.0 - tot[1] / tot[0] : 0.0},
        {"factor_messages", t.factor_messages / ks},
        {"inversion_s", tot[2] / is},
        {"inverse_wait_s", tot[3] / is},
    };
    write_file_atomic(out + "/dkfac.json", j.dump(2) + "\n");
    std::printf("outputs: %s/{config.toml, log.jsonl, metrics.csv, model.safetensors, config.json, summary.json, "
                "dkfac.json}%s\n", out.c_str(), a.save.empty() ? "" : (", " + a.save).c_str());
  });
  return 0;
}

}  // namespace pf
