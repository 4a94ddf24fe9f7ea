// tap-topo: SH-Tile placement that keeps every worker within tau of the
// balanced load (the contract's capacity C) and, among such placements,
// looks for the least slowest-worker transfer time on the pool's topology.
//
// Why not TAP's rule: TAP sends the heaviest tiles first to the worker of
// least added bytes, so the Q home fills with heavy tiles early and the
// light, byte-heavy tiles of a busy home travel late to whichever worker
// still has room, often across nodes. Moving a tile costs its Q/O rows plus
// the KV of its samples; heavy tiles (late blocks of long samples) carry the
// most FLOPs per byte moved, and once a worker holds a sample's KV its other
// tiles cost only their Q/O. So:
//   1. home first: every worker keeps its own tiles, lightest first, while
//      they fit under C;
//   2. the rest, heaviest first, go to the worker with headroom whose link
//      time (and its sources' link time) after the move is least, priced
//      per tier (NVLink, NIC, spine) as the simulator prices an all-to-all;
//      ties: fewer added link-seconds, lower load, lower worker id;
//   3. a tile that fits nowhere is split along its query rows, as tap-split
//      does: its largest suffix that fits a worker goes there, the rest is
//      placed again (only when not one row fits anywhere does it go to the
//      least-loaded worker, as in TAP).
// Candidates: home first keeping the lightest tiles, and keeping whole head
// shards; where neither fits under C without splitting a tile, the same
// keeping at most the mean load at home, and every tile in TAP's order by
// the same score (it packs tighter); last, TAP's own placement. The result
// is the candidate within C (all: the lower slowest link time, then the
// lower sum; none: the lower peak load), so it is never slower on the links
// than tap where tap fits.
// Everything is integer bytes and doubles evaluated in a fixed order, so the
// result is deterministic tile for tile.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>

#include "tiles/plan_internal.hpp"

namespace libra::detail {

namespace {

std::int64_t capacity_limit(double c) {
  if (!(c < 9.2e18)) return std::numeric_limits<std::int64_t>::max();
  auto x = static_cast<std::int64_t>(std::floor(c));
  while (static_cast<double>(x) > c) --x;
  while (static_cast<double>(x + 1) <= c) ++x;
  return x;
}

using Tiers = std::array<double, 3>;  // bytes by tier: node, supernode, across

// KV bytes of one fragment's group that live on CP rank `rank` of the slot.
struct Source {
  std::int32_t group;
  int rank;
  std::int64_t bytes;
};

// What every candidate reads about a tile, found once per plan: per block
// (the S shards of a block are consecutive tiles with the same rows) its
// home and its samples' home runs; per shard the dedup key and KV bytes per
// token.
struct Blocks {
  struct Run {
    std::int32_t sample;  // global
    std::int32_t rank;
    std::int64_t tokens;
    std::int32_t next;  // the first run of the block's next sample
    std::int32_t only;  // the CP rank holding the whole sample, else -2
  };
  std::vector<std::int32_t> home;
  std::vector<std::int32_t> run_begin;  // blocks + 1, into runs
  std::vector<Run> runs;
  // Per block, the first runs of its samples not wholly on its home's CP
  // rank: all a commit to the home reads (the rest move nothing there).
  std::vector<std::int32_t> away_begin;  // blocks + 1, into away
  std::vector<std::int32_t> away;
  std::vector<std::int32_t> key;
  std::vector<std::int64_t> vkv;
  std::size_t max_runs = 0;  // of a block
  // Every byte count a candidate adds to a link, and every partial sum, is
  // an integer below 2^53: a double holds each exactly, so a link's final
  // bytes do not depend on the order of the commits.
  bool exact = false;

  Blocks(const Geometry& geo, std::span<const PlacedRows> base) {
    const std::size_t S = static_cast<std::size_t>(geo.shards);
    const std::size_t n = base.size() / S;
    for (int s = 0; s < geo.shards; ++s) {
      key.push_back(geo.key_index(s));
      vkv.push_back(geo.kv_bytes_per_token(s));
    }
    // The bound on the bytes moved (see `exact`): each tile its samples'
    // whole K/V and its Q and O, in doubles (it only needs to be within a
    // factor of two).
    double kv_per_token = 0;
    for (const std::int64_t v : vkv) kv_per_token += static_cast<double>(v);
    const double qo = 2.0 * static_cast<double>(geo.shards) * static_cast<double>(geo.qo_bytes_per_row());
    double moved = 0;
    home.resize(n);
    run_begin.reserve(n + 1);
    run_begin.push_back(0);
    // The samples of each block: [first, its end) from the block's first sample.
    auto samples = [&](const PlacedRows& t) {
      std::int32_t j = geo.block_sample(t.slot, t.block);
      const std::int32_t first = j;
      while (j < geo.sample_base[static_cast<std::size_t>(t.slot) + 1] && geo.starts[static_cast<std::size_t>(j)] < t.end) ++j;
      return std::pair{first, j};
    };
    std::size_t count = 0;  // runs, so that they are written once
    for (std::size_t b = 0; b < n; ++b) {
      const auto [first, last] = samples(base[b * S]);
      count += static_cast<std::size_t>(geo.run_base[static_cast<std::size_t>(last)] - geo.run_base[static_cast<std::size_t>(first)]);
    }
    runs.reserve(count);
    away_begin.reserve(n + 1);
    away_begin.push_back(0);
    for (std::size_t b = 0; b < n; ++b) {
      const PlacedRows& t = base[b * S];
      home[b] = geo.home(t.slot, t.begin);
      const std::int32_t home_rank = home[b] - t.slot * geo.cp;
      double tokens = 0;
      const auto [first, last] = samples(t);
      for (std::int32_t j = first; j < last; ++j) {
        const std::span<const Geometry::Run> sr = geo.sample_runs(j);
        const auto next = static_cast<std::int32_t>(runs.size() + sr.size());
        const bool one = std::all_of(sr.begin(), sr.end(), [&](const Geometry::Run& run) { return run.rank == sr[0].rank; });
        const std::int32_t only = one ? sr[0].rank : -2;
        if (only != home_rank) away.push_back(static_cast<std::int32_t>(runs.size()));
        for (const Geometry::Run& run : sr) {
          runs.push_back({j, run.rank, run.end - run.begin, next, only});
          tokens += static_cast<double>(run.end - run.begin);
        }
      }
      run_begin.push_back(static_cast<std::int32_t>(runs.size()));
      away_begin.push_back(static_cast<std::int32_t>(away.size()));
      max_runs = std::max(max_runs, static_cast<std::size_t>(run_begin[b + 1] - run_begin[b]));
      moved += tokens * kv_per_token + qo * static_cast<double>(t.end - t.begin);
    }
    exact = moved < 0x1p52;
  }
};

// Each worker's node and supernode, and the tier from every slot's first
// worker to every worker: made once per plan, read by every candidate (the
// fast path of least_score looks a fresh worker's tier up instead of
// comparing its node and supernode).
struct Tiering {
  std::vector<int> node, super;
  std::vector<std::uint8_t> slot_tier;  // pool_size x workers
  std::vector<std::uint8_t> one_node;   // per slot: all its workers in one node
  std::size_t words;                    // of a worker bitset
  std::vector<std::uint64_t> tier_bits; // pool_size x 3 tiers x words: the workers of each tier from the slot

