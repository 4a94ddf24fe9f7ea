#include "libra/placement.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <string>
#include <utility>

#include "libra/checked.hpp"
#include "libra/workload.hpp"
#include "placement/internal.hpp"
#include "placement/random.hpp"

namespace libra {

namespace detail {

// Indices by decreasing F, ties by increasing index (contract section 3).
// Sorting (F, index) pairs in place keeps the comparisons cache-friendly.
std::vector<std::int32_t> heavy_first(std::span<const std::int64_t> w) {
  std::vector<std::pair<std::int64_t, std::int32_t>> keyed(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) keyed[i] = {w[i], static_cast<std::int32_t>(i)};
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::int32_t> order(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) order[i] = keyed[i].second;
  return order;
}

Pools place_vrsp(std::span<const std::int64_t> w, std::int64_t p) {
  const std::int64_t k = static_cast<std::int64_t>(w.size()) / p;
  Pools pools(static_cast<std::size_t>(k));
  for (auto& pool : pools) pool.reserve(static_cast<std::size_t>(p));
  using Entry = std::pair<std::int64_t, std::int32_t>;  // (load, pool id): lower load, then lower id
  std::vector<Entry> storage;
  storage.reserve(static_cast<std::size_t>(k));
  for (std::int32_t id = 0; id < static_cast<std::int32_t>(k); ++id) storage.emplace_back(0, id);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>{},
                                                                           std::move(storage));
  for (std::int32_t i : heavy_first(w)) {
    Entry top = heap.top();
    heap.pop();
    auto& pool = pools[static_cast<std::size_t>(top.second)];
    pool.push_back(i);
    if (static_cast<std::int64_t>(pool.size()) < p) heap.emplace(top.first + w[static_cast<std::size_t>(i)], top.second);
  }
  return pools;
}

std::vector<std::int64_t> pool_loads(const Pools& pools, std::span<const std::int64_t> w) {
  std::vector<std::int64_t> loads(pools.size(), 0);
  for (std::size_t k = 0; k < pools.size(); ++k) {
    for (std::int32_t i : pools[k]) loads[k] += w[static_cast<std::size_t>(i)];
  }
  return loads;
}

}  // namespace detail

