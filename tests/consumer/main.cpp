// A downstream program built against an installed libra: loads a built-in
// corpus, places one window with VRSP and plans one pool with TAP.
#include <iostream>
#include <optional>
#include <span>
#include <vector>

#include "libra/libra.hpp"

int main() {
  std::vector<std::int64_t> seq = {3, 4};
  auto f = libra::workload_proxy(seq);
  if (!f.ok() || *f != 25) {
    std::cerr << "consumer: unexpected workload\n";
    return 1;
  }
  auto seqs = libra::load_packed_sequences("builtin:paper-256k", std::nullopt);
  if (!seqs.ok()) {
    std::cerr << "consumer: " << seqs.error().message() << '\n';
    return 1;
  }
  std::span<const libra::PackedSequence> window = std::span<const libra::PackedSequence>(*seqs).first(16);
  auto workloads = libra::sequence_workloads(window);
  auto placed = libra::place_window(*workloads, {.pool_size = 4});
  if (!placed.ok()) {
    std::cerr << "consumer: " << placed.error().message() << '\n';
    return 1;
  }
  std::vector<libra::PackedSequence> pool;
  for (std::int32_t i : placed->pools[0]) pool.push_back(window[static_cast<std::size_t>(i)]);
  libra::PlanConfig config;
  config.seq_len = 262'144;
  config.cp = 2;
  config.block_size = 8192;
  config.head_shards = 4;
  config.shape = {.heads_q = 32, .heads_kv = 4, .head_dim = 128, .dtype = libra::DType::kBF16};
  auto plan = libra::make_plan(pool, config);
  if (!plan.ok()) {
    std::cerr << "consumer: " << plan.error().message() << '\n';
    return 1;
  }
  std::cout << "consumer: libra::libra linked; VRSP R-1 " << placed->imbalance << ", TAP plan of "
            << plan->tiles().size() << " tiles, R-1 " << plan->imbalance() << '\n';
  return 0;
}