  Tiering(const Geometry& geo, const PlanTopology& topo) {
    const auto W = static_cast<std::size_t>(geo.workers);
    node.resize(W);
    super.resize(W);
    for (int w = 0; w < geo.workers; ++w) {
      node[static_cast<std::size_t>(w)] = w / topo.gpus_per_node;
      super[static_cast<std::size_t>(w)] = w / topo.gpus_per_node / topo.nodes_per_supernode;
    }
    slot_tier.resize(static_cast<std::size_t>(geo.pool_size) * W);
    words = (W + 63) / 64;
    tier_bits.assign(static_cast<std::size_t>(geo.pool_size) * 3 * words, 0);
    for (int p = 0; p < geo.pool_size; ++p) {
      one_node.push_back(node[static_cast<std::size_t>(p * geo.cp)] == node[static_cast<std::size_t>(p * geo.cp + geo.cp - 1)]);
      for (int r = 0; r < geo.workers; ++r) {
        const int t = tier(p * geo.cp, r);
        slot_tier[static_cast<std::size_t>(p) * W + static_cast<std::size_t>(r)] = static_cast<std::uint8_t>(t);
        tier_bits[(static_cast<std::size_t>(p) * 3 + static_cast<std::size_t>(t)) * words +
                  static_cast<std::size_t>(r) / 64] |= std::uint64_t{1} << (r % 64);
      }
    }
  }
  int tier(int a, int b) const {
    if (node[static_cast<std::size_t>(a)] == node[static_cast<std::size_t>(b)]) return 0;
    return super[static_cast<std::size_t>(a)] == super[static_cast<std::size_t>(b)] ? 1 : 2;
  }
};

class TopoPlacer {
 public:
  TopoPlacer(const Geometry& geo, const Blocks& blocks, const Tiering& tiering, const PlanTopology& topo,
             double capacity)
      : geo_(geo),
        blocks_(blocks),
        tiering_(tiering),
        W_(geo.workers),
        words_((static_cast<std::size_t>(geo.workers) + 63) / 64),
        limit_(capacity_limit(capacity)),
        loads_(static_cast<std::size_t>(W_), 0),
        send_(static_cast<std::size_t>(W_), Tiers{0, 0, 0}),
        recv_(static_cast<std::size_t>(W_), Tiers{0, 0, 0}),
        committed_(static_cast<std::size_t>(geo.sample_base.back()) * geo.keys_per_sample * words_, 0),
        add_(static_cast<std::size_t>(geo.cp), 0),
        src_buf_(blocks.max_runs) {
    const double nodes = static_cast<double>((W_ + topo.gpus_per_node - 1) / topo.gpus_per_node);
    inv_[0] = 1.0 / (topo.intra_node_gbps * 1e9);
    inv_[1] = (1.0 + topo.congestion_per_node * std::max(0.0, nodes - 2)) / (topo.inter_node_gbps * 1e9);
    inv_spine_ = 1.0 / (topo.inter_supernode_gbps * 1e9);
    // Link-seconds per byte of each tier, for the tie-break: a cross-
    // supernode byte uses the NIC and the spine.
    per_byte_ = {inv_[0], inv_[1], inv_[1] + inv_spine_};
    touched_.assign(words_, 0);
    by_load_.resize(static_cast<std::size_t>(W_));
    place_.resize(static_cast<std::size_t>(W_));
  }