namespace {

using detail::heavy_first;
using detail::place_vrsp;
using detail::pool_loads;

// Exact products of int64 loads with a pool count need 128 bits.
__extension__ typedef __int128 Int128;

constexpr std::array<PlacementMode, 7> kModes = {PlacementMode::kVrsp,       PlacementMode::kSampler,
                                                 PlacementMode::kRandom,     PlacementMode::kZigzag,
                                                 PlacementMode::kZigzagSwap, PlacementMode::kVrspRefine,
                                                 PlacementMode::kVrspElastic};
constexpr std::array<std::string_view, 7> kModeNames = {"vrsp",        "sampler",     "random",     "zigzag",
                                                        "zigzag-swap", "vrsp-refine", "vrsp-elastic"};
// all_placement_modes(): the whole-pool modes, kVrspElastic (last) excluded.
constexpr std::size_t kWholePoolModes = 6;
constexpr std::array<ElasticRule, 2> kRules = {ElasticRule::kBuddy, ElasticRule::kLightest};
constexpr std::array<std::string_view, 2> kRuleNames = {"buddy", "lightest"};

// A swap-based improver stops after this many swaps per sequence even when a
// further swap would help: the loop provably terminates (every swap strictly
// lowers the sum of squared loads), but the bound keeps the worst case cheap.
constexpr std::int64_t kSwapsPerSequence = 16;
using detail::Pools;

// R - 1 of `max_load` against `sum` over `k` pools, from an exact numerator so
// that two placements with the same maximum give bit-identical figures.
double excess_ratio(std::int64_t max_load, std::int64_t sum, std::int64_t k) {
  if (sum <= 0) return 0.0;
  const Int128 num = static_cast<Int128>(max_load) * k - sum;
  if (num <= 0) return 0.0;
  return static_cast<double>(num) / static_cast<double>(sum);
}

Pools make_pools(std::int64_t k, std::int64_t p) {
  Pools pools(static_cast<std::size_t>(k));
  for (auto& pool : pools) pool.reserve(static_cast<std::size_t>(p));
  return pools;
}

Pools place_consecutive(std::span<const std::int32_t> order, std::int64_t p) {
  const std::int64_t k = static_cast<std::int64_t>(order.size()) / p;
  Pools pools = make_pools(k, p);
  for (std::size_t t = 0; t < order.size(); ++t) pools[t / static_cast<std::size_t>(p)].push_back(order[t]);
  return pools;
}

Pools place_zigzag(std::span<const std::int64_t> w, std::int64_t p) {
  const std::size_t k = w.size() / static_cast<std::size_t>(p);
  Pools pools = make_pools(static_cast<std::int64_t>(k), p);
  const std::vector<std::int32_t> order = heavy_first(w);
  for (std::size_t t = 0; t < order.size(); ++t) {
    const std::size_t round = t / k;
    const std::size_t pos = t % k;
    pools[round % 2 == 0 ? pos : k - 1 - pos].push_back(order[t]);
  }
  return pools;
}

struct Swap {
  std::int64_t new_max = std::numeric_limits<std::int64_t>::max();
  std::size_t a = 0, b = 0;          // pools
  std::size_t slot_a = 0, slot_b = 0;
  bool found = false;
};

// The swap of one sequence of heavy pool `a` with one of pool `b` that
// minimises the larger of the two new loads, kept only when it is below
// `best.new_max` (strictly: the first candidate in (slot_a, slot_b) order wins
// ties, which keeps the result deterministic).
void best_pair_swap(const Pools& pools, const std::vector<std::int64_t>& loads, std::span<const std::int64_t> w,
                    std::size_t a, std::size_t b, Swap& best) {
  const std::int64_t la = loads[a];
  const std::int64_t lb = loads[b];
  if (lb >= la) return;
  // No swap brings the pair below the midpoint ceil((la + lb) / 2); skipping
  // such pools changes nothing and prunes most of the scan once a good swap
  // is known.
  if (la - (la - lb) / 2 >= best.new_max) return;
  for (std::size_t sa = 0; sa < pools[a].size(); ++sa) {
    const std::int64_t fa = w[static_cast<std::size_t>(pools[a][sa])];
    for (std::size_t sb = 0; sb < pools[b].size(); ++sb) {
      const std::int64_t delta = fa - w[static_cast<std::size_t>(pools[b][sb])];
      if (delta <= 0 || delta >= la - lb) continue;  // would not lower the pair's maximum
      const std::int64_t m = std::max(la - delta, lb + delta);
      if (m < best.new_max) best = Swap{m, a, b, sa, sb, true};
    }
  }
}

void apply_swap(Pools& pools, std::vector<std::int64_t>& loads, std::span<const std::int64_t> w, const Swap& s) {
  std::int32_t& x = pools[s.a][s.slot_a];
  std::int32_t& y = pools[s.b][s.slot_b];
  const std::int64_t delta = w[static_cast<std::size_t>(x)] - w[static_cast<std::size_t>(y)];
  loads[s.a] -= delta;
  loads[s.b] += delta;
  std::swap(x, y);
}

std::size_t argmax(const std::vector<std::int64_t>& v) {
  return static_cast<std::size_t>(std::max_element(v.begin(), v.end()) - v.begin());  // first of ties
}
std::size_t argmin(const std::vector<std::int64_t>& v) {
  return static_cast<std::size_t>(std::min_element(v.begin(), v.end()) - v.begin());
}

// Zigzag+Swap: swaps between the heaviest and the lightest pool while one
// lowers the heaviest pool's load.
void swap_heaviest_lightest(Pools& pools, std::span<const std::int64_t> w) {
  std::vector<std::int64_t> loads = pool_loads(pools, w);
  const std::int64_t limit = kSwapsPerSequence * static_cast<std::int64_t>(w.size());
  for (std::int64_t it = 0; it < limit; ++it) {
    const std::size_t h = argmax(loads);
    const std::size_t l = argmin(loads);
    Swap best;
    best.new_max = loads[h];
    best_pair_swap(pools, loads, w, h, l, best);
    if (!best.found) return;
    apply_swap(pools, loads, w, best);
  }
}

// Refinement, step 1: the best swap between the heaviest pool and any other
// pool while one lowers the heaviest pool; stops early at `floor`, a lower
// bound on the maximum load. Each swap strictly lowers the sum of squared
// loads and never raises the maximum. Returns the number of swaps made.
std::int64_t refine_max_pool(Pools& pools, std::vector<std::int64_t>& loads, std::span<const std::int64_t> w,
                             std::int64_t floor, std::int64_t budget, std::int64_t& pairs_left) {
  std::int64_t swaps = 0;
  // A scan examines pools.size() - 1 pairs: it runs only while that many are left.
  const auto scan = static_cast<std::int64_t>(pools.size()) - 1;
  for (; swaps < budget && pairs_left >= scan; ++swaps) {
    pairs_left -= scan;
    const std::size_t h = argmax(loads);
    if (loads[h] <= floor) break;
    Swap best;
    best.new_max = loads[h];
    // The lightest pool first: it usually yields a good swap at once, and
    // the midpoint test in best_pair_swap then skips most other pools. The
    // winner is the same as in plain id order except among equal maxima.
    const std::size_t l = argmin(loads);
    best_pair_swap(pools, loads, w, h, l, best);
    for (std::size_t b = 0; b < pools.size(); ++b) {
      if (b != h && b != l) best_pair_swap(pools, loads, w, h, b, best);
    }
    if (!best.found) break;
    apply_swap(pools, loads, w, best);
  }
  return swaps;
}

// Refinement, step 2: pair the pools heaviest with lightest, second
// heaviest with second lightest, and so on, and balance each pair with its
// best swap. This makes room below the maximum that step 1 can then use; it
// never raises the maximum either. Returns the number of swaps made.
std::int64_t balance_pairs(Pools& pools, std::vector<std::int64_t>& loads, std::span<const std::int64_t> w,
                           std::int64_t& pairs_left) {
  const auto pairs = static_cast<std::int64_t>(pools.size() / 2);
  if (pairs_left < pairs) return 0;
  pairs_left -= pairs;
  std::vector<std::size_t> by_load(pools.size());
  std::iota(by_load.begin(), by_load.end(), std::size_t{0});
  std::sort(by_load.begin(), by_load.end(), [&](std::size_t a, std::size_t b) {
    return loads[a] != loads[b] ? loads[a] > loads[b] : a < b;
  });
  std::int64_t swaps = 0;
  for (std::size_t i = 0, j = by_load.size() - 1; i < j; ++i, --j) {
    Swap best;
    best.new_max = loads[by_load[i]];
    best_pair_swap(pools, loads, w, by_load[i], by_load[j], best);
    if (best.found) {
      apply_swap(pools, loads, w, best);
      ++swaps;
    }
  }
  return swaps;
}

// Returns the pool pairs examined (best_pair_swap calls), at most max_pairs.
std::int64_t refine(Pools& pools, std::span<const std::int64_t> w, std::int64_t floor, std::int64_t max_pairs) {
  std::vector<std::int64_t> loads = pool_loads(pools, w);
  std::int64_t budget = kSwapsPerSequence * static_cast<std::int64_t>(w.size());
  std::int64_t pairs_left = max_pairs;
  for (;;) {
    budget -= refine_max_pool(pools, loads, w, floor, budget, pairs_left);
    if (budget <= 0 || *std::max_element(loads.begin(), loads.end()) <= floor) break;
    const std::int64_t moved = balance_pairs(pools, loads, w, pairs_left);
    budget -= moved;
    if (moved == 0 || budget <= 0) break;
  }
  return max_pairs - pairs_left;
}

// Balanced largest differencing (Karmarkar-Karp with exact cardinality):
// the sequences, heaviest first, form P rows of K; each row is a partial
// solution of K one-sequence subsets. Repeatedly merge the two partial
// solutions with the largest spread (max - min), pairing the heaviest subset of
// one with the lightest of the other, so every final subset takes exactly one
// sequence from each row: P sequences per pool.
Pools place_balanced_differencing(std::span<const std::int64_t> w, std::int64_t p) {
  const std::size_t k = w.size() / static_cast<std::size_t>(p);
  const std::vector<std::int32_t> order = heavy_first(w);
  struct Subset {
    std::int64_t load;
    std::vector<std::int32_t> items;
  };
  struct Partial {
    std::vector<Subset> subsets;  // sorted by decreasing load, ties by first item
    std::int64_t spread() const { return subsets.front().load - subsets.back().load; }
    std::int32_t key() const { return subsets.front().items.front(); }
  };
  auto sort_subsets = [](std::vector<Subset>& s) {
    std::sort(s.begin(), s.end(), [](const Subset& a, const Subset& b) {
      return a.load != b.load ? a.load > b.load : a.items.front() < b.items.front();
    });
  };
  std::vector<Partial> partials;
  for (std::size_t r = 0; r < static_cast<std::size_t>(p); ++r) {
    Partial part;
    for (std::size_t c = 0; c < k; ++c) {
      const std::int32_t i = order[r * k + c];
      part.subsets.push_back(Subset{w[static_cast<std::size_t>(i)], {i}});
    }
    sort_subsets(part.subsets);
    partials.push_back(std::move(part));
  }
  // Larger spread first; ties by the smaller first item, so the order is total.
  auto before = [](const Partial& a, const Partial& b) {
    return a.spread() != b.spread() ? a.spread() > b.spread() : a.key() < b.key();
  };
  while (partials.size() > 1) {
    std::sort(partials.begin(), partials.end(), before);
    Partial x = std::move(partials[0]);
    Partial y = std::move(partials[1]);
    partials.erase(partials.begin(), partials.begin() + 2);
    Partial merged;
    for (std::size_t c = 0; c < k; ++c) {
      Subset& hi = x.subsets[c];
      Subset& lo = y.subsets[k - 1 - c];
      Subset s{hi.load + lo.load, std::move(hi.items)};
      s.items.insert(s.items.end(), lo.items.begin(), lo.items.end());
      merged.subsets.push_back(std::move(s));
    }
    sort_subsets(merged.subsets);
    partials.push_back(std::move(merged));
  }
  Pools pools;
  for (auto& s : partials.front().subsets) {
    // Slot order: heaviest sequence first, as VRSP lists its pools.
    std::sort(s.items.begin(), s.items.end(), [&](std::int32_t a, std::int32_t b) {
      return w[static_cast<std::size_t>(a)] != w[static_cast<std::size_t>(b)]
                 ? w[static_cast<std::size_t>(a)] > w[static_cast<std::size_t>(b)]
                 : a < b;
    });
    pools.push_back(std::move(s.items));
  }
  return pools;
}

std::int64_t max_load(const Pools& pools, std::span<const std::int64_t> w) {
  const auto loads = pool_loads(pools, w);
  return *std::max_element(loads.begin(), loads.end());
}

// The largest lower bound on the maximum pool load (see imbalance_lower_bound).
std::int64_t max_load_floor(std::span<const std::int64_t> workloads, std::int64_t pool_size);

}  // namespace

