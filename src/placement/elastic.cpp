// vrsp-elastic: VRSP plus fused TAP domains of at most k pools of one GA
// step, for windows whose indivisible outliers leave a pool above the mean.
// docs/elastic.md gives the rules, why the default is the static buddy rule,
// and the measured effect.
#include <algorithm>
#include <queue>
#include <utility>
#include <vector>

#include "placement/internal.hpp"

namespace libra::detail {

namespace {

__extension__ typedef __int128 Int128;

using Domains = std::vector<std::vector<std::int32_t>>;

// A pool "holds an outlier" when its load exceeds the window's mean pool
// load by more than the threshold: load * K > (1 + threshold) * sum.
bool above(std::int64_t load, std::int64_t sum, std::size_t k, double threshold) {
  return static_cast<double>(load) * static_cast<double>(k) > (1.0 + threshold) * static_cast<double>(sum);
}

Domains sorted_domains(Domains d) {
  for (auto& x : d) std::sort(x.begin(), x.end());
  std::sort(d.begin(), d.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return d;
}

// Rule kLightest: VRSP's pools untouched; per GA step, the heaviest unfused
// pool above the threshold takes the step's k-1 lightest unfused pools
// (ties: lower pool id), until no unfused pool is above the threshold.
Domains fuse_lightest(const Pools& pools, std::span<const std::int64_t> w, std::int64_t ppg, std::int64_t k,
                      double threshold, std::int64_t sum) {
  const std::vector<std::int64_t> loads = pool_loads(pools, w);
  const std::size_t n = pools.size();
  std::vector<bool> used(n, false);
  Domains out;
  for (std::size_t first = 0; first < n; first += static_cast<std::size_t>(ppg)) {
    const std::size_t last = first + static_cast<std::size_t>(ppg);
    for (;;) {
      std::size_t h = n;
      for (std::size_t q = first; q < last; ++q) {
        if (!used[q] && (h == n || loads[q] > loads[h])) h = q;
      }
      if (h == n || !above(loads[h], sum, n, threshold)) break;
      std::vector<std::size_t> light;
      for (std::size_t q = first; q < last; ++q) {
        if (!used[q] && q != h) light.push_back(q);
      }
      if (light.empty()) break;
      std::sort(light.begin(), light.end(),
                [&](std::size_t a, std::size_t b) { return loads[a] != loads[b] ? loads[a] < loads[b] : a < b; });
      light.resize(std::min(light.size(), static_cast<std::size_t>(k - 1)));
      std::vector<std::int32_t> d = {static_cast<std::int32_t>(h)};
      used[h] = true;
      for (std::size_t q : light) {
        d.push_back(static_cast<std::int32_t>(q));
        used[q] = true;
      }
      out.push_back(std::move(d));
    }
  }
  for (std::size_t q = 0; q < n; ++q) {
    if (!used[q]) out.push_back({static_cast<std::int32_t>(q)});
  }
  return sorted_domains(std::move(out));
}

// Rule kBuddy with m fused domains at the fixed buddy positions: fused
// domain j sits at GA step j / |starts|, pools [starts[j mod |starts|], +k)
// of that step (buddy_domain_starts). VRSP's greedy over domains instead of
// pools: heaviest sequence first into the non-full domain of least load per
// pool (exactly compared; ties: fused domains first, then lower pool id), a
// domain of n pools holding n*P sequences. Fused domains come first, so they
// receive the outliers, and their per-pool load keeps them from receiving
// much else. Each fused domain's sequences are then split over its pools by
// VRSP.
ElasticPlacement place_buddy(std::span<const std::int64_t> w, std::int64_t p, std::int64_t ppg, std::int64_t k,
                             std::int64_t m, const std::vector<std::int64_t>& starts) {
  const std::int64_t num_pools = static_cast<std::int64_t>(w.size()) / p;
  const auto per_step = static_cast<std::int64_t>(starts.size());
  Domains structure;
  std::vector<bool> fused(static_cast<std::size_t>(num_pools), false);
  for (std::int64_t j = 0; j < m; ++j) {
    const std::int64_t base = (j / per_step) * ppg + starts[static_cast<std::size_t>(j % per_step)];
    std::vector<std::int32_t> d;
    for (std::int64_t q = base; q < base + k; ++q) {
      d.push_back(static_cast<std::int32_t>(q));
      fused[static_cast<std::size_t>(q)] = true;
    }
    structure.push_back(std::move(d));
  }
  for (std::int64_t q = 0; q < num_pools; ++q) {
    if (!fused[static_cast<std::size_t>(q)]) structure.push_back({static_cast<std::int32_t>(q)});
  }
  struct Entry {
    std::int64_t load;
    std::int64_t pools;
    std::size_t id;  // index in `structure`
  };
  // std::priority_queue puts the "largest" on top: `later` says a comes after b.
  auto later = [](const Entry& a, const Entry& b) {
    const Int128 x = static_cast<Int128>(a.load) * b.pools;
    const Int128 y = static_cast<Int128>(b.load) * a.pools;
    return x != y ? x > y : a.id > b.id;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> heap(later);
  for (std::size_t d = 0; d < structure.size(); ++d) {
    heap.push({0, static_cast<std::int64_t>(structure[d].size()), d});
  }
  std::vector<std::vector<std::int32_t>> members(structure.size());
  for (std::int32_t i : heavy_first(w)) {
    Entry top = heap.top();
    heap.pop();
    members[top.id].push_back(i);
    if (static_cast<std::int64_t>(members[top.id].size()) < top.pools * p) {
      heap.push({top.load + w[static_cast<std::size_t>(i)], top.pools, top.id});
    }
  }
  ElasticPlacement out;
  out.pools.assign(static_cast<std::size_t>(num_pools), {});
  for (std::size_t d = 0; d < structure.size(); ++d) {
    if (structure[d].size() == 1) {
      out.pools[static_cast<std::size_t>(structure[d][0])] = members[d];
      continue;
    }
    std::vector<std::int64_t> sub;
    for (std::int32_t i : members[d]) sub.push_back(w[static_cast<std::size_t>(i)]);
    const Pools split = place_vrsp(sub, p);
    for (std::size_t q = 0; q < split.size(); ++q) {
      auto& pool = out.pools[static_cast<std::size_t>(structure[d][q])];
      for (std::int32_t local : split[q]) pool.push_back(members[d][static_cast<std::size_t>(local)]);
    }
  }
  out.domains = sorted_domains(std::move(structure));
  return out;
}

}  // namespace

ElasticPlacement place_elastic(std::span<const std::int64_t> w, const PlacementOptions& options, std::int64_t sum) {
  const std::int64_t p = options.pool_size;
  const std::int64_t dp = options.dp == 0 ? p : options.dp;
  const std::int64_t ppg = dp / p;  // pools per GA step
  const std::int64_t k = std::min(options.elastic.max_pools, ppg);
  const double threshold = options.elastic.threshold;
  ElasticPlacement vrsp{place_vrsp(w, p), {}};
  const std::vector<std::int64_t> loads = pool_loads(vrsp.pools, w);
  const std::int64_t worst = *std::max_element(loads.begin(), loads.end());
  // Nothing to fuse: exactly VRSP (domains of one are filled in by the caller).
  if (k < 2 || !above(worst, sum, loads.size(), threshold)) return vrsp;
  if (options.elastic.rule == ElasticRule::kLightest) {
    vrsp.domains = fuse_lightest(vrsp.pools, w, ppg, k, threshold, sum);
    return vrsp;
  }
  const auto num_pools = static_cast<std::int64_t>(loads.size());
  const std::vector<std::int64_t> starts = buddy_domain_starts(ppg, p, k, options.elastic.topology);
  // fused domains that fit the GA steps
  const std::int64_t capacity = (num_pools / ppg) * static_cast<std::int64_t>(starts.size());
  if (capacity == 0) return vrsp;
  std::int64_t m = 0;
  for (std::int64_t l : loads) m += above(l, sum, loads.size(), threshold) ? 1 : 0;
  ElasticPlacement buddy = place_buddy(w, p, ppg, k, std::min(m, capacity), starts);
  // Fusing only where it pays: the result must beat VRSP's worst pool.
  if (domain_imbalance(pool_loads(buddy.pools, w), buddy.domains) < imbalance_of_loads(loads)) return buddy;
  return vrsp;
}

}  // namespace libra::detail

namespace libra {

std::vector<std::int64_t> buddy_domain_starts(std::int64_t ppg, std::int64_t p, std::int64_t k,
                                              const ElasticOptions::Topology& t) {
  std::vector<std::int64_t> starts;
  if (k < 2 || p < 1 || ppg < k) return starts;
  const bool known = t.cp > 0 && t.gpus_per_node > 0 && t.nodes_per_supernode > 0;
  // (supernodes, nodes) the k pools from position q touch: their GPUs are the contiguous range
  // [q*P*cp, (q+k)*P*cp), so both counts follow from the range's ends.
  auto touched = [&](std::int64_t q) -> std::pair<std::int64_t, std::int64_t> {
    if (!known) return {0, 0};
    const std::int64_t first = q * p * t.cp, last = (q + k) * p * t.cp - 1;
    const std::int64_t sn = t.gpus_per_node * t.nodes_per_supernode;
    return {last / sn - first / sn + 1, last / t.gpus_per_node - first / t.gpus_per_node + 1};
  };
  std::pair<std::int64_t, std::int64_t> best = touched(0);
  for (std::int64_t q = 1; q + k <= ppg; ++q) best = std::min(best, touched(q));
  for (std::int64_t q = 0; q + k <= ppg;) {
    if (touched(q) == best) {
      starts.push_back(q);
      q += k;
    } else {
      ++q;
    }
  }
  return starts;
}

}  // namespace libra
