// Tile planning speed (targets, single-threaded: `tap` at paper scale in at
// most 1 ms, `tap-topo` in at most 5 ms) and the quality report over 100
// pools. A Plan derives its exchange (transfers, chunk lists, byte matrices,
// bytes by tier) on first use, so each mode is timed twice: make_plan alone
// (BM_Plan<Mode>) and make_plan plus the first access to the exchange
// (BM_Plan<Mode>WithExchange), which is what a consumer of the whole plan pays.
//
// Paper scale: L = 1,048,576, P = 8, CP = 8 (W = 64), B = 8,192, H = 8,
// h_q = 32, h_kv = 4, d = 128, bf16, M = 4 chunks; sequences of
// builtin:paper-1m (builtin:paper-256k for L = 262,144), pools of 8
// consecutive packed sequences in loader order.
//
//   libra_plan_bench --benchmark_filter=PlanTap            # speed
//   libra_plan_bench --benchmark_filter=WithExchange       # speed, exchange included
//   libra_plan_bench --benchmark_filter=PoolReport         # 100-pool report
//
// The context printed before the results carries fma_peak_cpu_gflops_t1,
// the host's per-core vector-FMA rate at start-up (see main): compare plan
// times only between runs with like readings.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fma_probe.hpp"
#include "libra/corpus.hpp"
#include "libra/plan.hpp"
#include "libra/relay.hpp"

namespace {

constexpr int kPoolSize = 8;

const std::vector<libra::PackedSequence>& sequences(std::int64_t seq_len) {
  static std::vector<libra::PackedSequence> one_m, quarter_m;
  std::vector<libra::PackedSequence>& s = seq_len == 1'048'576 ? one_m : quarter_m;
  if (s.empty()) {
    const std::string source = seq_len == 1'048'576 ? "builtin:paper-1m" : "builtin:paper-256k";
    auto r = libra::load_packed_sequences(source, seq_len);
    if (!r.ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", r.error().message().c_str());
      std::exit(2);
    }
    s = std::move(*r);
  }
  return s;
}

std::vector<libra::PackedSequence> pool(std::int64_t seq_len, std::size_t k) {
  const auto& s = sequences(seq_len);
  std::vector<libra::PackedSequence> p;
  for (std::size_t i = 0; i < kPoolSize; ++i) p.push_back(s[(k * kPoolSize + i) % s.size()]);
  return p;
}

libra::PlanConfig paper_config(std::int64_t seq_len, std::int64_t block, libra::PlanMode mode) {
  libra::PlanConfig c;
  c.seq_len = seq_len;
  c.cp = 8;
  c.block_size = block;
  c.head_shards = 8;
  c.shape = {.heads_q = 32, .heads_kv = 4, .head_dim = 128, .dtype = libra::DType::kBF16};
  c.chunks = 4;
  c.mode = mode;
  return c;
}

struct RunOptions {
  bool kv_prefix = false;  // PlanConfig::kv_prefix
  // The timed region includes the first access to the plan's exchange
  // (which derives all of it); without, only make_plan.
  bool exchange = false;
};

// The counters come from a plan made after the timed loop.
void run_plan(benchmark::State& state, std::int64_t seq_len, std::int64_t block, libra::PlanMode mode,
              RunOptions options = {}) {
  const auto p = pool(seq_len, 0);
  libra::PlanConfig c = paper_config(seq_len, block, mode);
  c.kv_prefix = options.kv_prefix;
  for (auto _ : state) {
    auto plan = libra::make_plan(p, c);
    if (!plan.ok()) {
      state.SkipWithError(plan.error().message().c_str());
      return;
    }
    benchmark::DoNotOptimize(plan->fingerprint());
    if (options.exchange) benchmark::DoNotOptimize(plan->all_transfers().size());
  }
  auto plan = libra::make_plan(p, c);
  if (!plan.ok()) return;
  state.counters["tiles"] = static_cast<double>(plan->tiles().size());
  state.counters["transfers"] = static_cast<double>(plan->all_transfers().size());
  state.counters["imbalance"] = plan->imbalance();
  state.counters["comm_GB"] = static_cast<double>(plan->comm_bytes()) / 1e9;
}

void BM_PlanTap1M(benchmark::State& state) { run_plan(state, 1'048'576, 8192, libra::PlanMode::kTap); }
void BM_PlanTap256K(benchmark::State& state) { run_plan(state, 262'144, 8192, libra::PlanMode::kTap); }
void BM_PlanTapSplit1M(benchmark::State& state) { run_plan(state, 1'048'576, 8192, libra::PlanMode::kTapSplit); }
void BM_PlanUlysses1M(benchmark::State& state) { run_plan(state, 1'048'576, 8192, libra::PlanMode::kUlysses); }
// tap-topo on the default h200 topology (target: at most 5 ms).
void BM_PlanTapTopo1M(benchmark::State& state) { run_plan(state, 1'048'576, 8192, libra::PlanMode::kTapTopo); }
void BM_PlanTapTopo256K(benchmark::State& state) { run_plan(state, 262'144, 8192, libra::PlanMode::kTapTopo); }
// tap-topo with the KV causal prefix (what the simulator's libra-topo plans).
void BM_PlanTapTopoPrefix1M(benchmark::State& state) {
  run_plan(state, 1'048'576, 8192, libra::PlanMode::kTapTopo, {.kv_prefix = true});
}
void BM_PlanTap1MWithExchange(benchmark::State& state) {
  run_plan(state, 1'048'576, 8192, libra::PlanMode::kTap, {.exchange = true});
}
void BM_PlanUlysses1MWithExchange(benchmark::State& state) {
  run_plan(state, 1'048'576, 8192, libra::PlanMode::kUlysses, {.exchange = true});
}
void BM_PlanTapTopo1MWithExchange(benchmark::State& state) {
  run_plan(state, 1'048'576, 8192, libra::PlanMode::kTapTopo, {.exchange = true});
}
void BM_PlanTapTopoPrefix1MWithExchange(benchmark::State& state) {
  run_plan(state, 1'048'576, 8192, libra::PlanMode::kTapTopo, {.kv_prefix = true, .exchange = true});
}
// plan_relays alone (what a relayed schedule adds on every rank) on the
// tap-topo + KV prefix plan, its exchange derived before the timed loop.
void BM_PlanRelaysTapTopoPrefix1M(benchmark::State& state) {
  const auto p = pool(1'048'576, 0);
  libra::PlanConfig c = paper_config(1'048'576, 8192, libra::PlanMode::kTapTopo);
  c.kv_prefix = true;
  auto plan = libra::make_plan(p, c);
  if (!plan.ok()) {
    state.SkipWithError(plan.error().message().c_str());
    return;
  }
  benchmark::DoNotOptimize(plan->all_transfers().size());
  std::int64_t pairs = 0;
  for (auto _ : state) {
    const libra::RelayTable r = libra::plan_relays(*plan);
    pairs = r.relayed_pairs();
    benchmark::DoNotOptimize(pairs);
  }
  state.counters["relayed_pairs"] = static_cast<double>(pairs);
}
// Scaling with tile count: smaller blocks, more tiles (tiles = 8 * T / B per slot).
void BM_PlanTapScaling(benchmark::State& state) {
  run_plan(state, 1'048'576, state.range(0), libra::PlanMode::kTap);
}

BENCHMARK(BM_PlanTap1M)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTap256K)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapSplit1M)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanUlysses1M)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapTopo1M)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapTopo256K)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapTopoPrefix1M)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTap1MWithExchange)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanUlysses1MWithExchange)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapTopo1MWithExchange)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapTopoPrefix1MWithExchange)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanRelaysTapTopoPrefix1M)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanTapScaling)->Arg(32768)->Arg(16384)->Arg(8192)->Arg(4096)->Arg(2048)->Unit(benchmark::kMillisecond);