  // Loads the sources of rows [t.begin, t.end) of block `block` (KV by CP
  // rank, Q/O from the home); with `scoring`, also what least_score()
  // needs. A piece (not the whole block's rows) touches only the samples
  // its rows overlap.
  void load_rows(const PlacedRows& t, std::size_t block, bool piece, bool scoring = true) {
    p_ = t.slot;
    home_ = piece ? geo_.home(t.slot, t.begin) : blocks_.home[block];
    vqo_ = (t.end - t.begin) * geo_.qo_bytes_per_row();
    const std::int64_t vkv = blocks_.vkv[static_cast<std::size_t>(t.shard)];
    const std::int32_t key = blocks_.key[static_cast<std::size_t>(t.shard)];
    const int keys = geo_.keys_per_sample;
    // Written through a pointer into a buffer of the largest block's size:
    // push_back would reload the vector's end after every store.
    Source* out = src_buf_.data();
    const Blocks::Run* const end = blocks_.runs.data() + blocks_.run_begin[block + 1];
    for (const Blocks::Run* run = blocks_.runs.data() + blocks_.run_begin[block]; run != end; ++run) {
      const auto j = static_cast<std::size_t>(run->sample);
      if (piece && (geo_.starts[j] >= t.end || geo_.starts[j] + geo_.lengths[j] <= t.begin)) continue;
      *out++ = {run->sample * keys + key, run->rank, vkv * run->tokens};
    }
    nsrcs_ = static_cast<std::size_t>(out - src_buf_.data());
    if (!scoring) return;
    // Most candidates hold none of the tile's groups and sit outside its
    // slot: for them the bytes per source are the same and, when the slot
    // lies in one node, so is the tier of every source. Precompute their
    // score per tier (the same arithmetic, in the same order, as the general
    // path) and mark the candidates that need the general path.
    const int base = p_ * geo_.cp;
    std::fill(add_.begin(), add_.end(), 0);
    std::fill(touched_.begin(), touched_.end(), 0);
    // A group's sources are consecutive (one per home run of its sample).
    std::int32_t group = -1;
    std::int64_t total = vqo_;
    for (const Source& s : srcs()) {
      add_[static_cast<std::size_t>(s.rank)] += s.bytes;
      total += s.bytes;
      if (s.group == group) continue;
      group = s.group;
      const std::uint64_t* bits = &committed_[static_cast<std::size_t>(s.group) * words_];
      for (std::size_t k = 0; k < words_; ++k) touched_[k] |= bits[k];
    }
    add_[static_cast<std::size_t>(home_ - base)] += vqo_;
    if (base / 64 == (base + geo_.cp - 1) / 64) {  // the slot's workers in one word
      touched_[static_cast<std::size_t>(base) / 64] |= (~std::uint64_t{0} >> (64 - geo_.cp)) << (base % 64);
    } else {
      for (int c = 0; c < geo_.cp; ++c) mark(base + c);
    }
    one_node_ = tiering_.one_node[static_cast<std::size_t>(p_)] != 0;
    slot_tier_ = tiering_.slot_tier.data() + static_cast<std::size_t>(p_) * static_cast<std::size_t>(W_);
    if (!one_node_) return;
    // Which tiers hold a fresh worker (least_score's stop test).
    for (std::size_t k = 0; k < 3; ++k) {
      const std::uint64_t* bits = &tiering_.tier_bits[(static_cast<std::size_t>(p_) * 3 + k) * words_];
      std::uint64_t any = 0;
      for (std::size_t x = 0; x < words_; ++x) any |= bits[x] & ~touched_[x];
      fresh_tier_[k] = any != 0;
    }
    if (!fresh_tier_[0] && !fresh_tier_[1] && !fresh_tier_[2]) return;  // least_score will not ask
    fresh_total_ = total;
    fresh_worst_ = {0, 0, 0};
    fresh_cost_ = {0, 0, 0};
    for (int c = 0; c < geo_.cp; ++c) {
      const std::int64_t b = add_[static_cast<std::size_t>(c)];
      if (b == 0) continue;
      const int w = base + c;
      const Tiers ts = link_plus(send_[static_cast<std::size_t>(w)], static_cast<double>(b));
      // Only the home's receive side changes (its O comes back).
      const Tiers& rw = recv_[static_cast<std::size_t>(w)];
      const Tiers tr = w == home_ ? link_plus(rw, static_cast<double>(vqo_)) : Tiers{link(rw), link(rw), link(rw)};
      for (std::size_t k = 0; k < 3; ++k) {
        fresh_worst_[k] = std::max(fresh_worst_[k], std::max(ts[k], tr[k]));
        fresh_cost_[k] += static_cast<double>(b) * per_byte_[k];
      }
    }
    for (std::size_t k = 0; k < 3; ++k) fresh_cost_[k] += static_cast<double>(vqo_) * per_byte_[k];
  }

  struct Score {
    double worst = 0;  // largest link time among the workers the move touches
    double cost = 0;   // link-seconds it adds
  };

  // The worker of least link score among those with room for `flops`;
  // ties: fewer added link-seconds, lower load, lower id (a strict order,
  // so the scan order does not matter). -1 if none. The same choice as
  // scoring every worker with room, but cheaper: the few workers off the
  // fast path (see load_rows()) are scored first; then the fresh ones in
  // order of load (kept on commit), so those with room are a prefix, each
  // scored inline from its tier. A fresh worker's key with its tier's
  // fixed part as the worst (its worst can only exceed it) bounds its key
  // from below: one whose bound already loses is skipped unscored, and the
  // scan stops once no tier's bound can win (every later worker comes
  // after the best in (load, id)).
  int least_score(std::int64_t flops) {
    if (!by_load_ready_) sort_by_load();
    Best b{-1, {}, limit_ - flops};
    const std::int64_t* loads = loads_.data();
    if (!one_node_) {
      for (const int r : by_load_) {
        if (loads[r] > b.room) break;
        consider(b, evaluate_touched(r), r);
      }
      return b.r;
    }
    for (std::size_t k = 0; k < words_; ++k) {
      for (std::uint64_t word = touched_[k]; word != 0; word &= word - 1) {
        const int r = static_cast<int>(k * 64 + static_cast<std::size_t>(std::countr_zero(word)));
        if (loads[r] <= b.room) consider(b, evaluate_touched(r), r);
      }
    }
    for (const int r : by_load_) {
      if (loads[r] > b.room) break;
      if (!fresh(r)) continue;
      if (b.r >= 0 && fresh_beaten(b, r)) break;
      const std::size_t t = slot_tier_[r];
      if (!wins(b, {fresh_worst_[t], fresh_cost_[t]}, r)) continue;
      Tiers rs = send_[static_cast<std::size_t>(r)], rr = recv_[static_cast<std::size_t>(r)];
      rr[t] += static_cast<double>(fresh_total_);
      rs[t] += static_cast<double>(vqo_);
      consider(b, {std::max(fresh_worst_[t], time(rs, rr)), fresh_cost_[t]}, r);
    }
    return b.r;
  }

 private:
  // least_score's best so far and the load a worker needs to be at most.
  struct Best {
    int r;
    Score s;
    std::int64_t room;
  };
  bool wins(const Best& b, const Score& s, int r) const {
    if (b.r < 0 || s.worst != b.s.worst) return b.r < 0 || s.worst < b.s.worst;
    if (s.cost != b.s.cost) return s.cost < b.s.cost;
    return before(r, b.r);
  }
  void consider(Best& b, const Score& s, int r) const {
    if (wins(b, s, r)) {
      b.r = r;
      b.s = s;
    }
  }
  // No fresh worker from r on in by_load_ can win: each tier's bound loses.
  bool fresh_beaten(const Best& b, int r) const {
    for (std::size_t t = 0; t < 3; ++t) {
      if (!fresh_tier_[t]) continue;
      const double w = fresh_worst_[t], c = fresh_cost_[t];
      if (w < b.s.worst || (w == b.s.worst && (c < b.s.cost || (c == b.s.cost && !before(b.r, r))))) return false;
    }
    return true;
  }

