// placement/internal.hpp (private): what placement.cpp shares with the
// elastic-pool mode in elastic.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "libra/placement.hpp"

namespace libra::detail {

using Pools = std::vector<std::vector<std::int32_t>>;

// VRSP exactly as planning contract section 3.
Pools place_vrsp(std::span<const std::int64_t> w, std::int64_t p);
std::vector<std::int64_t> pool_loads(const Pools& pools, std::span<const std::int64_t> w);
// Indices by decreasing F, ties by increasing index.
std::vector<std::int32_t> heavy_first(std::span<const std::int64_t> w);

// vrsp-refine's pool pairs examined per refinement (each examined pair is
// one best_pair_swap: a scan of the heaviest pool against every other pool,
// or one heaviest/lightest pair). Each swap scans every pool, so without a
// bound the refinement is quadratic in the window (GBS 131,072 took 37 s,
// 1,048,576 did not finish). Windows up to GBS ~16K never reach it; larger
// ones keep the best placement found within it.
inline constexpr std::int64_t kMaxPairEvaluations = std::int64_t{1} << 26;

// vrsp-refine (place_window's kVrspRefine) with what each refinement cost:
// pairs[0] for the VRSP start, pairs[1] for balanced differencing when it ran.
struct RefineRun {
  Pools pools;
  std::vector<std::int64_t> pairs;
};
RefineRun place_vrsp_refine_counted(std::span<const std::int64_t> w, std::int64_t p,
                                    std::int64_t max_pairs = kMaxPairEvaluations);

// vrsp-elastic on a validated window (sum = the exact total of w): pools,
// loads and domains; place_window fills in the imbalance figures.
struct ElasticPlacement {
  Pools pools;
  std::vector<std::vector<std::int32_t>> domains;
};
ElasticPlacement place_elastic(std::span<const std::int64_t> w, const PlacementOptions& options, std::int64_t sum);

}  // namespace libra::detail
