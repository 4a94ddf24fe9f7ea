// Test-only: the plan configurations, pools and plan reads the tiles test
// files share (tiles_test.cpp, chunk_split_test.cpp).
//
//   PlanConfig c = plan_config(16, 2, 4, 1, 8, 2, 4, 2, 0.03);  // L cp B H hq hkv d e tau
//   PackedSequence s = draw_packed_sequence(16);  // inside rc::gen::exec
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <vector>

#include "libra/plan.hpp"

namespace libra::test_util {

// A tap configuration: packed length L, cp workers a slot, blocks of B rows,
// H head shards, hq/hkv heads of dimension d, e bytes an element (4: fp32,
// else bf16), load slack tau; one equal chunk, contiguous homes.
inline PlanConfig plan_config(std::int64_t L, int cp, std::int64_t B, int H, int hq, int hkv, int d, int e,
                              double tau) {
  PlanConfig c;
  c.seq_len = L;
  c.cp = cp;
  c.block_size = B;
  c.head_shards = H;
  c.shape.heads_q = hq;
  c.shape.heads_kv = hkv;
  c.shape.head_dim = d;
  c.shape.dtype = e == 4 ? DType::kF32 : DType::kBF16;
  c.tau = tau;
  return c;
}

// The worker of every tile, in tile order.
inline std::vector<int> workers_of(const Plan& p) {
  std::vector<int> w;
  for (const Tile& t : p.tiles()) w.push_back(t.worker);
  return w;
}

// A random packed sequence of 1 to L tokens in samples of random lengths;
// draws from rapidcheck, so only inside a generator (rc::gen::exec) or a
// property.
inline PackedSequence draw_packed_sequence(std::int64_t L) {
  const std::int64_t T = *rc::gen::inRange<std::int64_t>(1, L + 1);
  PackedSequence seq;
  for (std::int64_t left = T; left > 0;) {
    const std::int64_t l = *rc::gen::inRange<std::int64_t>(1, left + 1);
    seq.push_back(l);
    left -= l;
  }
  return seq;
}

}  // namespace libra::test_util