 public:
  // by_load_: the workers by (load, id), and each one's place in it.
  void sort_by_load() {
    std::iota(by_load_.begin(), by_load_.end(), 0);
    std::sort(by_load_.begin(), by_load_.end(), [&](int a, int b) { return before(a, b); });
    for (int k = 0; k < W_; ++k) place_[static_cast<std::size_t>(by_load_[static_cast<std::size_t>(k)])] = k;
    by_load_ready_ = true;
  }
  bool before(int a, int b) const {
    const std::int64_t la = loads_[static_cast<std::size_t>(a)], lb = loads_[static_cast<std::size_t>(b)];
    return la != lb ? la < lb : a < b;
  }
  // r's load grew: it moves up past the workers now before it.
  void resort(int r) {
    auto k = static_cast<std::size_t>(place_[static_cast<std::size_t>(r)]);
    for (; k + 1 < by_load_.size() && before(by_load_[k + 1], r); ++k) {
      by_load_[k] = by_load_[k + 1];
      place_[static_cast<std::size_t>(by_load_[k])] = static_cast<int>(k);
    }
    by_load_[k] = r;
    place_[static_cast<std::size_t>(r)] = static_cast<int>(k);
  }
  bool fresh(int r) const {
    return one_node_ && !((touched_[static_cast<std::size_t>(r) / 64] >> (r % 64)) & 1U);
  }
  // What placing the loaded tile on r does to the links, for a worker off
  // the fast path: the tile's sources one by one.
  [[gnu::noinline]] Score evaluate_touched(int r) {
    std::fill(add_.begin(), add_.end(), 0);
    const int base = p_ * geo_.cp;
    // Most sources are r's own or of a group r holds. The bitset and its
    // stride in locals: the compiler reloads members after every store.
    const std::uint64_t* committed = committed_.data() + static_cast<std::size_t>(r) / 64;
    const std::size_t words = words_;
    const int bit = r % 64, rank = r - base;
    std::int64_t* add = add_.data();
    for (const Source& s : srcs()) {
      if (s.rank == rank || ((committed[static_cast<std::size_t>(s.group) * words] >> bit) & 1U) != 0) continue;
      add[s.rank] += s.bytes;
    }
    if (r != home_) add_[static_cast<std::size_t>(home_ - base)] += vqo_;
    Score sc;
    Tiers rs = send_[static_cast<std::size_t>(r)], rr = recv_[static_cast<std::size_t>(r)];
    for (int c = 0; c < geo_.cp; ++c) {
      const std::int64_t b = add_[static_cast<std::size_t>(c)];
      if (b == 0) continue;
      const int w = base + c;
      const auto t = static_cast<std::size_t>(tier(w, r));
      rr[t] += static_cast<double>(b);
      Tiers ws = send_[static_cast<std::size_t>(w)];
      ws[t] += static_cast<double>(b);
      Tiers wr = recv_[static_cast<std::size_t>(w)];
      if (w == home_) wr[t] += static_cast<double>(vqo_);  // O comes back
      sc.worst = std::max(sc.worst, time(ws, wr));
      sc.cost += static_cast<double>(b) * per_byte_[t];
    }
    if (r != home_) {
      const auto t = static_cast<std::size_t>(tier(r, home_));
      rs[t] += static_cast<double>(vqo_);
      sc.cost += static_cast<double>(vqo_) * per_byte_[t];
    }
    sc.worst = std::max(sc.worst, time(rs, rr));
    return sc;
  }

 public:

  // Places the loaded tile on r: its bytes join the links, its groups C_r.
  void commit(int r, std::int64_t flops) {
    loads_[static_cast<std::size_t>(r)] += flops;
    if (by_load_ready_) resort(r);
    const int base = p_ * geo_.cp;
    std::uint64_t* committed = committed_.data() + static_cast<std::size_t>(r) / 64;
    const std::size_t words = words_;
    const int bit = r % 64, rank = r - base;
    for (const Source& s : srcs()) {
      if (s.rank != rank && ((committed[static_cast<std::size_t>(s.group) * words] >> bit) & 1U) == 0) {
        move(base + s.rank, r, s.bytes);
      }
    }
    // A group spanning ranks has several sources, consecutive: mark it
    // after all of them, once (a store per source waited on the last).
    std::int32_t group = -1;
    for (const Source& s : srcs()) {
      if (s.group == group) continue;
      group = s.group;
      committed[static_cast<std::size_t>(s.group) * words] |= std::uint64_t{1} << bit;
    }
    if (r != home_) {
      move(home_, r, vqo_);
      move(r, home_, vqo_);
    }
  }


  // load_rows() of the whole tile t (of block `block`) with commit() to r,
  // in one pass over the block's home runs: they come sample by sample, one
  // group each, so each group's bit is read before its moves and set after
  // them, and the moves happen in commit()'s order. A group r holds already
  // skips its runs; from a slot in one node every run's tier is the slot's.
  // A sample wholly on r moves nothing and its group's bit is left unset:
  // no reader needs it (load_rows() marks every worker of the slot touched,
  // evaluate_touched() and commit() skip the sources on r before reading
  // the bit); at the home only Blocks::away is read. Returns whether any
  // K/V moved.
  bool commit_tile(const PlacedRows& t, std::size_t block, int r, std::int64_t flops) {
    loads_[static_cast<std::size_t>(r)] += flops;
    by_load_ready_ = false;  // re-sorted when least_score needs it
    const int base = t.slot * geo_.cp;
    const std::int32_t rank = r >= base && r < base + geo_.cp ? r - base : -1;
    const std::int64_t vkv = blocks_.vkv[static_cast<std::size_t>(t.shard)];
    const std::int32_t key = blocks_.key[static_cast<std::size_t>(t.shard)];
    const std::uint64_t bit = std::uint64_t{1} << (r % 64);
    const std::size_t word = static_cast<std::size_t>(r) / 64;
    const Blocks::Run* runs = blocks_.runs.data();
    const std::int32_t end = blocks_.run_begin[block + 1];
    const bool one_node = tiering_.one_node[static_cast<std::size_t>(t.slot)] != 0;
    const std::size_t tier = tiering_.slot_tier[static_cast<std::size_t>(t.slot) * static_cast<std::size_t>(W_) +
                                                static_cast<std::size_t>(r)];
    bool kv = false;
    auto group = [&](std::int32_t k) {
      std::uint64_t& bits =
          committed_[static_cast<std::size_t>(runs[k].sample * geo_.keys_per_sample + key) * words_ + word];
      if ((bits & bit) != 0) return;
      for (std::int32_t u = k; u < runs[k].next; ++u) {
        const int w = base + runs[u].rank;
        if (w == r) continue;
        kv = true;
        const double b = static_cast<double>(vkv * runs[u].tokens);
        if (one_node) {
          send_[static_cast<std::size_t>(w)][tier] += b;
          recv_[static_cast<std::size_t>(r)][tier] += b;
        } else {
          move(w, r, vkv * runs[u].tokens);
        }
      }
      bits |= bit;
    };
    const int home = blocks_.home[block];
    if (r == home) {
      const std::int32_t* away = blocks_.away.data();
      for (std::int32_t x = blocks_.away_begin[block]; x < blocks_.away_begin[block + 1]; ++x) group(away[x]);
    } else {
      for (std::int32_t k = blocks_.run_begin[block]; k < end; k = runs[k].next) {
        if (runs[k].only != rank) group(k);
      }
      const std::int64_t vqo = (t.end - t.begin) * geo_.qo_bytes_per_row();
      move(home, r, vqo);
      move(r, home, vqo);
    }
    return kv;
  }