namespace detail {

RefineRun place_vrsp_refine_counted(std::span<const std::int64_t> w, std::int64_t p, std::int64_t max_pairs) {
  const std::int64_t floor = max_load_floor(w, p);
  RefineRun run;
  run.pools = place_vrsp(w, p);
  run.pairs.push_back(refine(run.pools, w, floor, max_pairs));
  const std::int64_t best_max = max_load(run.pools, w);
  if (best_max <= floor) return run;
  Pools alt = place_balanced_differencing(w, p);
  run.pairs.push_back(refine(alt, w, floor, max_pairs));
  // Strictly better only, so ties keep the VRSP-based answer.
  if (max_load(alt, w) < best_max) run.pools = std::move(alt);
  return run;
}

}  // namespace detail

namespace {

Status validate(std::span<const std::int64_t> w, const PlacementOptions& options, std::int64_t& sum) {
  const std::int64_t p = options.pool_size;
  if (p < 1) return invalid_input("pool size " + std::to_string(p) + ": must be at least 1");
  if (w.empty()) return invalid_input("placement window: empty (gbs must be at least 1)");
  if (w.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
    return invalid_input("placement window: " + std::to_string(w.size()) +
                         " sequences exceeds the limit of 2147483647");
  }
  const auto d = static_cast<std::int64_t>(w.size());
  if (d % p != 0) {
    return invalid_input("pool size " + std::to_string(p) + ": must divide the window size (gbs) " +
                         std::to_string(d));
  }
  sum = 0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (w[i] < 0) {
      return invalid_input("placement window: sequence " + std::to_string(i) + " has negative workload " +
                           std::to_string(w[i]));
    }
    auto s = checked_add(sum, w[i]);
    if (!s) return invalid_input("placement window: sum of workloads exceeds the 64-bit range");
    sum = *s;
  }
  if (sum == 0) return invalid_input("placement window: every workload is zero; imbalance is undefined");
  return {};
}

}  // namespace

