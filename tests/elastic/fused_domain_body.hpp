// tests/elastic/fused_domain_body.hpp: one GA step whose outlier pool is
// fused with a buddy (vrsp-elastic), run as a training job would run it:
// every rank finds its domain from the placement, splits the world into one
// communicator per domain (k*W ranks for a fused domain), plans the domain
// as one pool of k*P slots and runs forward and backward; the results must
// equal plain attention over each whole sequence (the naive fp64 reference).
// Shared by the in-process GoogleTest program and the MPI program.
//
// The window, worked by hand: P = 1, DP = 3 (three pools in the GA step),
// CP = 2, L = 256. F: s0 = 14376, s1 = 65536 (one sample of 256), s2 = 23136;
// mean 34349.3, VRSP R-1 0.908. Buddy rule, k = 2: domain {0,1} takes s1
// and s0 (39956 per pool), pool 2 takes s2: imbalance 0.163.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "exec/harness.hpp"
#include "libra/comm.hpp"
#include "libra/executor.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"

namespace libra::elastic_test {

inline constexpr int kCp = 2;
inline constexpr std::int64_t kPoolSize = 1;
inline constexpr std::int64_t kDp = 3;
inline constexpr int kWorldSize = static_cast<int>(kDp) * kCp;

inline std::vector<PackedSequence> window() { return {{40, 30, 60, 50, 76}, {256}, {100, 100, 56}}; }

inline PlanConfig domain_config() {
  PlanConfig cfg;
  cfg.seq_len = 256;
  cfg.cp = kCp;
  cfg.block_size = 64;
  cfg.head_shards = 2;
  cfg.shape = {.heads_q = 4, .heads_kv = 2, .head_dim = 16, .dtype = DType::kF32};
  cfg.chunks = 2;
  return cfg;
}

inline Status fused_domain_case(Communicator& world) {
  if (world.size() != kWorldSize) return invalid_input(fmt::format("needs {} ranks, got {}", kWorldSize, world.size()));
  const std::vector<PackedSequence> seqs = window();
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> f, sequence_workloads(seqs));
  LIBRA_ASSIGN_OR_RETURN(WindowPlacement pl, place_window(f, {.pool_size = kPoolSize,
                                                              .mode = PlacementMode::kVrspElastic,
                                                              .dp = kDp}));
  const std::vector<std::vector<std::int32_t>> want = {{0, 1}, {2}};
  if (pl.domains != want || pl.pools != std::vector<std::vector<std::int32_t>>{{1}, {0}, {2}}) {
    return internal_error("the hand-computed placement changed: domains " + fmt::format("{}", pl.domains.size()));
  }
  LIBRA_ASSIGN_OR_RETURN(StepLayout layout, layout_window(pl, kDp));
  // World rank = replica * CP + c; replica = pool_first_replica + slot.
  const int replica = world.rank() / kCp, c = world.rank() % kCp;
  std::size_t dom = 0, pos = 0;
  std::int64_t slot = -1;
  for (std::size_t d = 0; d < pl.domains.size(); ++d) {
    for (std::size_t i = 0; i < pl.domains[d].size(); ++i) {
      const auto k = static_cast<std::size_t>(pl.domains[d][i]);
      const std::int64_t first = layout.pool_first_replica[k];
      if (replica >= first && replica < first + kPoolSize) dom = d, pos = i, slot = replica - first;
    }
  }
  if (slot < 0) return internal_error(fmt::format("rank {}: in no domain", world.rank()));
  // Worker numbering inside the domain: slot s = pos * P + slot, r = s * CP + c.
  const int worker = static_cast<int>((static_cast<std::int64_t>(pos) * kPoolSize + slot) * kCp + c);
  LIBRA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, world.split(static_cast<int>(dom), worker));
  std::vector<PackedSequence> pool;
  for (std::int32_t i : domain_slots(pl, dom)) pool.push_back(seqs[static_cast<std::size_t>(i)]);
  const PlanConfig cfg = domain_config();
  LIBRA_ASSIGN_OR_RETURN(Plan plan, make_plan(pool, cfg));
  const int expect_ranks = static_cast<int>(pl.domains[dom].size() * kPoolSize) * kCp;
  if (plan.num_workers() != expect_ranks || comm->size() != expect_ranks || comm->rank() != worker) {
    return internal_error(fmt::format("rank {}: domain {} has {} workers, {} ranks, rank {} (want {}, {})",
                                      world.rank(), dom, plan.num_workers(), comm->size(), comm->rank(),
                                      expect_ranks, worker));
  }
  if (pl.domains[dom].size() > 1) {
    // The point of fusing: the buddy pool's workers compute part of the outlier (slot 0).
    int shared = 0;
    for (const Tile& t : plan.tiles()) shared += (t.slot == 0 && t.worker >= kPoolSize * kCp) ? 1 : 0;
    if (shared == 0) return internal_error("fused domain: no tile of the outlier runs on the buddy pool");
  }
  LIBRA_ASSIGN_OR_RETURN(std::unique_ptr<Executor> ex, make_plan_executor(*comm, plan, {}));
  const std::uint64_t seed = 7;
  std::vector<float> q = harness_home_tensor(seed, cfg, worker, 0), k = harness_home_tensor(seed, cfg, worker, 1),
                     v = harness_home_tensor(seed, cfg, worker, 2), d_o = harness_home_tensor(seed, cfg, worker, 3);
  LIBRA_ASSIGN_OR_RETURN(ForwardOutputs fw, ex->forward({q, k, v}));
  LIBRA_ASSIGN_OR_RETURN(BackwardOutputs g, ex->backward({q, k, v}, fw, d_o));
  const int dslot = worker / kCp;
  LIBRA_ASSIGN_OR_RETURN(SlotReference ref,
                         harness_reference(seed, cfg, pool[static_cast<std::size_t>(dslot)], dslot));
  const std::int64_t lc = cfg.seq_len / kCp, lo = c * lc;
  const std::int64_t qw = cfg.shape.heads_q * cfg.shape.head_dim, kw = cfg.shape.heads_kv * cfg.shape.head_dim;
  const Tolerance tol = tolerance_for(cfg.shape.dtype);
  const struct {
    const char* name;
    ErrorStats e;
    double tol;
  } checks[] = {
      {"O", compare_home(fw.o, ref.o, lo, lc, qw), tol.o},
      {"LSE", compare_home(fw.lse, ref.lse, lo, lc, cfg.shape.heads_q), tol.lse},
      {"dQ", compare_home(g.dq, ref.dq, lo, lc, qw), tol.dq},
      {"dK", compare_home(g.dk, ref.dk, lo, lc, kw), tol.dk},
      {"dV", compare_home(g.dv, ref.dv, lo, lc, kw), tol.dv},
  };
  for (const auto& ch : checks) {
    if (!(ch.e.rel() <= ch.tol)) {
      return internal_error(fmt::format("fused domain {}: rank {}: {} relative error {:.3g} exceeds {:.1g}", dom,
                                        world.rank(), ch.name, ch.e.rel(), ch.tol));
    }
  }
  return Status();
}

}  // namespace libra::elastic_test