  // Takes back commit_tile(t, block, h, flops) of a home pass (h: t's
  // home): its load and the K/V of each group h still holds. Called for
  // h's tiles in the order they were committed, the first one holding a
  // group is the one that added its bytes (with its shard's K/V width),
  // and clearing the bit leaves the group to it alone. Exact only where
  // every byte sum is (Blocks::exact): then x + b - b is x.
  void uncommit_home(const PlacedRows& t, std::size_t block, std::int64_t flops) {
    const int r = blocks_.home[block];
    loads_[static_cast<std::size_t>(r)] -= flops;
    by_load_ready_ = false;
    const int base = t.slot * geo_.cp;
    const std::int64_t vkv = blocks_.vkv[static_cast<std::size_t>(t.shard)];
    const std::int32_t key = blocks_.key[static_cast<std::size_t>(t.shard)];
    const std::uint64_t bit = std::uint64_t{1} << (r % 64);
    const Blocks::Run* runs = blocks_.runs.data();
    for (std::int32_t k = blocks_.run_begin[block]; k < blocks_.run_begin[block + 1]; k = runs[k].next) {
      std::uint64_t& bits = committed_[static_cast<std::size_t>(runs[k].sample * geo_.keys_per_sample + key) * words_ +
                                       static_cast<std::size_t>(r) / 64];
      if ((bits & bit) == 0) continue;
      for (std::int32_t u = k; u < runs[k].next; ++u) {
        const int w = base + runs[u].rank;
        if (w != r) move(w, r, -vkv * runs[u].tokens);
      }
      bits &= ~bit;
    }
  }

  // Worker w's link time now.
  double link_time(int w) const { return time(send_[static_cast<std::size_t>(w)], recv_[static_cast<std::size_t>(w)]); }
  // The slowest link among r and the workers of `slot`.
  double slot_worst(int slot, int r) const {
    double worst = link_time(r);
    for (int w = slot * geo_.cp; w < (slot + 1) * geo_.cp; ++w) worst = std::max(worst, link_time(w));
    return worst;
  }

  // The slowest link among the workers commit_tile(t, block, r, ..)
  // changed (0 if none): r and t's home, with `kv` (K/V moved) the workers
  // of t's slot too.
  double touched_worst(const PlacedRows& t, std::size_t block, int r, bool kv) const {
    const int home = blocks_.home[block];
    if (!kv && r == home) return 0;
    return kv ? slot_worst(t.slot, r) : std::max(link_time(r), link_time(home));
  }

  // The slowest link among r and the loaded tile's slot: every worker a
  // commit(r, ..) of it changes (its home and its K/V sources are in the slot).
  double slot_worst(int r) const { return slot_worst(p_, r); }

  bool fits(int r, std::int64_t flops) const { return loads_[static_cast<std::size_t>(r)] <= limit_ - flops; }
  bool fits_under(int r, std::int64_t flops, std::int64_t cap) const {
    return fits_load(loads_[static_cast<std::size_t>(r)], flops, cap);
  }
  // Whether a worker of load `load` has room for `flops` under C and `cap`.
  bool fits_load(std::int64_t load, std::int64_t flops, std::int64_t cap) const {
    return load <= std::min(limit_, cap) - flops;
  }
  std::int64_t max_load() const { return *std::max_element(loads_.begin(), loads_.end()); }
  bool within_capacity() const { return max_load() <= limit_; }
  // The slowest worker's link time and the sum over workers, as the tie-break.
  std::pair<double, double> link_times() const {
    double worst = 0, sum = 0;
    for (int r = 0; r < W_; ++r) {
      const double t = link_time(r);
      worst = std::max(worst, t);
      sum += t;
    }
    return {worst, sum};
  }
  // The least-loaded worker, lowest id on ties: the first by (load, id).
  int least_loaded() {
    if (!by_load_ready_) sort_by_load();
    return by_load_[0];
  }

 private:
  // link() of x with b more bytes on tier k, for each k: only the terms
  // that tier k enters are recomputed, with link()'s arithmetic (adding
  // b = 0 changes nothing, bit for bit).
  Tiers link_plus(const Tiers& x, double b) const {
    const double t0 = x[0] * inv_[0], t1 = (x[1] + x[2]) * inv_[1], t2 = x[2] * inv_spine_;
    return {std::max({(x[0] + b) * inv_[0], t1, t2}), std::max({t0, ((x[1] + b) + x[2]) * inv_[1], t2}),
            std::max({t0, (x[1] + (x[2] + b)) * inv_[1], (x[2] + b) * inv_spine_})};
  }
  double link(const Tiers& x) const {
    return std::max({x[0] * inv_[0], (x[1] + x[2]) * inv_[1], x[2] * inv_spine_});
  }
  double time(const Tiers& s, const Tiers& r) const { return std::max(link(s), link(r)); }
  int tier(int a, int b) const { return tiering_.tier(a, b); }
  void mark(int w) { touched_[static_cast<std::size_t>(w) / 64] |= std::uint64_t{1} << (w % 64); }
  void move(int from, int to, std::int64_t bytes) {
    const auto tier = static_cast<std::size_t>(this->tier(from, to));
    send_[static_cast<std::size_t>(from)][tier] += static_cast<double>(bytes);
    recv_[static_cast<std::size_t>(to)][tier] += static_cast<double>(bytes);
  }

