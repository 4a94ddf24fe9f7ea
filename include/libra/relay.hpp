// libra/relay.hpp: which node-mate carries each cross-node input message.
//
// Defines `libra::RelayTable` and `libra::plan_relays`, a pure function of a
// Plan (its exchange and PlanConfig::topology). A worker whose inputs for
// other nodes outweigh its node-mates' leaves its NIC the bound of the first
// dispatch while theirs idle (docs/simulator.md, "where a relay would pay").
// A relay moves a (chunk, src, dst) input message over NVLink to a
// node-mate v of src first (the stage exchange), and v sends it across
// nodes in the chunk's main exchange. Only In phases are relayed (forward:
// Q, K, V; backward: Q, dO, O, LSE, K, V); the returns go straight home.
//
//   libra::RelayTable r = libra::plan_relays(plan);
//   int via = r.via(/*chunk=*/0, /*src=*/3, /*dst=*/17);   // 3: sent directly
//   libra::ScheduleOptions o; o.relay = true;               // schedules carry it out
//
// The rule, per chunk and per node, deterministic tile for tile: every
// cross-node (src, dst) pair starts on src's own NIC, loaded with the pair's
// forward bytes (Q + K/V of the chunk). While the most loaded NIC of the
// node (lowest worker on ties) carries more than the chunk's busiest
// cross-node receiver takes (below that the receiver sets the chunk's time)
// and some pair on it can move to the least loaded one (lowest worker on
// ties) leaving both below the old maximum, the largest such pair moves
// (ties: lower src, then lower dst). Pairs inside a node are never relayed.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "libra/plan.hpp"

namespace libra {

class RelayTable {
 public:
  RelayTable() = default;
  RelayTable(int workers, int chunks);
  int workers() const { return workers_; }
  int chunks() const { return chunks_; }
  // The worker that sends src's chunk-m inputs for dst in the main exchange:
  // src itself unless relayed.
  int via(int m, int src, int dst) const { return moved_.empty() ? src : find(m, src, dst); }
  bool relayed(int m, int src, int dst) const { return via(m, src, dst) != src; }
  // Whether any pair of any chunk is relayed; a table without relays runs
  // exactly like no table (no stage exchange is posted).
  bool any() const { return !moved_.empty(); }
  std::int64_t relayed_pairs() const { return static_cast<std::int64_t>(moved_.size()); }
  void set(int m, int src, int dst, int via);
  // via() of every chunk m and pair j of `pairs` (src * workers + dst,
  // increasing) at [m * pairs.size() + j]: one look-up per relayed pair
  // instead of a search per pair.
  std::vector<std::int32_t> vias(std::span<const std::uint32_t> pairs) const;
  // Per chunk: the busiest NIC's cross-node input bytes (forward) over all
  // nodes, sent directly and relayed (plan_relays fills them).
  std::vector<std::int64_t> busiest_nic_direct, busiest_nic_relayed;

 private:
  int workers_ = 0, chunks_ = 0;
  // The relayed entries only, by (chunk * W + src) * W + dst: most pairs
  // are direct, and most tables relay nothing, so a dense M x W x W table
  // would be mostly filled to say so.
  struct Moved {
    std::uint64_t at;
    std::int32_t via;
  };
  std::vector<Moved> moved_;
  std::uint64_t key(int m, int src, int dst) const;
  int find(int m, int src, int dst) const;
};

[[nodiscard]] RelayTable plan_relays(const Plan& plan);
// The same from each chunk's forward input bytes (Q + K/V) of every pair,
// [(m * workers + src) * workers + dst] (what plan_relays(plan) sums from
// Plan::chunk_transfers), on nodes of `gpus_per_node`.
[[nodiscard]] RelayTable plan_relays(std::span<const std::int64_t> chunk_in_bytes, int workers, int chunks,
                                     int gpus_per_node);
// The same over the pairs that carry anything: `pairs` (src * workers +
// dst, increasing) and chunk m's bytes of pair j at [m * pairs.size() + j];
// every other pair's are zero.
[[nodiscard]] RelayTable plan_relays(std::span<const std::uint32_t> pairs, std::span<const std::int64_t> chunk_in_bytes,
                                     int workers, int chunks, int gpus_per_node);

}  // namespace libra