Result<PlacementMode> parse_placement_mode(std::string_view name) {
  for (std::size_t m = 0; m < kModes.size(); ++m) {
    if (kModeNames[m] == name) return kModes[m];
  }
  std::string known;
  for (std::string_view n : kModeNames) known += (known.empty() ? "" : ", ") + std::string(n);
  return invalid_input("placement mode '" + std::string(name) + "': unknown; expected one of " + known);
}

std::string_view placement_mode_name(PlacementMode mode) {
  for (std::size_t m = 0; m < kModes.size(); ++m) {
    if (kModes[m] == mode) return kModeNames[m];
  }
  return "unknown";
}

std::span<const PlacementMode> all_placement_modes() { return std::span<const PlacementMode>(kModes).first(kWholePoolModes); }

Result<ElasticRule> parse_elastic_rule(std::string_view name) {
  for (std::size_t r = 0; r < kRules.size(); ++r) {
    if (kRuleNames[r] == name) return kRules[r];
  }
  return invalid_input("elastic rule '" + std::string(name) + "': unknown; expected buddy or lightest");
}

std::string_view elastic_rule_name(ElasticRule rule) {
  for (std::size_t r = 0; r < kRules.size(); ++r) {
    if (kRules[r] == rule) return kRuleNames[r];
  }
  return "unknown";
}