  const Geometry& geo_;
  const Blocks& blocks_;
  const Tiering& tiering_;
  int W_;
  std::size_t words_;
  std::int64_t limit_;
  std::vector<std::int64_t> loads_;
  std::vector<Tiers> send_, recv_;
  std::vector<std::uint64_t> committed_;
  std::vector<std::int64_t> add_;
  std::vector<int> by_load_, place_;  // least_score's order (sort_by_load)
  bool by_load_ready_ = false;
  std::array<double, 2> inv_{};
  double inv_spine_ = 0;
  std::array<double, 3> per_byte_{};
  // The loaded tile.
  int p_ = -1, home_ = 0;
  std::int64_t vqo_ = 0;
  std::vector<Source> src_buf_;  // the loaded tile's sources: the first nsrcs_
  std::size_t nsrcs_ = 0;
  std::span<const Source> srcs() const { return {src_buf_.data(), nsrcs_}; }
  const std::uint8_t* slot_tier_ = nullptr;  // tiering_'s row of slot p_
  // The fast path of least_score() (see load()).
  std::vector<std::uint64_t> touched_;  // candidates that need the general path
  bool one_node_ = false;
  std::int64_t fresh_total_ = 0;
  std::array<double, 3> fresh_worst_{}, fresh_cost_{};
  std::array<bool, 3> fresh_tier_{};  // a tier holds a fresh worker
};

}  // namespace

namespace {

// When a candidate may stop before it has placed every tile. It can win
// only by ending within C with strictly lower link_times() than the best
// candidate before it, which is within C with slowest link `beat`. A link's
// time only grows as tiles commit (bytes are only added, x + b >= x for
// b >= 0 in doubles, and link() is a max of products by positive factors),
// so once one of its links is slower than `beat` it has lost and its
// remaining tiles would change nothing, unless a later none_within() reads
// it: then (`needs_pieces`) it stops only once it has split a tile, which
// none_within() ignores.
struct Stop {
  double beat = std::numeric_limits<double>::infinity();
  bool needs_pieces = false;
  bool active(const std::vector<PlacedRows>& pieces) const {
    return beat < std::numeric_limits<double>::infinity() && (!needs_pieces || !pieces.empty());
  }
  // After a commit to r of the placer's loaded tile.
  bool met(const TopoPlacer& placer, int r, const std::vector<PlacedRows>& pieces) const {
    return active(pieces) && placer.slot_worst(r) > beat;
  }
};

// No worker has room for the rows. With few, heavy tiles per worker (large
// blocks, few head shards) the greedy leaves the headroom in gaps just short
// of the last tiles; falling back to TAP's overflow, or to TAP's placement,
// would give up the home and node locality won so far. So split, as
// tap-split does: the largest suffix of the rows that fits a worker goes
// there (the suffix holds the most FLOPs per row), and the rest is placed
// again. The worker: the least link score among those with room for half
// the rows' FLOPs (few pieces, each of which brings its own K/V), else the
// one with the most room. Returns the piece's FLOPs, 0 when no worker has
// room for even the last row (rows unchanged).
std::int64_t split_off_suffix(const Geometry& geo, TopoPlacer& placer, std::size_t block, PlacedRows& rows,
                              std::int64_t f, std::vector<PlacedRows>& pieces) {
  const std::int64_t last = geo.rows_flops(rows.slot, rows.end - 1, rows.end);
  const std::int64_t half = std::max(f / 2, last);
  int to = placer.least_score(half);
  if (to < 0) {
    to = placer.least_loaded();
    if (!placer.fits(to, last)) return 0;
  }
  // The least y in (begin, end) whose suffix [y, end) fits `to`: the suffix
  // FLOPs only grow as y falls.
  std::int64_t lo = rows.begin + 1, hi = rows.end - 1;
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    if (placer.fits(to, geo.rows_flops(rows.slot, mid, rows.end))) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  PlacedRows piece = rows;
  piece.begin = lo;
  piece.worker = to;
  const std::int64_t pf = geo.rows_flops(rows.slot, lo, rows.end);
  placer.load_rows(piece, block, /*piece=*/true, /*scoring=*/false);
  placer.commit(to, pf);
  pieces.push_back(piece);
  rows.end = lo;
  return pf;
}

// Steps 2 and 3 for the tiles `order` (heaviest first). Whole tiles go to
// `out` (indexed by tile), the pieces split off them to `pieces`. False
// when `stop` is met (see Stop) before the last tile.
bool place_rest(const Geometry& geo, TopoPlacer& placer, std::span<const PlacedRows> base,
                std::span<const std::int64_t> flops, std::span<const std::int32_t> order, std::vector<PlacedRows>& out,
                std::vector<PlacedRows>& pieces, const Stop& stop) {
  const std::size_t S = static_cast<std::size_t>(geo.shards);
  // Links the home pass made slower than `beat` need not be touched again.
  if (stop.active(pieces) && placer.link_times().first > stop.beat) return false;
  for (std::int32_t i : order) {
    const std::size_t block = static_cast<std::size_t>(i) / S;
    PlacedRows rows = base[static_cast<std::size_t>(i)];
    std::int64_t f = flops[static_cast<std::size_t>(i)];
    for (;;) {
      placer.load_rows(rows, block, /*piece=*/rows.end != base[static_cast<std::size_t>(i)].end);
      int r = placer.least_score(f);
      if (r < 0 && rows.end - rows.begin >= 2) {
        if (const std::int64_t pf = split_off_suffix(geo, placer, block, rows, f, pieces); pf > 0) {
          f -= pf;
          if (stop.met(placer, pieces.back().worker, pieces)) return false;
          continue;
        }
      }
      // Not one row fits anywhere: the least-loaded worker, as TAP does.
      if (r < 0) r = placer.least_loaded();
      placer.commit(r, f);
      rows.worker = r;
      out[static_cast<std::size_t>(i)] = rows;
      if (stop.met(placer, r, pieces)) return false;
      break;
    }
  }
  return true;
}

// Heaviest first, ties lower id, as sortable keys (one array, no
// indirection in the comparisons).
std::vector<std::int32_t> heaviest_first(std::span<const std::int64_t> flops, std::span<const std::int32_t> tiles) {
  std::vector<std::pair<std::int64_t, std::int32_t>> keyed(tiles.size());
  for (std::size_t k = 0; k < tiles.size(); ++k) keyed[k] = {-flops[static_cast<std::size_t>(tiles[k])], tiles[k]};
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::int32_t> order(tiles.size());
  for (std::size_t k = 0; k < tiles.size(); ++k) order[k] = keyed[k].second;
  return order;
}

// The blocks by (home, FLOPs, block id descending): the order each home
// gives up its tiles in, lightest first (tiles of a block share home and
// FLOPs, so only blocks are sorted, once).
std::vector<std::int32_t> blocks_by_home(const Blocks& blocks, std::span<const std::int64_t> flops, std::size_t S) {
  struct Key {
    std::int32_t home;
    std::int64_t flops;
    std::int32_t block;
  };
  std::vector<Key> keys(flops.size() / S);
  for (std::size_t b = 0; b < keys.size(); ++b) keys[b] = {blocks.home[b], flops[b * S], static_cast<std::int32_t>(b)};
  std::sort(keys.begin(), keys.end(), [](const Key& x, const Key& y) {
    if (x.home != y.home) return x.home < y.home;
    if (x.flops != y.flops) return x.flops < y.flops;
    return x.block > y.block;
  });
  std::vector<std::int32_t> order(keys.size());
  for (std::size_t b = 0; b < keys.size(); ++b) order[b] = keys[b].block;
  return order;
}

// One complete placement tap-topo considers: whole tiles by id, the pieces
// split off, and the placer that priced them.
struct Candidate {
  std::vector<PlacedRows> rows;
  std::vector<PlacedRows> pieces;
  std::unique_ptr<TopoPlacer> placer;

