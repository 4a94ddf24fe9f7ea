// plan_relays: the relay rule of libra/relay.hpp. Per chunk and node, moves
// cross-node input pairs off the node's busiest NIC onto its idlest while
// that lowers the busiest and the busiest still outweighs the chunk's
// busiest receiver; it never raises a NIC above the old maximum, so the
// node's bound only falls.
#include "libra/relay.hpp"

#include <algorithm>
#include <tuple>

namespace libra {

RelayTable::RelayTable(int workers, int chunks)
    : workers_(workers), chunks_(chunks),
      via_(static_cast<std::size_t>(chunks) * static_cast<std::size_t>(workers) * static_cast<std::size_t>(workers)) {
  // Every pair direct: entry (m, s, t) holds s.
  for (std::size_t i = 0; i < via_.size(); ++i) {
    via_[i] = static_cast<std::int32_t>(i / static_cast<std::size_t>(workers) % static_cast<std::size_t>(workers));
  }
}

void RelayTable::set(int m, int src, int dst, int v) {
  auto& slot = via_[(static_cast<std::size_t>(m) * static_cast<std::size_t>(workers_) + static_cast<std::size_t>(src)) *
                        static_cast<std::size_t>(workers_) +
                    static_cast<std::size_t>(dst)];
  relayed_pairs_ += (v != src) - (slot != src);
  slot = v;
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
  const int W = workers;
  const int M = chunks;
  const int G = std::max(1, gpus_per_node);
  RelayTable table(W, M);
  table.busiest_nic_direct.assign(static_cast<std::size_t>(M), 0);
  table.busiest_nic_relayed.assign(static_cast<std::size_t>(M), 0);
  struct Pair {
    std::int64_t bytes;
    int src, dst, via;
  };
  const auto ws = static_cast<std::size_t>(W);
  std::vector<std::int64_t> pair_bytes(ws * ws);
  for (int m = 0; m < M; ++m) {
    // Each cross-node pair's input bytes of the chunk (forward: Q + K/V),
    // and the busiest receiver's sum: a sender's NIC below it no longer
    // sets the chunk's time, so relaying further only adds stage traffic.
    std::fill(pair_bytes.begin(), pair_bytes.end(), 0);
    std::vector<std::int64_t> received(ws, 0);
    for (int s = 0; s < W; ++s) {
      for (int t = 0; t < W; ++t) {
        if (t / G == s / G) continue;
        const std::size_t pair = static_cast<std::size_t>(s) * ws + static_cast<std::size_t>(t);
        const std::int64_t bytes = chunk_in_bytes[static_cast<std::size_t>(m) * ws * ws + pair];
        pair_bytes[pair] = bytes;
        received[static_cast<std::size_t>(t)] += bytes;
      }
    }
    const std::int64_t floor = *std::max_element(received.begin(), received.end());
    for (int node0 = 0; node0 < W; node0 += G) {
      const int node1 = std::min(W, node0 + G);
      std::vector<Pair> pairs;
      std::vector<std::int64_t> load(static_cast<std::size_t>(node1 - node0), 0);
      for (int s = node0; s < node1; ++s) {
        for (int t = 0; t < W; ++t) {
          const std::int64_t bytes = pair_bytes[static_cast<std::size_t>(s) * ws + static_cast<std::size_t>(t)];
          if (bytes == 0) continue;  // inside the node, or nothing to send
          pairs.push_back({bytes, s, t, s});
          load[static_cast<std::size_t>(s - node0)] += bytes;
        }
      }
      // Largest first; ties by (src, dst): the order moves are tried in.
      std::sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
        return std::tie(b.bytes, a.src, a.dst) < std::tie(a.bytes, b.src, b.dst);
      });
      auto& direct = table.busiest_nic_direct[static_cast<std::size_t>(m)];
      direct = std::max(direct, *std::max_element(load.begin(), load.end()));
      // Each move lowers the sum of squared loads, so this ends; the bound
      // on moves only caps the time (stopping early leaves a valid, less
      // even table).
      for (std::size_t guard = 0; guard < 4 * pairs.size() + 16; ++guard) {
        const auto hi = static_cast<std::size_t>(std::max_element(load.begin(), load.end()) - load.begin());
        const auto lo = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
        if (load[hi] <= floor) break;
        const int busy = node0 + static_cast<int>(hi), idle = node0 + static_cast<int>(lo);
        Pair* pick = nullptr;
        for (Pair& p : pairs) {
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
      for (const Pair& p : pairs) {
        if (p.via != p.src) table.set(m, p.src, p.dst, p.via);
      }
      auto& relayed = table.busiest_nic_relayed[static_cast<std::size_t>(m)];
      relayed = std::max(relayed, *std::max_element(load.begin(), load.end()));
    }
  }
  return table;
}

}  // namespace libra