std::vector<std::int32_t> domain_slots(const WindowPlacement& placement, std::size_t d) {
  std::vector<std::int32_t> out;
  for (std::int32_t k : placement.domains.at(d)) {
    const auto& pool = placement.pools.at(static_cast<std::size_t>(k));
    out.insert(out.end(), pool.begin(), pool.end());
  }
  return out;
}

double domain_imbalance(std::span<const std::int64_t> loads, const std::vector<std::vector<std::int32_t>>& domains) {
  Int128 sum = 0;
  for (std::int64_t l : loads) sum += l;
  if (sum <= 0 || domains.empty()) return 0.0;
  // The domain of largest load per pool, compared exactly: a/n > b/m iff a*m > b*n.
  Int128 best_load = -1;
  Int128 best_n = 1;
  for (const auto& d : domains) {
    Int128 load = 0;
    for (std::int32_t k : d) load += loads[static_cast<std::size_t>(k)];
    const auto n = static_cast<Int128>(d.size());
    if (n > 0 && load * best_n > best_load * n) {
      best_load = load;
      best_n = n;
    }
  }
  const auto k = static_cast<Int128>(loads.size());
  const Int128 num = best_load * k - best_n * sum;  // (max/|d|) / (sum/K) - 1, over best_n * sum
  if (num <= 0) return 0.0;
  return static_cast<double>(num) / (static_cast<double>(best_n) * static_cast<double>(sum));
}

std::vector<std::int32_t> node_interleaved_slots(std::span<const std::int64_t> workloads, const NodeInterleave& where) {
  const auto P = static_cast<std::int64_t>(workloads.size());
  std::vector<std::int32_t> order(workloads.size());
  std::iota(order.begin(), order.end(), 0);
  if (where.cp <= 0 || where.gpus_per_node <= 0 || where.gpus_per_node % where.cp != 0) return order;
  const std::int64_t per_node = where.gpus_per_node / where.cp;
  const std::int64_t nodes = (P + per_node - 1) / per_node;
  if (per_node < 2 || nodes < 2) return order;
  const std::vector<std::int32_t> heavy = heavy_first(workloads);
  std::vector<std::int64_t> filled(static_cast<std::size_t>(nodes), 0);
  std::size_t next = 0;
  for (std::int64_t round = 0; next < heavy.size(); ++round) {
    for (std::int64_t i = 0; i < nodes && next < heavy.size(); ++i) {
      const std::int64_t n = round % 2 == 0 ? i : nodes - 1 - i;
      const std::int64_t slot = n * per_node + filled[static_cast<std::size_t>(n)];
      if (filled[static_cast<std::size_t>(n)] == per_node || slot >= P) continue;
      ++filled[static_cast<std::size_t>(n)];
      order[static_cast<std::size_t>(slot)] = heavy[next++];
    }
  }
  return order;
}

