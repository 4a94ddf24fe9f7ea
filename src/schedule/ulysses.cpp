// The Ulysses baseline as a schedule, written from its definition (no
// plan): inside each slot's CP group every rank receives all L rows of its
// h_q/CP query heads and the KV heads they use (the head scatter), computes
// whole samples, and sends the outputs back (the gather). The steps, in
// order: the checks, the header and fingerprint, the split of the slot's
// samples, the region, the inputs, the outputs, the kernel calls.
#include <fmt/format.h>

#include <algorithm>

#include "libra/schedule.hpp"
#include "schedule/builder.hpp"

namespace libra {

namespace {

using namespace schedule_detail;

// The rules the direct schedule adds to validate_plan_config's.
Status check_ulysses(std::span<const PackedSequence> pool, const PlanConfig& config, int worker) {
  const int cp = config.cp, hq = config.shape.heads_q, hkv = config.shape.heads_kv;
  const int W = static_cast<int>(pool.size()) * cp;
  if (worker < 0 || worker >= W) {
    return invalid_input(fmt::format("ulysses: worker {} outside the pool's {} slots x CP {} = {} workers", worker,
                                     pool.size(), cp, W));
  }
  if (hq % cp != 0) return invalid_input(fmt::format("ulysses: --cp {} must divide --heads-q {}", cp, hq));
  if (hkv % cp != 0 && cp % hkv != 0) {
    return invalid_input(fmt::format("ulysses: --heads-kv {} and --cp {} must divide one another", hkv, cp));
  }
  for (std::size_t p = 0; p < pool.size(); ++p) {
    std::int64_t total = 0;
    for (std::int64_t l : pool[p]) {
      if (l <= 0) return invalid_input(fmt::format("ulysses: slot {} has a sample of length {}", p, l));
      total += l;
    }
    if (total > config.seq_len) {
      return invalid_input(fmt::format("ulysses: slot {} holds {} tokens, more than --seq-len {}", p, total, config.seq_len));
    }
  }
  return Status();
}

// What every rank must agree on: the pool and the configuration.
std::uint64_t ulysses_fingerprint(std::span<const PackedSequence> pool, const PlanConfig& config) {
  std::uint64_t fp = mix64(0x756c7973736573ULL, static_cast<std::uint64_t>(config.seq_len));
  for (std::int64_t v : {std::int64_t{config.cp}, std::int64_t{config.shape.heads_q}, std::int64_t{config.shape.heads_kv},
                         std::int64_t{config.shape.head_dim}, static_cast<std::int64_t>(dtype_code(config.shape.dtype)),
                         config.shape.window}) {
    fp = mix64(fp, static_cast<std::uint64_t>(v));
  }
  for (const auto& seq : pool) {
    fp = mix64(fp, seq.size());
    for (std::int64_t l : seq) fp = mix64(fp, static_cast<std::uint64_t>(l));
  }
  return fp;
}

// This rank's place in its slot's CP group: its rank `me` and home rows
// [lo, hi) (lc = L/CP rows a rank), and the head group of every rank:
// rank r computes query heads [r nq, (r + 1) nq) and the KV heads they use.
struct UlyssesRank {
  int worker = 0, me = 0, base = 0, cp = 0;  // base: the group's first worker
  std::int32_t slot = 0;
  std::int64_t lc = 0, lo = 0, hi = 0;
  int nq = 0, grp = 0;  // query heads a rank; query heads a KV head

