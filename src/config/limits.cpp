#include "config/limits.hpp"

#include "core/blas.hpp"
#include "core/error.hpp"
#include "core/machine.hpp"
#include "config/placement.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <thread>
#include <vector>

namespace pf {

namespace {

// A number from a /proc or /sys file, or -1 (absent, "max", unreadable).
double read_number(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) return -1;
  return std::strtod(s.c_str(), nullptr);
}

// A field of /proc/meminfo in bytes, or -1.
double meminfo(const std::string& field) {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  double kb = 0;
  while (f >> key >> kb >> unit)
    if (key == field + ":") return kb * 1024;
  return -1;
}

// OMP_STACKSIZE: a size with an optional B, K, M or G suffix (K by default), as libgomp reads it.
double omp_stacksize() {
  const char* s = std::getenv("OMP_STACKSIZE");
  if (!s || !*s) return -1;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !(v > 0)) return -1;
  while (*end == ' ') ++end;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'B': return v;
    case 'M': return v * 1024 * 1024;
    case 'G': return v * 1024 * 1024 * 1024;
    default: return v * 1024;
  }
}

struct Terms {
  double state = 0;    // parameters, gradients, optimizer state
  double kfac = 0;     // factors and inverses
  double acts = 0;     // the activations of the micro-batches a rank holds at once, through the whole model
  double stacks = 0;   // the threads' stacks
  double total() const { return state + kfac + acts + stacks; }
  // The model, optimizer, K-FAC and activations at their peak, at most: twice the allocations
  // above (backward's gradients beside the activations, the logits' softmax, K-FAC's inversions).
  double held() const { return 2 * (state + kfac + acts); }
  // What the processes hold at their peak, at most: held() plus the stacks and each process's own
  // (libraries, MPI's buffers, OpenBLAS's buffers as touched). bench/memory.sh measures the margin
  // (docs/training.md).
  double peak(int processes) const { return held() + stacks + processes * kProcessBytes; }
  static constexpr double kProcessBytes = 96.0 * 1024 * 1024;
};

// Micro-batches whose activations a rank holds at once, at most: one process runs them one at a
// time; the MPI runtime gives every micro-batch of the step a state of its own (runtime/executor.cpp),
// whatever the schedule.
double in_flight(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  PF_CHECK(p.data_parallel != kAutoDataParallel, "a memory estimate before parallel.data_parallel = auto is resolved");
  return p.stages * p.data_parallel == 1 ? 1 : p.micro_batches;
}

// SOAP's statistics and bases (L, Q_L, R, Q_R) of every Linear weight, in floats: a side of d
// up to optim.soap.max_precond_dim holds 2 d^2 (nn/blocks.cpp, nn/llama_block.cpp for the Linears);
// in the bubbles also the gradient each weight keeps for the next step's STAT.
double soap_floats(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const double C = m.hidden, F = m.ffn, KV = kv_width(m), L = m.layers;
  const double max = cfg.optim.soap.max_precond_dim;
  const bool deferred = placement_spec(cfg.kfac).planned;
  auto side = [&](double d) { return d <= max ? 2 * d * d : 0.0; };
  auto lin = [&](double in, double out) { return side(in) + side(out) + (deferred && (in <= max || out <= max) ? in * out : 0.0); };
  switch (m.arch) {
    case Arch::Bert: return L * (4 * lin(C, C) + lin(C, F) + lin(F, C)) + 2 * lin(C, C) + lin(C, 2);
    case Arch::Gpt: return L * (lin(C, 3 * C) + lin(C, C) + lin(C, F) + lin(F, C));
    case Arch::Llama:
      return L * (2 * lin(C, C) + 2 * lin(C, KV) + 2 * lin(C, F) + lin(F, C)) + (m.tie_embeddings ? 0 : lin(C, m.vocab));
  }
  return 0;
}