namespace {

Status check_interleave(const PlacementOptions& options) {
  if (options.interleave.cp < 0 || options.interleave.gpus_per_node < 0) {
    return invalid_input("slot interleave: cp " + std::to_string(options.interleave.cp) + ", gpus per node " +
                         std::to_string(options.interleave.gpus_per_node) + ": must be >= 0 (0: off)");
  }
  if (options.mode == PlacementMode::kVrspElastic && options.interleave.cp > 0 && options.interleave.gpus_per_node > 0) {
    return invalid_input("slot interleave: not with mode vrsp-elastic (its domains fix their slot order)");
  }
  return Status();
}

Status check_elastic(const PlacementOptions& options, std::size_t window) {
  const std::int64_t p = options.pool_size;
  if (options.elastic.max_pools < 1) {
    return invalid_input("elastic pools: at most " + std::to_string(options.elastic.max_pools) +
                         " pools per domain; must be at least 1");
  }
  if (!(options.elastic.threshold >= 0) || !std::isfinite(options.elastic.threshold)) {
    return invalid_input("elastic pools: threshold " + std::to_string(options.elastic.threshold) +
                         ": must be a finite number >= 0");
  }
  const ElasticOptions::Topology& t = options.elastic.topology;
  if (t.cp < 0 || t.gpus_per_node < 0 || t.nodes_per_supernode < 0) {
    return invalid_input("elastic pools: topology cp " + std::to_string(t.cp) + ", gpus per node " +
                         std::to_string(t.gpus_per_node) + ", nodes per supernode " +
                         std::to_string(t.nodes_per_supernode) + ": must be >= 0 (0: unknown)");
  }
  const std::int64_t dp = options.dp == 0 ? p : options.dp;
  if (dp < 1 || dp % p != 0 || static_cast<std::int64_t>(window) % dp != 0) {
    return invalid_input("elastic pools: dp " + std::to_string(dp) + ": must be a multiple of the pool size " +
                         std::to_string(p) + " that divides the window size " + std::to_string(window));
  }
  return Status();
}

// The window's pools by the mode, and the elastic mode's domains (empty:
// one per pool).
struct ModePlacement {
  Pools pools;
  std::vector<std::vector<std::int32_t>> domains;
};

// Loader order 0 .. D-1, shuffled by `seed` when asked, in consecutive pools.
Pools consecutive_pools(std::size_t window, std::int64_t p, const std::uint64_t* seed) {
  std::vector<std::int32_t> order(window);
  std::iota(order.begin(), order.end(), 0);
  if (seed != nullptr) detail::shuffle(std::span<std::int32_t>(order), *seed);
  return place_consecutive(order, p);
}

Result<ModePlacement> place_by_mode(std::span<const std::int64_t> workloads, const PlacementOptions& options,
                                    std::int64_t sum) {
  const std::int64_t p = options.pool_size;
  ModePlacement out;
  switch (options.mode) {
    case PlacementMode::kVrsp: out.pools = place_vrsp(workloads, p); break;
    case PlacementMode::kSampler: out.pools = consecutive_pools(workloads.size(), p, nullptr); break;
    case PlacementMode::kRandom: out.pools = consecutive_pools(workloads.size(), p, &options.seed); break;
    case PlacementMode::kZigzag: out.pools = place_zigzag(workloads, p); break;
    case PlacementMode::kZigzagSwap:
      out.pools = place_zigzag(workloads, p);
      swap_heaviest_lightest(out.pools, workloads);
      break;
    case PlacementMode::kVrspRefine: out.pools = detail::place_vrsp_refine_counted(workloads, p).pools; break;
    case PlacementMode::kVrspElastic: {
      LIBRA_TRY(check_elastic(options, workloads.size()));
      auto e = detail::place_elastic(workloads, options, sum);
      out.pools = std::move(e.pools);
      out.domains = std::move(e.domains);
      break;
    }
  }
  if (out.pools.empty()) return internal_error("placement: unknown mode");
  return out;
}

// Every pool's slots in node_interleaved_slots order.
void interleave_slots(Pools& pools, std::span<const std::int64_t> workloads, const NodeInterleave& interleave) {
  std::vector<std::int64_t> w(pools.empty() ? 0 : pools.front().size());
  for (auto& pool : pools) {
    for (std::size_t s = 0; s < pool.size(); ++s) w[s] = workloads[static_cast<std::size_t>(pool[s])];
    const std::vector<std::int32_t> order = node_interleaved_slots(w, interleave);
    std::vector<std::int32_t> moved(pool.size());
    for (std::size_t s = 0; s < pool.size(); ++s) moved[s] = pool[static_cast<std::size_t>(order[s])];
    pool = std::move(moved);
  }
}

// The placement with its loads and imbalances (over pools, and over
// domains where the mode fused some).
WindowPlacement window_placement(ModePlacement placed, std::span<const std::int64_t> workloads, std::int64_t sum) {
  WindowPlacement out;
  out.loads = pool_loads(placed.pools, workloads);
  out.pools = std::move(placed.pools);
  out.pool_imbalance = excess_ratio(*std::max_element(out.loads.begin(), out.loads.end()), sum,
                                    static_cast<std::int64_t>(out.loads.size()));
  std::vector<std::vector<std::int32_t>>& domains = placed.domains;
  if (domains.empty()) {
    for (std::size_t k = 0; k < out.pools.size(); ++k) domains.push_back({static_cast<std::int32_t>(k)});
    out.imbalance = out.pool_imbalance;
  } else {
    out.imbalance = domain_imbalance(out.loads, domains);
  }
  out.domains = std::move(domains);
  return out;
}

}  // namespace