  HeadRange q_heads(int r) const { return HeadRange{r * nq, (r + 1) * nq}; }
  HeadRange kv_heads(int r) const { return HeadRange{r * nq / grp, ((r + 1) * nq - 1) / grp + 1}; }
  Rect rows(std::int64_t t0, std::int64_t t1, HeadRange h) const { return {slot, t0, t1, h.begin, h.end}; }
  // Rank `peer`'s home rows.
  Rect peer_rows(int peer, HeadRange h) const { return rows(peer * lc, (peer + 1) * lc, h); }
  Rect my_rows(HeadRange h) const { return rows(lo, hi, h); }
};

UlyssesRank ulysses_rank(const RankSchedule& s) {
  UlyssesRank u;
  u.worker = s.worker;
  u.cp = s.cp;
  u.me = s.worker % s.cp;
  u.base = s.slot * s.cp;
  u.slot = s.slot;
  u.lc = s.home_rows;
  u.lo = u.me * u.lc;
  u.hi = u.lo + u.lc;
  u.nq = s.heads_q / s.cp;
  u.grp = s.heads_q / s.heads_kv;
  return u;
}

// Samples inside my home shard are computed at home (ScheduleOptions); the
// compute region then holds every other row: the peers' shards, and of
// mine only the parts of samples that cross into a peer's shard (`mine`).
// Fragment rows are packed rows until the region exists.
struct SampleSplit {
  std::vector<CallFragment> at_home, in_compute;
  RowRanges mine;  // my shard's rows in the region
};

SampleSplit split_samples(const PackedSequence& seq, const UlyssesRank& u, bool in_place) {
  SampleSplit out;
  std::int64_t start = 0;
  for (std::int64_t len : seq) {
    if (in_place && start >= u.lo && start + len <= u.hi) {
      out.at_home.push_back({start - u.lo, start - u.lo, len, 0, len});
    } else {
      out.in_compute.push_back({start, start, len, 0, len});
      if (in_place && start < u.hi && start + len > u.lo) {
        out.mine.emplace_back(std::max(start, u.lo), std::min(start + len, u.hi));
      }
    }
    start += len;
  }
  if (!in_place) out.mine = {{u.lo, u.hi}};
  return out;
}

// The one region: my shard's rows in it and every peer's, my head group.
Region ulysses_region(const UlyssesRank& u, const RowRanges& mine, std::int64_t seq_len) {
  RowRanges rows = mine;
  rows.emplace_back(0, u.lo);
  rows.emplace_back(u.hi, seq_len);
  Region whole;
  whole.slot = u.slot;
  whole.q_heads = u.q_heads(u.me);
  whole.kv_heads = u.kv_heads(u.me);
  whole.q_rows = pack_runs(rows, whole.q_row_count);
  whole.kv_rows = pack_runs(rows, whole.kv_row_count);
  return whole;
}

// Head scatter, both passes: my rows of the peer's heads go to the peer;
// its rows of my heads come here; my own rows of my heads in the region
// through the message to self.
void add_inputs(Builder& b, const UlyssesRank& u, const RowRanges& mine, const Region* r) {
  const Route self{u.worker, u.worker};
  for (int peer = 0; peer < u.cp; ++peer) {
    const int w = u.base + peer;
    for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) {
      if (w == u.worker) {
        for (auto [t0, t1] : mine) {
          b.item(p, 0, self, false, u.rows(t0, t1, u.q_heads(u.me)), {nullptr, r});
          b.item(p, 0, self, true, u.rows(t0, t1, u.kv_heads(u.me)), {nullptr, r});
        }
        continue;
      }
      b.item(p, 0, {u.worker, w}, false, u.my_rows(u.q_heads(peer)), {});
      b.item(p, 0, {u.worker, w}, true, u.my_rows(u.kv_heads(peer)), {});
      b.item(p, 0, {w, u.worker}, false, u.peer_rows(peer, u.q_heads(u.me)), {nullptr, r});
      b.item(p, 0, {w, u.worker}, true, u.peer_rows(peer, u.kv_heads(u.me)), {nullptr, r});
    }
  }
}

// Gather back: outputs of the peer's rows for my heads go to the peer
// (forward O and LSE; backward dQ, and dK/dV partial sums added at home).
void add_outputs(Builder& b, const UlyssesRank& u, const RowRanges& mine, const Region* r) {
  const Route self{u.worker, u.worker};
  for (int peer = 0; peer < u.cp; ++peer) {
    const int w = u.base + peer;
    if (w == u.worker) {
      for (auto [t0, t1] : mine) {
        b.item(Phase::kFwdOut, 0, self, false, u.rows(t0, t1, u.q_heads(u.me)), {r, nullptr});
        b.item(Phase::kBwdOut, 0, self, false, u.rows(t0, t1, u.q_heads(u.me)), {r, nullptr});
        b.item(Phase::kBwdOut, 0, self, true, u.rows(t0, t1, u.kv_heads(u.me)), {r, nullptr}, true);
      }
      continue;
    }
    const Route out{u.worker, w}, back{w, u.worker};
    b.item(Phase::kFwdOut, 0, out, false, u.peer_rows(peer, u.q_heads(u.me)), {r, nullptr});
    b.item(Phase::kBwdOut, 0, out, false, u.peer_rows(peer, u.q_heads(u.me)), {r, nullptr});
    b.item(Phase::kBwdOut, 0, out, true, u.peer_rows(peer, u.kv_heads(u.me)), {r, nullptr}, true);
    b.item(Phase::kFwdOut, 0, back, false, u.my_rows(u.q_heads(peer)), {});
    b.item(Phase::kBwdOut, 0, back, false, u.my_rows(u.q_heads(peer)), {});
    b.item(Phase::kBwdOut, 0, back, true, u.my_rows(u.kv_heads(peer)), {}, true);
  }
}

// One call over the region's samples and one over those read at home,
// both passes.
void add_calls(RankSchedule& s, const UlyssesRank& u, SampleSplit& split) {
  const Region& whole = s.regions[0];
  for (CallFragment& f : split.in_compute) {
    f.q_row = whole.q_row(f.q_row);
    f.kv_row = whole.kv_row(f.kv_row);
  }
  const HeadRange q = u.q_heads(u.me), kv = u.kv_heads(u.me);
  const CallList::Heads heads{q.begin, q.end, kv.begin, kv.end};
  CallList calls;
  calls.add({0, false, false}, heads, split.in_compute);
  calls.add({0, true, true}, heads, split.at_home);
  calls.emit(s, Pass::kForward, 0);
  s.kernel_calls[1][0] = s.kernel_calls[0][0];
}

}  // namespace