Terms terms(const Config& cfg, int local_ranks, int world_ranks, double stack_bytes) {
  const ModelConfig& m = cfg.model;
  const double C = m.hidden, F = m.ffn, V = m.vocab, P = m.max_position, T = m.type_vocab, L = m.layers,
               H = m.heads, S = m.seq_len, B = cfg.parallel.micro_batch_size, N = B * S;
  const bool bert = m.arch == Arch::Bert;
  // Parameters (nn/blocks.cpp): embeddings and their LayerNorm; per block Q, K, V, O, two FFN
  // Linears with biases and two LayerNorms; BERT's head transform, its LayerNorm and decoder bias.
  const bool llama = m.arch == Arch::Llama;
  const double KV = kv_width(m);
  // Llama (nn/llama_block.cpp): the word table only (and lm_head untied); per block Q, O, K and V
  // of width KV, SwiGLU's three matrices, two RMSNorms, no biases; the final RMSNorm.
  const double params = llama ? V * C * (m.tie_embeddings ? 1 : 2) + L * (2 * C * C + 2 * C * KV + 3 * C * F + 2 * C) + C
                              : (V + P + T) * C + 2 * C + L * (4 * C * C + 2 * C * F + 9 * C + F) +
                                    (bert ? C * C + 3 * C + V : 2 * C);
  const double slots = cfg.optim.name == OptimName::Sgd ? (cfg.optim.momentum > 0 ? 1 : 0) : 2;  // momentum / Adam's moments
  const double W = cfg.parallel.data_parallel;
  Terms t;
  t.state = W * 4 * params * (2 + slots);  // value and gradient, plus the optimizer's slots
  if (cfg.optim.name == OptimName::Soap) t.state += W * 4 * soap_floats(cfg);
  if (cfg.kfac.enabled) {
    // A (d_in^2) and B (d_out^2, or its diagonal past kfac.diag_limit), factor and inverse.
    auto lin = [&](double in, double out) { return in * in + (out <= cfg.kfac.diag_limit ? out * out : out); };
    const double per_block = llama ? 2 * lin(C, C) + 2 * lin(C, KV) + 2 * lin(C, F) + lin(F, C)
                                   : 4 * lin(C, C) + lin(C, F) + lin(F, C);
    // Three copies: the factors, their inverses, and the factors a refresh keeps (or the
    // eigendecomposition's work) while the next ones build.
    t.kfac = W * 4 * 3 * (L * per_block + (bert ? lin(C, C) : 0));
    // The MPI runtime saves each micro-batch's Linear inputs and output errors for the curvature
    // its bubbles compute later (runtime/units/chunk_kfac.hpp): per block and token 10C + 2F
    // floats (llama: 9C + 2KV + 3F).
    const double saved = llama ? 9 * C + 2 * KV + 3 * F : 10 * C + 2 * F;
    if (in_flight(cfg) > 1) t.kfac += W * 4 * in_flight(cfg) * N * L * saved;
  }
  // make_state of each block for one micro-batch of B sequences of S tokens: per block eight
  // (N, C) tensors, two (N, F), the attention probabilities (B, H, S, S); the head's decoder
  // input and weight gradients (N, C) and (V, C) (and BERT's bias's, V). Once per rank, the head's
  // chunk of logits: at most model.logit_chunk_rows of the M labelled rows (BERT: the masked ones).
  const double M = B * labelled_per_sequence(m, m.seq_len);
  const double block_acts = llama ? 8 * N * C + 2 * N * KV + 3 * N * F : 8 * N * C + 2 * N * F;  // llama: LlamaState
  const double head = (bert ? 4 : 2) * N * C + N * C + V * C + (bert ? V : 0);
  const double acts = N * C + L * (block_acts + B * H * S * S) + head + 2 * N * C;
  t.acts = W * 4 * (acts * in_flight(cfg) + std::min(M, static_cast<double>(m.logit_chunk_rows)) * V);
  // The host's share of the job; stacks are per process.
  const double share = static_cast<double>(local_ranks) / std::max(1, world_ranks);
  t.state *= share, t.kfac *= share, t.acts *= share;
  t.stacks = cfg.train.threads > 0 ? static_cast<double>(cfg.train.threads) * local_ranks * stack_bytes : 0;
  return t;
}