Result<WindowPlacement> place_window(std::span<const std::int64_t> workloads, const PlacementOptions& options) {
  std::int64_t sum = 0;
  LIBRA_TRY(validate(workloads, options, sum));
  LIBRA_TRY(check_interleave(options));
  LIBRA_ASSIGN_OR_RETURN(ModePlacement placed, place_by_mode(workloads, options, sum));
  if (options.interleave.cp > 0 && options.interleave.gpus_per_node > 0) {
    interleave_slots(placed.pools, workloads, options.interleave);
  }
  return window_placement(std::move(placed), workloads, sum);
}

double imbalance_of_loads(std::span<const std::int64_t> loads) {
  if (loads.empty()) return 0.0;
  Int128 sum = 0;
  for (std::int64_t l : loads) sum += l;
  if (sum <= 0 || sum > std::numeric_limits<std::int64_t>::max()) {
    // Only reachable with loads the planner never produces; fall back to doubles.
    double s = 0;
    for (std::int64_t l : loads) s += static_cast<double>(l);
    if (s <= 0) return 0.0;
    const double mx = static_cast<double>(*std::max_element(loads.begin(), loads.end()));
    return std::max(0.0, mx * static_cast<double>(loads.size()) / s - 1.0);
  }
  return excess_ratio(*std::max_element(loads.begin(), loads.end()), static_cast<std::int64_t>(sum),
                      static_cast<std::int64_t>(loads.size()));
}

double imbalance_lower_bound(std::span<const std::int64_t> workloads, std::int64_t pool_size) {
  return 1.0 + lower_bound_imbalance(workloads, pool_size);
}

double lower_bound_imbalance(std::span<const std::int64_t> workloads, std::int64_t pool_size) {
  std::int64_t sum = 0;
  if (!validate(workloads, {.pool_size = pool_size}, sum).ok()) return 0.0;
  return excess_ratio(max_load_floor(workloads, pool_size), sum,
                      static_cast<std::int64_t>(workloads.size()) / pool_size);
}

