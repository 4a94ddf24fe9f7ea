// A downstream program built against an installed libra: loads a built-in
// corpus, places one window with VRSP and plans one pool with TAP.
#include <cstdint>
#include <iostream>
#include <optional>
#include <span>
#include <vector>

#include "libra/libra.hpp"

// A bf16 plan run forward on 4 in-process ranks with caller-owned
// outputs, once with fp32 tensors and once with bf16 tensors where they lie:
// both must give the same O.
bool run_small_pool() {
  libra::PlanConfig cfg;
  cfg.seq_len = 128;
  cfg.cp = 2;
  cfg.block_size = 32;
  cfg.head_shards = 2;
  cfg.chunks = 2;
  cfg.shape = {.heads_q = 4, .heads_kv = 2, .head_dim = 16, .dtype = libra::DType::kBF16};
  auto plan = libra::make_plan(std::vector<libra::PackedSequence>{{90, 20, 10}, {64, 40}}, cfg);
  if (!plan.ok()) return false;
  std::vector<libra::Status> st = libra::run_in_process(plan->num_workers(), [&](libra::Communicator& comm) -> libra::Status {
    LIBRA_ASSIGN_OR_RETURN(auto ex, libra::make_plan_executor(comm, *plan, {}));
    std::vector<float> q(ex->q_elements()), kv(ex->kv_elements()), o(ex->q_elements()), lse(ex->lse_elements());
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>((i * 37 + static_cast<std::size_t>(comm.rank())) % 17) / 17.0f;
    for (std::size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 11) % 13) / 13.0f;
    LIBRA_TRY(ex->forward_into({q, kv, kv}, {o, lse}));
    std::vector<std::uint16_t> q16(q.size()), kv16(kv.size()), o16(o.size());
    libra::store_all_from_f32(q.data(), static_cast<std::int64_t>(q.size()), libra::DType::kBF16, q16.data());
    libra::store_all_from_f32(kv.data(), static_cast<std::int64_t>(kv.size()), libra::DType::kBF16, kv16.data());
    const libra::DType bf = libra::DType::kBF16;
    LIBRA_TRY(ex->forward_into({{q16, bf}, {kv16, bf}, {kv16, bf}}, {libra::HomeOutput(o16, bf), lse}));
    for (std::size_t i = 0; i < o.size(); ++i) {
      if (libra::bf16_from_f32(o[i]) != o16[i]) return libra::internal_error("O differs between fp32 and bf16 tensors");
    }
    return libra::Status();
  });
  for (const libra::Status& s : st) {
    if (!s.ok()) {
      std::cerr << "consumer: executor: " << s.message() << '\n';
      return false;
    }
  }
  std::cout << "consumer: in-process executor ran a bf16 plan on " << st.size() << " ranks\n";
  return true;
}

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
  return run_small_pool() ? 0 : 1;
}