std::string value_of(const Config& c, const std::string& key) {
  const ModelConfig& m = c.model;
  if (key == "model.layers") return std::to_string(m.layers);
  if (key == "model.hidden") return std::to_string(m.hidden);
  if (key == "model.heads") return std::to_string(m.heads);
  if (key == "model.ffn") return std::to_string(m.ffn);
  if (key == "model.seq_len") return std::to_string(m.seq_len);
  if (key == "model.vocab") return std::to_string(m.vocab);
  if (key == "model.max_position") return std::to_string(m.max_position);
  if (key == "model.type_vocab") return std::to_string(m.type_vocab);
  if (key == "parallel.micro_batch_size") return std::to_string(c.parallel.micro_batch_size);
  if (key == "train.threads") return std::to_string(c.train.threads);
  return "?";
}

}  // namespace

std::string format_bytes(double b) {
  const double k = 1024;
  if (b < k * k) return fmt::format("{:.0f} KiB", b / k);
  if (b < k * k * k) return fmt::format("{:.1f} MiB", b / (k * k));
  if (b < k * k * k * k) return fmt::format("{:.1f} GiB", b / (k * k * k));
  return fmt::format("{:.3g} TiB", b / (k * k * k * k));
}

MachineMemory machine_memory() {
  MachineMemory m{meminfo("MemAvailable"), "MemAvailable of /proc/meminfo"};
  if (m.bytes < 0) m = {meminfo("MemTotal"), "MemTotal of /proc/meminfo"};  // kernels before 3.14
  // A container's limit less what it uses (cgroup v2, then v1); "max" or an absurd v1 value means none.
  for (const auto& [limit, usage] : {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
                                     std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                               "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const double lim = read_number(limit);
    if (lim <= 0) continue;
    const double left = std::max(0.0, lim - std::max(0.0, read_number(usage)));
    if (m.bytes < 0 || left < m.bytes) m = {left, fmt::format("the cgroup's {} less its {}", limit, usage)};
  }
  if (m.bytes < 0) m = {std::numeric_limits<double>::infinity(), "unknown"};
  return m;
}

ThreadLimits thread_limits() {
  ThreadLimits t;
  t.stack_bytes = omp_stacksize();
  if (t.stack_bytes <= 0) {
    rlimit r{};
    // Threads get the stack rlimit as their size (glibc), 2 MiB when it is unlimited.
    t.stack_bytes = getrlimit(RLIMIT_STACK, &r) == 0 && r.rlim_cur != RLIM_INFINITY ? static_cast<double>(r.rlim_cur)
                                                                                     : 2.0 * 1024 * 1024;
  }
  t.kernel_max = std::numeric_limits<int64_t>::max();
  auto least = [&](double v, const char* what) {
    if (v > 0 && v < static_cast<double>(t.kernel_max)) t.kernel_max = static_cast<int64_t>(v), t.kernel_what = what;
  };
  least(read_number("/proc/sys/kernel/threads-max"), "kernel.threads-max");
  least(read_number("/proc/sys/kernel/pid_max"), "kernel.pid_max");
  rlimit np{};
  if (getrlimit(RLIMIT_NPROC, &np) == 0 && np.rlim_cur != RLIM_INFINITY)
    least(static_cast<double>(np.rlim_cur), "ulimit -u (RLIMIT_NPROC)");
  // A thread's stack and its guard page are two memory mappings.
  const double maps = read_number("/proc/sys/vm/max_map_count");
  if (maps > 0) least(maps / 2, "vm.max_map_count / 2 (a stack and its guard page per thread)");
  return t;
}

double estimate_run_bytes(const Config& cfg, int local_ranks, int world_ranks) {
  return terms(cfg, local_ranks, world_ranks, thread_limits().stack_bytes).total();
}

double estimate_peak_bytes(const Config& cfg, int local_ranks, int world_ranks) {
  return terms(cfg, local_ranks, world_ranks, thread_limits().stack_bytes).peak(local_ranks);
}

AddressSpace address_space() {
  AddressSpace a{std::numeric_limits<double>::infinity(), 0, 0};
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY) a.limit = static_cast<double>(r.rlim_cur);
  a.mapped = process_memory().mapped;
  // OpenBLAS's workers map their buffers as they start, racing with this check: count them from
  // the anonymous read-write mappings ("lo-hi rw-p 00000000 00:00 0", no name), in whole buffers
  // (adjacent ones merge into one mapping). Before the run allocates, nothing else that large is.
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, name;
    in >> range >> perms >> offset >> dev >> inode >> name;
    if (perms != "rw-p" || inode != "0" || !name.empty()) continue;
    const size_t dash = range.find('-');
    const double bytes = static_cast<double>(std::stoull(range.substr(dash + 1), nullptr, 16) -
                                             std::stoull(range.substr(0, dash), nullptr, 16));
    a.blas_buffers += static_cast<int>(bytes / kBlasBufferBytes);
  }
  return a;
}