Result<RankSchedule> make_ulysses_schedule(std::span<const PackedSequence> pool, const PlanConfig& config, int worker,
                                           const ScheduleOptions& options) {
  PlanConfig c = config;
  c.mode = PlanMode::kUlysses;
  c.chunks = 1;
  LIBRA_TRY(validate_plan_config(c));
  if (c.home_layout != HomeLayout::kContiguous) {
    return invalid_input("ulysses: home layout " + std::string(home_layout_name(c.home_layout)) +
                         " is not supported by the direct Ulysses schedule (contiguous only); plan it as mode ulysses");
  }
  // Its all-to-alls move whole samples: a KV prefix would be claimed, not done.
  if (c.kv_prefix) {
    return invalid_input("ulysses: kv_prefix is not supported by the direct Ulysses schedule (whole samples); plan it "
                         "as mode ulysses");
  }
  LIBRA_TRY(check_ulysses(pool, config, worker));
  RankSchedule s = schedule_header(c, static_cast<int>(pool.size()) * config.cp, worker);
  s.home_tokens = home_tokens(pool[static_cast<std::size_t>(s.slot)], s.home_map, worker % config.cp);
  s.what = "ulysses pool and configuration";
  s.fingerprint = ulysses_fingerprint(pool, config);
  const UlyssesRank u = ulysses_rank(s);
  SampleSplit split = split_samples(pool[static_cast<std::size_t>(s.slot)], u, options.read_home_in_place);
  s.regions.push_back(ulysses_region(u, split.mine, config.seq_len));
  assign_offsets(s);
  Builder b(s);
  add_inputs(b, u, split.mine, &s.regions[0]);
  add_outputs(b, u, split.mine, &s.regions[0]);
  add_calls(s, u, split);
  b.finish();
  return s;
}

}  // namespace libra
