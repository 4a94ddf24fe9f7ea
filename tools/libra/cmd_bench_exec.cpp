// `libra bench exec`: per-worker attention compute time with the real
// kernel, the straggler per mode, and speedups of tap and tap-split over
// Ulysses on pools of a corpus (docs/executor.md).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exec/harness.hpp"
#include "exec_flags.hpp"
#include "libra/comm.hpp"
#include "libra/executor.hpp"
#include "libra/plan.hpp"

namespace libra::cli {
namespace {

struct BenchOptionsCli {
  PoolFlags pool;
  int pools = 4;
  bool backward = false;
  int repeat = 1;
};

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[x.size() / 2];
}

// Kernel seconds of worker `w` of the pool for one mode, measured alone
// through a loopback communicator (remote inputs stay zero; the kernel's
// time does not depend on the values).
Result<double> worker_seconds(const std::vector<PackedSequence>& pool, const PlanConfig& cfg, const std::optional<Plan>& plan,
                              int w, const BenchOptionsCli& opt) {
  const int W = static_cast<int>(pool.size()) * cfg.cp;
  auto comm = make_loopback_communicator(w, W);
  ExecOptions eo;
  eo.threads = opt.pool.threads;
  eo.relay = opt.pool.relay;
  std::unique_ptr<Executor> ex;
  if (plan) {
    LIBRA_ASSIGN_OR_RETURN(ex, make_plan_executor(*comm, *plan, eo));
  } else {
    LIBRA_ASSIGN_OR_RETURN(ex, make_ulysses_executor(*comm, pool, cfg, eo));
  }
  const std::vector<float> q = harness_home_tensor(1, cfg, w, 0), k = harness_home_tensor(1, cfg, w, 1),
                           v = harness_home_tensor(1, cfg, w, 2), d_o = harness_home_tensor(1, cfg, w, 3);
  std::vector<double> times;
  for (int rep = 0; rep < opt.repeat; ++rep) {
    LIBRA_ASSIGN_OR_RETURN(ForwardOutputs f, ex->forward({q, k, v}));
    double t = ex->last_compute_seconds();
    if (opt.backward) {
      LIBRA_ASSIGN_OR_RETURN(BackwardOutputs g, ex->backward({q, k, v}, f, d_o));
      t += ex->last_compute_seconds();
    }
    times.push_back(t);
  }
  return median(times);
}

int run_bench(BenchOptionsCli opt) {
  PoolFlags& so = opt.pool;
  // CPU-sized defaults scaled from the paper's setting (P = 8, CP = 8,
  // L = 1M, B = 8192, H = 8, h_q = 32, h_kv = 4, d = 128).
  PlanFlags& f = so.flags;
  if (!f.seq_len) f.seq_len = 16384;
  if (!f.cp) f.cp = 4;
  if (*f.cp < 1) return fail(invalid_input(fmt::format("--cp {}: must be at least 1", *f.cp)));
  if (so.pool_size == 0) so.pool_size = 4;
  if (so.pool_size < 1) return fail(invalid_input(fmt::format("--pool-size {}: must be at least 1", so.pool_size)));
  if (!f.block) f.block = *f.seq_len / *f.cp / 4;
  if (f.model.empty()) {
    if (!f.heads_q) f.heads_q = 8;
    if (!f.heads_kv) f.heads_kv = 2;
    if (!f.head_dim) f.head_dim = 64;
  }
  if (!f.head_shards) f.head_shards = 4;
  if (opt.pools < 1) return fail(invalid_input(fmt::format("--pools {}: must be at least 1", opt.pools)));
  if (opt.repeat < 1 || opt.repeat > kMaxRepeat) {
    return fail(invalid_input(fmt::format("--repeat {}: must be in [1, {}]", opt.repeat, kMaxRepeat)));
  }
  const char* modes[] = {"ulysses", "tap", "tap-split"};
  std::vector<PlanConfig> cfgs;
  for (const char* m : modes) {
    Result<PlanConfig> c = make_config(so, m);
    if (!c.ok()) return fail(c.error());
    cfgs.push_back(*c);
  }
  const PlanConfig& c0 = cfgs[0];
  double scale = 1.0;
  Result<std::vector<PackedSequence>> all = load_scaled(so.source, c0.seq_len, &scale);
  if (!all.ok()) return fail(all.error());
  const int P = so.pool_size, W = P * c0.cp;
  // Every pool is checked to exist before the first measurement.
  const auto n = static_cast<std::int64_t>(all->size());
  if (so.pool_index < 0 || (so.pool_index + opt.pools) * P > n) {
    return fail(invalid_input(fmt::format("--pools {}: {} holds {} whole pool(s) of --pool-size {}{}", opt.pools, so.source,
                                          n / P, P,
                                          so.pool_index == 0 ? std::string()
                                                             : fmt::format(", {} from --pool-index {}",
                                                                           std::max<std::int64_t>(0, n / P - so.pool_index),
                                                                           so.pool_index))));
  }
  fmt::print("libra bench exec: per-worker attention compute time measured with the real kernel ({}), every worker of a "
             "pool run one after another on this machine ({} kernel thread(s)), not concurrently; straggler = slowest "
             "worker\n",
             opt.backward ? "forward + backward" : "forward", so.threads);
  fmt::print("pools: {} from {} (sample lengths x {:.6g}), L {}, P {}, CP {}, W {}, B {}, H {}, h_q {}, h_kv {}, d {}, {}, "
             "median of {} run(s){}\n",
             opt.pools, so.source, scale, c0.seq_len, P, c0.cp, W, c0.block_size, c0.head_shards, c0.shape.heads_q,
             c0.shape.heads_kv, c0.shape.head_dim, dtype_name(c0.shape.dtype), opt.repeat,
             cfgs[1].chunk_split == ChunkSplit::kEqual
                 ? std::string()
                 : fmt::format("; tap and tap-split M {} ({})", cfgs[1].chunks, tapered_chunks_text(cfgs[1])));
  {
    // One untimed run first, so that no measured worker pays for first-touch
    // page faults and the kernel's one-time set-up.
    Result<std::vector<PackedSequence>> pool0 = draw_pool(*all, so.source, so.pool_index, P);
    if (!pool0.ok()) return fail(pool0.error());
    Result<double> warm = worker_seconds(*pool0, cfgs[0], std::nullopt, 0, opt);
    if (!warm.ok()) return fail(warm.error());
  }
  fmt::print("{:>4} {:>12} {:>12} {:>9} {:>12} {:>9} {:>10} {:>10}\n", "pool", "ulysses s", "tap s", "speedup",
             "tap-split s", "speedup", "tap R-1", "split R-1");
  std::vector<std::vector<double>> straggler(3);
  for (int k = 0; k < opt.pools; ++k) {
    Result<std::vector<PackedSequence>> pool = draw_pool(*all, so.source, so.pool_index + k, P);
    if (!pool.ok()) return fail(pool.error());
    double imb[3] = {0, 0, 0};
    for (std::size_t mi = 0; mi < 3; ++mi) {
      std::optional<Plan> plan;
      if (mi > 0) {
        Result<Plan> p = make_plan(*pool, cfgs[mi]);
        if (!p.ok()) return fail(p.error());
        plan = *p;
        imb[mi] = plan->imbalance();
      }
      double worst = 0;
      for (int w = 0; w < W; ++w) {
        Result<double> t = worker_seconds(*pool, cfgs[mi], plan, w, opt);
        if (!t.ok()) return fail(t.error());
        worst = std::max(worst, *t);
      }
      straggler[mi].push_back(worst);
    }
    const double u = straggler[0].back(), t = straggler[1].back(), s = straggler[2].back();
    fmt::print("{:>4} {:>12.4f} {:>12.4f} {:>8.2f}x {:>12.4f} {:>8.2f}x {:>10.4f} {:>10.4f}\n", so.pool_index + k, u, t,
               u / t, s, u / s, imb[1], imb[2]);
    std::fflush(stdout);
  }
  for (std::size_t mi = 1; mi < 3; ++mi) {
    double mean_speedup = 0;
    for (int k = 0; k < opt.pools; ++k) mean_speedup += straggler[0][static_cast<std::size_t>(k)] / straggler[mi][static_cast<std::size_t>(k)];
    mean_speedup /= opt.pools;
    const double worst_u = *std::max_element(straggler[0].begin(), straggler[0].end());
    const double worst_m = *std::max_element(straggler[mi].begin(), straggler[mi].end());
    fmt::print("{}: mean straggler speedup over ulysses {:.2f}x, worst-case (slowest pool vs slowest pool) {:.2f}x\n",
               modes[mi], mean_speedup, worst_u / worst_m);
  }
  fmt::print("paper (Libra vs Ulysses, GPU, 1M-token pools): 2.91x and 2.57x mean, 3.14x and 2.90x worst, for its two "
             "model configurations\n");
  return kExitOk;
}

const bool registered = register_command(71, [](CLI::App& app) {
  std::vector<Handler> handlers;
  CLI::App* bench = command_group(app, "bench", "Measure libra's components on this machine");
  auto* be = bench->add_subcommand("exec", "Per-worker kernel compute time and straggler speedups of tap and tap-split "
                                           "over ulysses on pools of a built-in corpus");
  auto bo = std::make_shared<BenchOptionsCli>();
  add_pool_flags(be, bo->pool, true);
  be->add_option("--pools", bo->pools, "pools to measure (default 4)");
  be->add_flag("--backward", bo->backward, "also time the backward pass");
  be->add_option("--repeat", bo->repeat, "runs per worker; the median is used");
  handlers.push_back({be, [bo] { return run_bench(*bo); }});
  return handlers;
});

}  // namespace
}  // namespace libra::cli
