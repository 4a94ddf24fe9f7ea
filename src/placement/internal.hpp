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

// vrsp-elastic on a validated window (sum = the exact total of w): pools,
// loads and domains; place_window fills in the imbalance figures.
struct ElasticPlacement {
  Pools pools;
  std::vector<std::vector<std::int32_t>> domains;
};
ElasticPlacement place_elastic(std::span<const std::int64_t> w, const PlacementOptions& options, std::int64_t sum);

}  // namespace libra::detail