// Quality over 100 pools (one iteration): mean and max intra-pool imbalance,
// the share of pools within tau, and mean exchanged bytes per pool. Args:
// mode, L, and coarse (1: one block per worker, B = L/CP, a stress case
// where single tiles exceed the per-worker target and TAP overshoots).
void BM_PoolReport(benchmark::State& state) {
  const auto mode = static_cast<libra::PlanMode>(state.range(0));
  const std::int64_t seq_len = state.range(1);
  const bool coarse = state.range(2) != 0;
  const libra::PlanConfig c = paper_config(seq_len, coarse ? seq_len / 8 : 8192, mode);
  constexpr int kPools = 100;
  double sum_imb = 0, max_imb = 0, sum_bytes = 0, within = 0;
  for (auto _ : state) {
    sum_imb = max_imb = sum_bytes = within = 0;
    for (int k = 0; k < kPools; ++k) {
      auto plan = libra::make_plan(pool(seq_len, static_cast<std::size_t>(k)), c);
      if (!plan.ok()) {
        state.SkipWithError(plan.error().message().c_str());
        return;
      }
      sum_imb += plan->imbalance();
      max_imb = std::max(max_imb, plan->imbalance());
      sum_bytes += static_cast<double>(plan->comm_bytes());
      within += plan->imbalance() <= c.tau + 1e-12 ? 1 : 0;
    }
  }
  state.SetLabel(std::string(libra::plan_mode_name(mode)) + (seq_len == 1'048'576 ? " 1M" : " 256K") +
                 " B=" + std::to_string(c.block_size));
  state.counters["mean_imbalance"] = sum_imb / kPools;
  state.counters["max_imbalance"] = max_imb;
  state.counters["pools_within_tau"] = within;
  state.counters["mean_comm_GB"] = sum_bytes / kPools / 1e9;
}
BENCHMARK(BM_PoolReport)
    ->ArgsProduct({{static_cast<int>(libra::PlanMode::kTap), static_cast<int>(libra::PlanMode::kTapSplit),
                    static_cast<int>(libra::PlanMode::kUlysses), static_cast<int>(libra::PlanMode::kTapTopo)},
                   {1'048'576, 262'144},
                   {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

}  // namespace

// The host's speed beside the plan times: one core's vector-FMA peak by CPU
// time, probed as libra_kernel_bench probes it (fma_probe.hpp) and printed
// in the context as fma_peak_cpu_gflops_t1. It follows the core clock, which
// on a shared VM wanders by a third between hours, so plan times of
// different runs compare only at like readings.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("fma_peak_cpu_gflops_t1", std::to_string(libra_bench::best_fma_peak(1).cpu_gflops));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