AddressNeed address_need(const Config& cfg, int local_ranks, int world_ranks, const AddressSpace& now) {
  AddressNeed n;
  // This process's share at its peak (stacks are counted below): under ulimit -v an underestimate
  // is a hang or a bad_alloc mid-run rather than a refusal.
  n.run = terms(cfg, 1, world_ranks, 0).held();
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  n.threads = cfg.train.threads > 0 ? cfg.train.threads : std::max(1, cores / std::max(1, local_ranks));
  // OpenBLAS's pool grows to the run's thread count and its workers never exit, each holding the
  // buffer it mapped as it started; every thread of ours may call OpenBLAS at once
  // (core/blas.cpp), each holding another buffer of the pool while it does.
  const int pool = std::max(blas_threads(), n.threads);
  n.buffers = std::max(0, pool - 1 + n.threads - now.blas_buffers);
  n.blas = n.buffers * kBlasBufferBytes;
  n.stacks = (n.threads - 1 + pool - blas_threads()) * thread_limits().stack_bytes;
  std::error_code ec;
  for (const std::string& f : {cfg.data.train_file, cfg.data.valid_file}) {
    const auto size = f.empty() ? 0 : std::filesystem::file_size(f, ec);
    if (!ec) n.files += static_cast<double>(size);
  }
  return n;
}

