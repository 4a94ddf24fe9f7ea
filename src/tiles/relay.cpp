// plan_relays: the relay rule of libra/relay.hpp. Per chunk and node, moves
// cross-node input pairs off the node's busiest NIC onto its idlest while
// that lowers the busiest and the busiest still outweighs the chunk's
// busiest receiver; it never raises a NIC above the old maximum, so the
// node's bound only falls.
#include "libra/relay.hpp"

#include <algorithm>
#include <tuple>

namespace libra {

RelayTable::RelayTable(int workers, int chunks) : workers_(workers), chunks_(chunks) {}

std::uint64_t RelayTable::key(int m, int src, int dst) const {
  const auto w = static_cast<std::uint64_t>(workers_);
  return (static_cast<std::uint64_t>(m) * w + static_cast<std::uint64_t>(src)) * w + static_cast<std::uint64_t>(dst);
}

int RelayTable::find(int m, int src, int dst) const {
  const std::uint64_t k = key(m, src, dst);
  const auto it = std::lower_bound(moved_.begin(), moved_.end(), k, [](const Moved& x, std::uint64_t y) { return x.at < y; });
  return it != moved_.end() && it->at == k ? it->via : src;
}

std::vector<std::int32_t> RelayTable::vias(std::span<const std::uint32_t> pairs) const {
  const std::size_t n = pairs.size();
  const auto w = static_cast<std::uint64_t>(workers_);
  std::vector<std::int32_t> out(static_cast<std::size_t>(chunks_) * n);
  for (std::size_t m = 0; m < static_cast<std::size_t>(chunks_); ++m) {
    for (std::size_t j = 0; j < n; ++j) out[m * n + j] = static_cast<std::int32_t>(pairs[j] / w);
  }
  for (const Moved& x : moved_) {
    const auto pair = static_cast<std::uint32_t>(x.at % (w * w));
    const auto it = std::lower_bound(pairs.begin(), pairs.end(), pair);
    if (it != pairs.end() && *it == pair) out[x.at / (w * w) * n + static_cast<std::size_t>(it - pairs.begin())] = x.via;
  }
  return out;
}

void RelayTable::set(int m, int src, int dst, int v) {
  const std::uint64_t k = key(m, src, dst);
  const auto it = std::lower_bound(moved_.begin(), moved_.end(), k, [](const Moved& x, std::uint64_t y) { return x.at < y; });
  const bool held = it != moved_.end() && it->at == k;
  if (v == src) {
    if (held) moved_.erase(it);
  } else if (held) {
    it->via = v;
  } else {
    moved_.insert(it, Moved{k, v});
  }
}

RelayTable plan_relays(const Plan& plan) {
  const int W = plan.num_workers();
  const int M = plan.config().chunks;
  const auto W2 = static_cast<std::size_t>(W) * static_cast<std::size_t>(W);
  std::vector<std::int64_t> in(static_cast<std::size_t>(M) * W2, 0);
  for (int m = 0; m < M; ++m) {
    for (int s = 0; s < W; ++s) {
      for (int t = 0; t < W; ++t) {
        std::int64_t& bytes = in[static_cast<std::size_t>(m) * W2 + static_cast<std::size_t>(s) * static_cast<std::size_t>(W) +
                                 static_cast<std::size_t>(t)];
        for (const Transfer& x : plan.chunk_transfers(m, s, t)) {
          if (x.kind != TransferKind::kO) bytes += x.bytes;
        }
      }
    }
  }
  return plan_relays(in, W, M, plan.config().topology.gpus_per_node);
}

RelayTable plan_relays(std::span<const std::int64_t> chunk_in_bytes, int workers, int chunks, int gpus_per_node) {
  std::vector<std::uint32_t> pairs(static_cast<std::size_t>(workers) * static_cast<std::size_t>(workers));
  for (std::size_t i = 0; i < pairs.size(); ++i) pairs[i] = static_cast<std::uint32_t>(i);
  return plan_relays(pairs, chunk_in_bytes, workers, chunks, gpus_per_node);
}

namespace {

struct RelayPair {
  std::int64_t bytes;
  int src, dst, via;
};

// The lists plan_relays reuses from node to node and chunk to chunk.
struct RelayScratch {
  std::vector<std::int64_t> received, load;
  std::vector<RelayPair> node;
};

// One node's pairs of one chunk (its workers' nonzero cross-node pairs,
// `load` their NICs' bytes, from the node's first worker node0): moves
// pairs off the busiest NIC while that helps (the rule in relay.hpp).
void balance_node(std::vector<RelayPair>& pairs, std::vector<std::int64_t>& load, int node0, std::int64_t floor) {
  // Largest first; ties by (src, dst): the order moves are tried in.
  std::sort(pairs.begin(), pairs.end(), [](const RelayPair& a, const RelayPair& b) {
    return std::tie(b.bytes, a.src, a.dst) < std::tie(a.bytes, b.src, b.dst);
  });
  // Each move lowers the sum of squared loads, so this ends; the bound on
  // moves only caps the time (stopping early leaves a valid, less even
  // table).
  for (std::size_t guard = 0; guard < 4 * pairs.size() + 16; ++guard) {
    const auto hi = static_cast<std::size_t>(std::max_element(load.begin(), load.end()) - load.begin());
    const auto lo = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    if (load[hi] <= floor) break;
    const int busy = node0 + static_cast<int>(hi), idle = node0 + static_cast<int>(lo);
    RelayPair* pick = nullptr;
    for (RelayPair& p : pairs) {
      if (p.via == busy && load[lo] + p.bytes < load[hi]) {
        pick = &p;
        break;
      }
    }
    if (pick == nullptr) break;
    load[hi] -= pick->bytes;
    load[lo] += pick->bytes;
    pick->via = idle;
  }
}

}  // namespace

RelayTable plan_relays(std::span<const std::uint32_t> pairs, std::span<const std::int64_t> chunk_in_bytes, int workers,
                       int chunks, int gpus_per_node) {
  const int W = workers;
  const int G = std::max(1, gpus_per_node);
  RelayTable table(W, chunks);
  table.busiest_nic_direct.assign(static_cast<std::size_t>(chunks), 0);
  table.busiest_nic_relayed.assign(static_cast<std::size_t>(chunks), 0);
  const auto ws = static_cast<std::size_t>(W);
  const std::size_t n = pairs.size();
  // The pairs that cross nodes (only they are relayed), with their
  // workers, found once for all chunks; by src, as the pairs are.
  struct Cross {
    std::uint32_t j;
    int src, dst;
  };
  std::vector<Cross> cross;
  cross.reserve(n);
  for (std::size_t j = 0; j < n; ++j) {
    const int s = static_cast<int>(pairs[j] / ws), t = static_cast<int>(pairs[j] % ws);
    if (s / G != t / G) cross.push_back({static_cast<std::uint32_t>(j), s, t});
  }
  thread_local RelayScratch sc;
  for (std::size_t m = 0; m < static_cast<std::size_t>(chunks); ++m) {
    const std::int64_t* in = chunk_in_bytes.data() + m * n;
    // The busiest cross-node receiver's input bytes (forward: Q + K/V): a
    // sender's NIC below it no longer sets the chunk's time, so relaying
    // further only adds stage traffic.
    sc.received.assign(ws, 0);
    for (const Cross& c : cross) sc.received[static_cast<std::size_t>(c.dst)] += in[c.j];
    const std::int64_t floor = *std::max_element(sc.received.begin(), sc.received.end());
    std::size_t i = 0;  // each node's pairs are consecutive
    for (int node0 = 0; node0 < W; node0 += G) {
      const int node1 = std::min(W, node0 + G);
      sc.node.clear();
      sc.load.assign(static_cast<std::size_t>(node1 - node0), 0);
      for (; i < cross.size() && cross[i].src < node1; ++i) {
        const Cross& c = cross[i];
        if (in[c.j] == 0) continue;  // nothing to send
        sc.node.push_back({in[c.j], c.src, c.dst, c.src});
        sc.load[static_cast<std::size_t>(c.src - node0)] += in[c.j];
      }
      auto& direct = table.busiest_nic_direct[m];
      direct = std::max(direct, *std::max_element(sc.load.begin(), sc.load.end()));
      balance_node(sc.node, sc.load, node0, floor);
      for (const RelayPair& p : sc.node) {
        if (p.via != p.src) table.set(static_cast<int>(m), p.src, p.dst, p.via);
      }
      auto& relayed = table.busiest_nic_relayed[m];
      relayed = std::max(relayed, *std::max_element(sc.load.begin(), sc.load.end()));
    }
  }
  return table;
}

}  // namespace libra