namespace {
std::int64_t max_load_floor(std::span<const std::int64_t> workloads, std::int64_t pool_size) {
  std::vector<std::int64_t> f(workloads.begin(), workloads.end());
  std::sort(f.begin(), f.end(), std::greater<>());
  const std::size_t d = f.size();
  const auto p = static_cast<std::size_t>(pool_size);
  const std::size_t k = d / p;
  // prefix[i] = sum of the i heaviest; every partial sum fits since the total does.
  std::vector<std::int64_t> prefix(d + 1, 0);
  for (std::size_t i = 0; i < d; ++i) prefix[i + 1] = prefix[i] + f[i];
  std::int64_t best = 0;
  for (std::size_t j = 0; j < p; ++j) {
    // Some pool holds j+1 of the j*K+1 heaviest; at least the j+1 lightest
    // of them (ranks jK-j .. jK), plus the P-j-1 lightest sequences overall
    // (ranks beyond jK, so disjoint from those).
    const std::size_t lo = j * k - j;
    const std::int64_t top = prefix[j * k + 1] - prefix[lo];
    const std::int64_t bottom = prefix[d] - prefix[d - (p - j - 1)];
    best = std::max(best, top + bottom);
  }
  // The t heaviest sequences either share a pool, which then holds at least
  // the two lightest of them plus the P-2 lightest overall, or sit in t
  // distinct pools, whose mean load is at least (their sum plus the t(P-1)
  // lightest sequences) / t. Whichever happens, the maximum is at least the
  // smaller of the two.
  const auto kk = static_cast<std::int64_t>(k);
  auto ceil_div = [](std::int64_t a, std::int64_t b) { return a / b + (a % b != 0 ? 1 : 0); };
  for (std::size_t t = 1; t <= k; ++t) {
    const std::int64_t apart =
        ceil_div(prefix[t] + (prefix[d] - prefix[d - t * (p - 1)]), static_cast<std::int64_t>(t));
    std::int64_t bound = apart;
    if (t >= 2 && p >= 2) {
      const std::int64_t shared = f[t - 2] + f[t - 1] + (prefix[d] - prefix[d - (p - 2)]);
      bound = std::min(bound, shared);
    }
    best = std::max(best, bound);
  }
  // The mean load (rounded up, loads being integers) bounds the maximum too.
  best = std::max(best, ceil_div(prefix[d], kk));
  return best;
}
}  // namespace

double lln_prediction(double cv, std::int64_t pool_size, std::int64_t num_pools) {
  if (pool_size < 1 || num_pools <= 1 || cv <= 0) return 1.0;
  return 1.0 + cv / std::sqrt(static_cast<double>(pool_size)) * std::sqrt(2.0 * std::log(static_cast<double>(num_pools)));
}

Result<StepLayout> layout_window(const WindowPlacement& placement, std::int64_t dp) {
  if (placement.pools.empty() || placement.pools.front().empty()) {
    return invalid_input("layout: the placement has no pools");
  }
  const auto k = static_cast<std::int64_t>(placement.pools.size());
  const auto p = static_cast<std::int64_t>(placement.pools.front().size());
  for (const auto& pool : placement.pools) {
    if (static_cast<std::int64_t>(pool.size()) != p) return invalid_input("layout: pools differ in size");
  }
  const std::int64_t d = k * p;
  if (dp < 1) return invalid_input("--dp " + std::to_string(dp) + ": must be at least 1");
  if (dp % p != 0) {
    return invalid_input("--pool-size " + std::to_string(p) + ": must divide --dp " + std::to_string(dp));
  }
  if (d % dp != 0) {
    return invalid_input("--dp " + std::to_string(dp) + ": must divide --gbs " + std::to_string(d));
  }
  StepLayout out;
  out.dp = dp;
  out.pool_size = p;
  out.ga_steps = d / dp;
  out.pools_per_ga = dp / p;
  out.order.assign(static_cast<std::size_t>(d), -1);
  for (std::int64_t pool = 0; pool < k; ++pool) {
    const std::int64_t ga = pool / out.pools_per_ga;
    const std::int64_t first = (pool % out.pools_per_ga) * p;
    out.pool_ga.push_back(ga);
    out.pool_first_replica.push_back(first);
    for (std::int64_t slot = 0; slot < p; ++slot) {
      out.order[static_cast<std::size_t>(ga * dp + first + slot)] =
          placement.pools[static_cast<std::size_t>(pool)][static_cast<std::size_t>(slot)];
    }
  }
  return out;
}

Result<std::vector<std::int64_t>> sequence_workloads(std::span<const PackedSequence> sequences) {
  std::vector<std::int64_t> out;
  out.reserve(sequences.size());
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    auto f = workload_proxy(sequences[i]);
    if (!f.ok()) return invalid_input("packed sequence " + std::to_string(i) + ": " + f.error().message());
    out.push_back(*f);
  }
  return out;
}

}  // namespace libra