namespace {

void check_threads(const Config& cfg, int local_ranks, const ThreadLimits& tl, const MachineMemory& mem) {
  if (cfg.train.threads <= 0) return;
  const int64_t host_threads = static_cast<int64_t>(cfg.train.threads) * local_ranks;
  const std::string per = local_ranks > 1 ? fmt::format(" x {} ranks on this host", local_ranks) : "";
  const double stacks = static_cast<double>(host_threads) * tl.stack_bytes;
  if (stacks > mem.bytes)
    usage_error("train.threads", "{}{} threads need {} for their stacks ({} each: OMP_STACKSIZE or ulimit -s), "
                "this machine has {} ({}); at most {} threads fit", cfg.train.threads, per, format_bytes(stacks),
                format_bytes(tl.stack_bytes), format_bytes(mem.bytes), mem.source,
                static_cast<int64_t>(mem.bytes / tl.stack_bytes / local_ranks));
  if (host_threads > tl.kernel_max)
    usage_error("train.threads", "{}{} threads exceed this machine's limit of {} ({})", cfg.train.threads, per,
                tl.kernel_max, tl.kernel_what);
}

// Blames the size key whose default value would shrink the estimate the most.
[[noreturn]] void refuse_memory(const Config& cfg, int local_ranks, int world_ranks, const Terms& t, double stack_bytes,
                   const MachineMemory& mem) {
  const Config d;
  const std::vector<std::pair<std::string, std::function<void(Config&)>>> keys = {
      {"model.layers", [&](Config& c) { c.model.layers = std::min(c.model.layers, d.model.layers); }},
      {"model.hidden", [&](Config& c) { c.model.hidden = std::min(c.model.hidden, d.model.hidden); }},
      {"model.heads", [&](Config& c) { c.model.heads = std::min(c.model.heads, d.model.heads); }},
      {"model.ffn", [&](Config& c) { c.model.ffn = std::min(c.model.ffn, d.model.ffn); }},
      {"model.seq_len", [&](Config& c) { c.model.seq_len = std::min(c.model.seq_len, d.model.seq_len); }},
      {"model.vocab", [&](Config& c) { c.model.vocab = std::min(c.model.vocab, 50257); }},
      {"model.max_position", [&](Config& c) { c.model.max_position = std::min(c.model.max_position, 1024); }},
      {"model.type_vocab", [&](Config& c) { c.model.type_vocab = std::min(c.model.type_vocab, d.model.type_vocab); }},
      {"parallel.micro_batch_size",
       [&](Config& c) { c.parallel.micro_batch_size = std::min(c.parallel.micro_batch_size, d.parallel.micro_batch_size); }},
  };
  std::string key = "model.hidden";
  double best = t.peak(local_ranks);
  for (const auto& [k, reset] : keys) {
    Config c = cfg;
    reset(c);
    const double e = terms(c, local_ranks, world_ranks, stack_bytes).peak(local_ranks);
    if (e < best) best = e, key = k;
  }
  std::string parts = "parameters, gradients and optimizer state " + format_bytes(t.state);
  if (t.kfac > 0) parts += ", K-FAC factors and inverses " + format_bytes(t.kfac);
  const double mbs = in_flight(cfg);
  parts += fmt::format(", activations of {} micro-batch{} {}", mbs, mbs == 1 ? "" : "es", format_bytes(t.acts));
  std::string besides = fmt::format("{} per process", format_bytes(Terms::kProcessBytes));
  if (t.stacks > 0) besides += ", thread stacks " + format_bytes(t.stacks);
  usage_error(key, "{} makes the run need an estimated {} of memory at its peak{} (twice what it allocates: {}; "
              "and {}); this machine has {} available ({})", value_of(cfg, key),
              format_bytes(t.peak(local_ranks)), local_ranks > 1 ? fmt::format(" on this host ({} ranks)", local_ranks) : "",
              parts, besides, format_bytes(mem.bytes), mem.source);
}

}  // namespace

// Under `ulimit -v` a failed mmap inside OpenBLAS spins forever, and one elsewhere is a bad_alloc
// in the middle of the run: refuse up front what will not fit beside what is mapped already.
void check_address_space(const Config& cfg, int local_ranks, int world_ranks) {
  const AddressSpace as = address_space();
  const AddressNeed n = address_need(cfg, local_ranks, world_ranks, as);
  if (!std::isfinite(as.limit) || as.mapped + n.total() <= as.limit) return;
  std::string parts = fmt::format("{} OpenBLAS buffer{} of {} for {} thread{}", n.buffers, n.buffers == 1 ? "" : "s",
                                  format_bytes(kBlasBufferBytes), n.threads, n.threads == 1 ? "" : "s");
  if (n.stacks > 0) parts += ", thread stacks " + format_bytes(n.stacks);
  parts += ", model, optimizer state and activations " + format_bytes(n.run);
  if (n.files > 0) parts += ", token files " + format_bytes(n.files);
  usage_error("ulimit -v", "the address-space limit (RLIMIT_AS) is {}: this process has {} mapped and the run needs "
              "an estimated {} more ({}); raise the limit to at least {}{}", format_bytes(as.limit),
              format_bytes(as.mapped), format_bytes(n.total()), parts, format_bytes(as.mapped + n.total()),
              n.threads > 1 ? " or lower train.threads" : "");
}

void check_resources(const Config& cfg, int local_ranks, int world_ranks) {
  const ThreadLimits tl = thread_limits();
  const MachineMemory mem = machine_memory();
  check_threads(cfg, local_ranks, tl, mem);
  const Terms t = terms(cfg, local_ranks, world_ranks, tl.stack_bytes);
  if (t.peak(local_ranks) > mem.bytes) refuse_memory(cfg, local_ranks, world_ranks, t, tl.stack_bytes, mem);
  check_address_space(cfg, local_ranks, world_ranks);
}

}  // namespace pf