  // Within C first; then the faster links (slowest worker, then the sum);
  // then the lower peak load.
  bool better_than(const Candidate& b) const {
    const TopoPlacer& x = *placer;
    if (x.within_capacity() != b.placer->within_capacity()) return x.within_capacity();
    return !x.within_capacity() ? x.max_load() < b.placer->max_load() : x.link_times() < b.placer->link_times();
  }
  std::vector<PlacedRows> result() && {
    rows.insert(rows.end(), pieces.begin(), pieces.end());
    return std::move(rows);
  }
};

// A home pass's state (see Candidates::home_first) for a later one: its
// placer before any tile moved, its order and which tiles it kept.
struct HomePass {
  std::unique_ptr<TopoPlacer> placer;
  std::vector<std::int32_t> order;
  std::vector<char> kept;  // by tile
};

// The candidates of one pool: what they all start from and are priced by.
class Candidates {
 public:
  Candidates(const Geometry& geo, const PlanConfig& config, std::span<const PlacedRows> base,
             std::span<const std::int64_t> flops, double capacity)
      : geo_(geo), config_(config), base_(base), flops_(flops), capacity_(capacity), blocks_(geo, base),
        tiering_(geo, config.topology), S_(static_cast<std::size_t>(geo.shards)), block_order_(blocks_by_home(blocks_, flops, S_)) {}

  // Home first: each home keeps a prefix of its tiles, lightest first (ties:
  // higher id first), optionally whole head shards first, while they fit
  // under keep_cap and C; the rest go heaviest first where the links suffer
  // least. None when `stop` is met first. `save` (where the byte sums are
  // exact): the state after the home pass, for a later pass's `from`,
  // which then redoes only the homes that keep other tiles (a home's
  // commits touch only its own load, bits and receive side, and exact sums
  // do not depend on the order of the commits).
  std::optional<Candidate> home_first(bool whole_shards, std::int64_t keep_cap, const Stop& stop = {},
                                      HomePass* save = nullptr, HomePass&& from = {}) const {
    Candidate c = from.placer ? Candidate{std::vector<PlacedRows>(base_.begin(), base_.end()), {}, std::move(from.placer)}
                              : fresh(std::vector<PlacedRows>(base_.begin(), base_.end()));
    const std::vector<std::int32_t> order = home_order(whole_shards);
    std::vector<std::int32_t> moved;
    std::vector<char> kept(save != nullptr && blocks_.exact ? base_.size() : 0, 0);
    for (std::size_t k = 0; k < order.size();) {
      const int h = home_of(order[k]);
      std::size_t e = k;
      while (e < order.size() && home_of(order[e]) == h) ++e;
      if (!from.order.empty() && same_home_pass(*c.placer, from.kept, order, k, e, keep_cap)) {
        for (; k < e; ++k) {
          const std::int32_t i = order[k];
          if (from.kept[static_cast<std::size_t>(i)] != 0) {
            c.rows[static_cast<std::size_t>(i)].worker = h;
          } else {
            moved.push_back(i);
          }
        }
        continue;
      }
      // The earlier pass's tiles of this home (the same positions in its
      // order: both list the homes in one order) go, in its order.
      for (std::size_t x = k; !from.order.empty() && x < e; ++x) {
        const auto i = static_cast<std::size_t>(from.order[x]);
        if (from.kept[i] != 0) c.placer->uncommit_home(base_[i], i / S_, flops_[i]);
      }
      bool full = false;
      for (; k < e; ++k) {
        const std::int32_t i = order[k];
        const std::int64_t f = flops_[static_cast<std::size_t>(i)];
        if (!full && c.placer->fits_under(h, f, keep_cap)) {
          c.placer->commit_tile(base_[static_cast<std::size_t>(i)], static_cast<std::size_t>(i) / S_, h, f);
          c.rows[static_cast<std::size_t>(i)].worker = h;
          if (!kept.empty()) kept[static_cast<std::size_t>(i)] = 1;
        } else {
          full = true;
          moved.push_back(i);
        }
      }
    }
    if (!kept.empty()) *save = {std::make_unique<TopoPlacer>(*c.placer), order, std::move(kept)};
    if (!place_rest(geo_, *c.placer, base_, flops_, heaviest_first(flops_, moved), c.rows, c.pieces, stop)) {
      return std::nullopt;
    }
    return c;
  }

  // Every tile heaviest first (TAP's order), by the link score. None when
  // `stop` is met first.
  std::optional<Candidate> heaviest_all(const Stop& stop) const {
    Candidate c = fresh(std::vector<PlacedRows>(base_.begin(), base_.end()));
    std::vector<std::int32_t> all(base_.size());
    std::iota(all.begin(), all.end(), 0);
    if (!place_rest(geo_, *c.placer, base_, flops_, heaviest_first(flops_, all), c.rows, c.pieces, stop)) {
      return std::nullopt;
    }
    return c;
  }

  // TAP's own placement, priced the same way. A link's time only grows as
  // tiles commit (bytes are added, never removed), so once TAP's slowest
  // link exceeds `beat` (a candidate's within C) it cannot win: TAP stops
  // there and there is no candidate. Priced as TAP places, in its order:
  // where the byte counts are exact (Blocks::exact) the links end the same
  // as committed in tile order; elsewhere every tile is placed first, then
  // priced in tile order.
  std::optional<Candidate> priced(TapSteps& tap, double beat) const {
    Candidate c = fresh(std::vector<PlacedRows>(base_.begin(), base_.end()));
    std::int32_t i = 0;
    int r = 0;
    if (!blocks_.exact) {
      while (tap.next(i, r)) c.rows[static_cast<std::size_t>(i)].worker = r;
      for (std::size_t k = 0; k < base_.size(); ++k) c.placer->commit_tile(base_[k], k / S_, c.rows[k].worker, flops_[k]);
      return c;
    }
    while (tap.next(i, r)) {
      const auto k = static_cast<std::size_t>(i);
      c.rows[k].worker = r;
      const bool kv = c.placer->commit_tile(base_[k], k / S_, r, flops_[k]);
      if (c.placer->touched_worst(base_[k], k / S_, r, kv) > beat) return std::nullopt;
    }
    return c;
  }
  bool exact() const { return blocks_.exact; }

