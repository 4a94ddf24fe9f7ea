// Sequence placement speed: every mode at GBS 128, 1,024 and 16,384 with
// P = 8, on windows resampled from builtin:paper-1m's packed workloads.
// Target: vrsp at GBS 1,024 under 100 us median. Run with
//   libra_placement_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/placement.hpp"
#include "libra/splitmix64.hpp"

namespace {

// Packed workloads of a builtin 1M corpus, drawn with replacement by a
// fixed splitmix64 stream so every run times the same windows.
std::vector<std::int64_t> workloads_of(const char* source) {
  auto seqs = libra::load_packed_sequences(source, std::nullopt);
  if (!seqs.ok()) return std::vector<std::int64_t>{1};
  auto w = libra::sequence_workloads(*seqs);
  return w.ok() ? *w : std::vector<std::int64_t>{1};
}

// `outliers`: resample the earlier, outlier-heavy builtin:paper-1m-v1 instead.
std::vector<std::int64_t> window(std::size_t d, bool outliers = false) {
  static const std::vector<std::int64_t> v2 = workloads_of("builtin:paper-1m");
  static const std::vector<std::int64_t> v1 = workloads_of("builtin:paper-1m-v1");
  const std::vector<std::int64_t>& pool = outliers ? v1 : v2;
  std::uint64_t state = 0x5eed;
  std::vector<std::int64_t> out(d);
  for (auto& x : out) {
    x = pool[libra::splitmix64_next(state) % pool.size()];
  }
  return out;
}

// Times place_window on `w`; returns the imbalance of the last call.
double time_placement(benchmark::State& state, const std::vector<std::int64_t>& w, const libra::PlacementOptions& o) {
  double imbalance = 0;
  for (auto _ : state) {
    auto r = libra::place_window(w, o);
    if (!r.ok()) {
      state.SkipWithError(r.error().message().c_str());
      break;
    }
    imbalance = r->imbalance;
    benchmark::DoNotOptimize(r);
  }
  return imbalance;
}

void BM_Place(benchmark::State& state) {
  const auto mode = libra::all_placement_modes()[static_cast<std::size_t>(state.range(0))];
  const auto w = window(static_cast<std::size_t>(state.range(1)));
  const double imbalance = time_placement(state, w, {.pool_size = 8, .mode = mode, .seed = 1});
  state.SetLabel(std::string(libra::placement_mode_name(mode)));
  state.counters["R-1"] = imbalance;
  state.counters["bound_R-1"] = libra::lower_bound_imbalance(w, 8);
  state.SetItemsProcessed(state.iterations() * state.range(1));
}

void modes_and_sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t m = 0; m < static_cast<std::int64_t>(libra::all_placement_modes().size()); ++m) {
    for (std::int64_t d : {128, 1024, 16384}) b->Args({m, d});
  }
  b->ArgNames({"mode", "gbs"})->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Place)->Apply(modes_and_sizes);

// vrsp-elastic (buddy rule, k 2) with DP = GBS/8 (GA 8, two pools per GA
// step, as the paper's DP 16 at GBS 128) on windows of paper-1m-v1, whose
// outliers make it fuse; vrsp on the same windows for comparison.
void BM_PlaceElastic(benchmark::State& state) {
  const auto d = state.range(0);
  const auto w = window(static_cast<std::size_t>(d), /*outliers=*/true);
  state.counters["imbalance"] =
      time_placement(state, w, {.pool_size = 8, .mode = libra::PlacementMode::kVrspElastic, .dp = d / 8});
  state.SetItemsProcessed(state.iterations() * d);
}
BENCHMARK(BM_PlaceElastic)->Arg(128)->Arg(1024)->Arg(16384)->ArgName("gbs")->Unit(benchmark::kMicrosecond);

void BM_PlaceVrspOutliers(benchmark::State& state) {
  const auto d = state.range(0);
  state.counters["R-1"] = time_placement(state, window(static_cast<std::size_t>(d), true), {.pool_size = 8});
  state.SetItemsProcessed(state.iterations() * d);
}
BENCHMARK(BM_PlaceVrspOutliers)->Arg(128)->Arg(1024)->Arg(16384)->ArgName("gbs")->Unit(benchmark::kMicrosecond);

void BM_LowerBound(benchmark::State& state) {
  const auto w = window(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(libra::lower_bound_imbalance(w, 8));
}
BENCHMARK(BM_LowerBound)->Arg(1024)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