 private:
  // Whether this pass keeps at home the same tiles of order[k, e) (one
  // home's) as an earlier pass kept (`kept`): the loads alone decide.
  bool same_home_pass(const TopoPlacer& placer, const std::vector<char>& kept, const std::vector<std::int32_t>& order,
                      std::size_t k, std::size_t e, std::int64_t keep_cap) const {
    std::int64_t load = 0;
    bool full = false;
    for (; k < e; ++k) {
      const auto i = static_cast<std::size_t>(order[k]);
      const bool keep = !full && placer.fits_load(load, flops_[i], keep_cap);
      if (keep != (kept[i] != 0)) return false;
      if (keep) {
        load += flops_[i];
      } else {
        full = true;
      }
    }
    return true;
  }

  Candidate fresh(std::vector<PlacedRows> rows) const {
    return {std::move(rows), {}, std::make_unique<TopoPlacer>(geo_, blocks_, tiering_, config_.topology, capacity_)};
  }
  int home_of(std::int32_t i) const { return blocks_.home[static_cast<std::size_t>(i) / S_]; }
  // Each home's tiles from its blocks in block_order_: shard by shard over
  // them (whole shards: (home, shard, FLOPs, id descending)), or each
  // block's shards descending ((home, FLOPs, id descending)).
  std::vector<std::int32_t> home_order(bool whole_shards) const {
    std::vector<std::int32_t> order;
    order.reserve(base_.size());
    auto tile = [&](std::size_t x, std::size_t s) {
      return static_cast<std::int32_t>(static_cast<std::size_t>(block_order_[x]) * S_ + s);
    };
    for (std::size_t k = 0; k < block_order_.size();) {
      std::size_t e = k;
      while (e < block_order_.size() && blocks_.home[static_cast<std::size_t>(block_order_[e])] ==
                                            blocks_.home[static_cast<std::size_t>(block_order_[k])]) {
        ++e;
      }
      if (whole_shards) {
        for (std::size_t s = 0; s < S_; ++s)
          for (std::size_t x = k; x < e; ++x) order.push_back(tile(x, s));
      } else {
        for (std::size_t x = k; x < e; ++x)
          for (std::size_t s = S_; s-- > 0;) order.push_back(tile(x, s));
      }
      k = e;
    }
    return order;
  }

  const Geometry& geo_;
  const PlanConfig& config_;
  std::span<const PlacedRows> base_;
  std::span<const std::int64_t> flops_;
  double capacity_;
  const Blocks blocks_;
  const Tiering tiering_;
  std::size_t S_;
  std::vector<std::int32_t> block_order_;
};

// A candidate that had to split a tile does not count: a tighter packing
// of whole tiles may still do better.
bool none_within(const std::vector<Candidate>& cands) {
  return std::none_of(cands.begin(), cands.end(),
                      [](const Candidate& c) { return c.pieces.empty() && c.placer->within_capacity(); });
}

}  // namespace

std::atomic<bool> topo_stops_early{true};
std::atomic<bool> topo_shares_home_pass{true};

std::vector<PlacedRows> place_topo(const Geometry& geo, const PlanConfig& config, std::span<const PlacedRows> base,
                                   std::span<const std::int64_t> flops, double capacity,
                                   TapSteps& tap) {
  const Candidates make(geo, config, base, flops, capacity);
  constexpr bool lightest = false, by_shard = true;
  constexpr std::int64_t kNoCap = std::numeric_limits<std::int64_t>::max();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  const bool stops = topo_stops_early.load(std::memory_order_relaxed);
  std::vector<Candidate> cands;
  // A. Lightest first: a light tile moves the most bytes per FLOP.
  HomePass pass;  // A's home pass, where B keeps the same tiles at home
  cands.push_back(*make.home_first(lightest, kNoCap, {},
                                   topo_shares_home_pass.load(std::memory_order_relaxed) ? &pass : nullptr));
  if (cands[0].placer->within_capacity() && cands[0].placer->link_times().first == 0) return std::move(cands[0]).result();
  // Ties: the earlier candidate.
  auto best_of = [&cands] {
    std::size_t best = 0;
    for (std::size_t k = 1; k < cands.size(); ++k) {
      if (cands[k].better_than(cands[best])) best = k;
    }
    return best;
  };
  // The slowest link a later candidate must beat: the best's so far where
  // that one is within C.
  auto beat = [&] {
    const TopoPlacer& lead = *cands[best_of()].placer;
    return stops && lead.within_capacity() ? lead.link_times().first : kNone;
  };
  // A stopped candidate (see Stop) is left out: it would not have won. Only
  // where the byte counts are exact, as for D. `read`: a later none_within()
  // reads the candidate.
  auto stop = [&](bool read) { return Stop{make.exact() ? beat() : kNone, read && none_within(cands)}; };
  auto add = [&cands](std::optional<Candidate> c) {
    if (c) cands.push_back(std::move(*c));
  };
  // B. Whole head shards first, lightest first within a shard: the tiles
  //    that leave then share fewer KV groups (a long sample's KV goes out
  //    once per moved shard and destination, not once per shard).
  add(make.home_first(by_shard, kNoCap, stop(true), nullptr, std::move(pass)));
  // When neither fits its moved tiles under C, the homes kept too much: the
  //    same with each home keeping at most the mean load leaves the room the
  //    moved tiles need, and still keeps most of the FLOPs home.
  if (none_within(cands)) {
    std::int64_t total = 0;
    for (std::int64_t f : flops) total += f;
    const std::int64_t mean = total / geo.workers;
    add(make.home_first(lightest, mean, stop(true)));
    add(make.home_first(by_shard, mean, stop(true)));
  }
  // C. Every tile heaviest first (TAP's order, which packs tightest), by the
  //    same link score: where the home-first passes cannot fit their moved
  //    tiles under C, this one usually can. Only then is it worth its time.
  if (none_within(cands)) add(make.heaviest_all(stop(false)));
  // D. TAP itself, so tap-topo's links are never slower than tap's where
  //    both fit under C: it wins only with a lower slowest link than the
  //    best so far when that one is within C.
  add(make.priced(tap, beat()));
  return std::move(cands[best_of()]).result();
}

}  // namespace libra::detail
