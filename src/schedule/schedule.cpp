// The per-rank schedule: a plan (or the Ulysses definition) turned into the
// exchanges, kernel calls and buffer layout of one worker. Pure: the same
// plan gives every worker schedules that match piece for piece, because each
// side derives a message from the same plan lists in the same order.
#include "libra/schedule.hpp"

#include <fmt/format.h>

#include "libra/relay.hpp"

#include <algorithm>
#include <map>
#include <tuple>

namespace libra {

namespace {

constexpr Field kQOnly[] = {Field::kQ};
constexpr Field kKv[] = {Field::kK, Field::kV};
constexpr Field kOLse[] = {Field::kO, Field::kLse};
constexpr Field kBwdQ[] = {Field::kQ, Field::kDo, Field::kO, Field::kLse};
constexpr Field kDq[] = {Field::kDq};
constexpr Field kDkv[] = {Field::kDk, Field::kDv};

std::uint64_t mix64(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  return h;
}

bool is_in(Phase p) { return p == Phase::kFwdIn || p == Phase::kBwdIn; }

// Builds one worker's schedule piece by piece.
class Builder {
 public:
  explicit Builder(RankSchedule& s) : s_(s) {
    for (auto& per_phase : s_.exchanges) {
      per_phase.assign(static_cast<std::size_t>(s_.chunks), Exchange{});
      for (Exchange& x : per_phase) {
        x.send.assign(static_cast<std::size_t>(s_.workers), {});
        x.recv.assign(static_cast<std::size_t>(s_.workers), {});
      }
    }
    for (auto& per_pass : s_.kernel_calls) per_pass.assign(static_cast<std::size_t>(s_.chunks), {});
    if (s_.relayed) {
      for (auto& per_pass : s_.stage_exchanges) {
        per_pass.assign(static_cast<std::size_t>(s_.chunks), Exchange{});
        for (Exchange& x : per_pass) {
          x.send.assign(static_cast<std::size_t>(s_.workers), {});
          x.recv.assign(static_cast<std::size_t>(s_.workers), {});
        }
      }
    }
  }

  Strided home(bool kv, std::int64_t t0, std::int64_t t1, std::int32_t h0, std::int32_t h1) const {
    const std::int64_t heads = kv ? s_.heads_kv : s_.heads_q;
    return {s_.home_row(t0) * heads + h0, t1 - t0, h1 - h0, heads};
  }
  // Rows [t0, t1) lie in one run (tile rows, or a sample's tokens within a
  // home shard, always do).
  Strided compute(const Region& r, bool kv, std::int64_t t0, std::int64_t t1, std::int32_t h0, std::int32_t h1) const {
    const HeadRange hr = kv ? r.kv_heads : r.q_heads;
    const std::int64_t row = kv ? r.kv_row(t0) : r.q_row(t0);
    return {(kv ? r.kv_offset : r.q_offset) + row * hr.size() + (h0 - hr.begin), t1 - t0, h1 - h0, hr.size()};
  }

  // Rows [t0, t1) x heads [h0, h1) of `slot` travel from worker `src` to
  // worker `dst` in (phase, m); this worker is one or both of them.
  // `compute_region` is the region on whichever side holds compute buffers.
  void item(Phase p, int m, int src, int dst, bool kv, std::int32_t slot, std::int64_t t0, std::int64_t t1,
            std::int32_t h0, std::int32_t h1, const Region* src_region, const Region* dst_region, bool add = false) {
    Exchange& x = s_.exchanges[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
    const bool in = is_in(p);
    for (Field f : phase_fields(p, kv)) {
      if (src == s_.worker) {
        const Strided at = in ? home(kv, t0, t1, h0, h1) : compute(*src_region, kv, t0, t1, h0, h1);
        x.send[static_cast<std::size_t>(dst)].push_back(Segment{f, false, slot, t0, t1, h0, h1, at});
      }
      if (dst == s_.worker) {
        const Strided at = in ? compute(*dst_region, kv, t0, t1, h0, h1) : home(kv, t0, t1, h0, h1);
        x.recv[static_cast<std::size_t>(src)].push_back(Segment{f, add, slot, t0, t1, h0, h1, at});
      }
    }
  }

  // An In item relayed src -> via -> dst: src's home rows go to via's
  // staging buffer at `stage_offset` (contiguous rows x heads) in the
  // pass's stage exchange of chunk m, and from there to dst's compute buffer
  // in the chunk's main exchange. This worker is src, via or dst.
  void relayed_item(Phase p, int m, int src, int via, int dst, bool kv, std::int32_t slot, std::int64_t t0,
                    std::int64_t t1, std::int32_t h0, std::int32_t h1, const Region* dst_region,
                    std::int64_t stage_offset) {
    const auto pass = static_cast<std::size_t>(p == Phase::kFwdIn ? Pass::kForward : Pass::kBackward);
    Exchange& stage = s_.stage_exchanges[pass][static_cast<std::size_t>(m)];
    Exchange& x = s_.exchanges[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
    const Strided staged{stage_offset, t1 - t0, h1 - h0, h1 - h0};
    for (Field f : phase_fields(p, kv)) {
      if (src == s_.worker) {
        stage.send[static_cast<std::size_t>(via)].push_back(Segment{f, false, slot, t0, t1, h0, h1, home(kv, t0, t1, h0, h1)});
      }
      if (via == s_.worker) {
        stage.recv[static_cast<std::size_t>(src)].push_back(Segment{f, false, slot, t0, t1, h0, h1, staged, true});
        x.send[static_cast<std::size_t>(dst)].push_back(Segment{f, false, slot, t0, t1, h0, h1, staged, true});
      }
      if (dst == s_.worker) {
        x.recv[static_cast<std::size_t>(via)].push_back(
            Segment{f, false, slot, t0, t1, h0, h1, compute(*dst_region, kv, t0, t1, h0, h1)});
      }
    }
  }

  void finish() {
    std::vector<Exchange*> all;
    for (auto& per_phase : s_.exchanges)
      for (Exchange& x : per_phase) all.push_back(&x);
    for (auto& per_pass : s_.stage_exchanges)
      for (Exchange& x : per_pass) all.push_back(&x);
    {
      for (Exchange* xp : all) {
        Exchange& x = *xp;
        auto sizes = [&](const std::vector<std::vector<Segment>>& lists, std::vector<std::int64_t>& bytes,
                         std::vector<std::int64_t>& displs, std::int64_t& total) {
          bytes.assign(lists.size(), 0);
          displs.assign(lists.size(), 0);
          total = 0;
          for (std::size_t p = 0; p < lists.size(); ++p) {
            for (const Segment& seg : lists[p]) bytes[p] += seg.at.count() * s_.vector_bytes(seg.field);
            displs[p] = total;
            total += bytes[p];
          }
        };
        sizes(x.send, x.send_bytes, x.send_displs, x.total_send_bytes);
        sizes(x.recv, x.recv_bytes, x.recv_displs, x.total_recv_bytes);
      }
    }
    s_.apply_order.clear();
    for (int p = 0; p < s_.workers; ++p)
      for (int m = 0; m < s_.chunks; ++m) s_.apply_order.emplace_back(p, m);
  }

 private:
  RankSchedule& s_;
};

// Kernel calls of one chunk: the chunk's query heads of each tile, merged
// across tiles of one region with the same heads (their query rows are
// disjoint), split per KV head where the kernel's i / (h_q / h_kv) rule
// cannot express the mapping.
class CallList {
 public:
  // Calls are keyed by where their views live as well as by heads: a call's
  // fragments share one Q view and one KV view.
  struct Where {
    std::int32_t region = 0;
    bool q_home = false, kv_home = false;
    friend bool operator==(const Where&, const Where&) = default;
  };
  void add(Where w, std::int32_t h0, std::int32_t h1, std::int32_t k0, std::int32_t k1,
           const std::vector<CallFragment>& frags) {
    if (frags.empty()) return;
    for (Pending& c : calls_) {
      if (c.where == w && c.h0 == h0 && c.h1 == h1 && c.k0 == k0 && c.k1 == k1) {
        c.frags.insert(c.frags.end(), frags.begin(), frags.end());
        return;
      }
    }
    calls_.push_back({w, h0, h1, k0, k1, frags});
  }
  void add_split(Where w, HeadRange ch, int grp, const std::vector<CallFragment>& frags) {
    const int k0 = ch.begin / grp, k1 = (ch.end - 1) / grp + 1;
    const int n = ch.size(), nk = k1 - k0;
    bool uniform = n % nk == 0;
    for (int i = 0; uniform && i < n; ++i) uniform = (ch.begin + i) / grp - k0 == i / (n / nk);
    if (uniform) {
      add(w, ch.begin, ch.end, k0, k1, frags);
      return;
    }
    for (int k = k0; k < k1; ++k) add(w, std::max(ch.begin, k * grp), std::min(ch.end, (k + 1) * grp), k, k + 1, frags);
  }
  void emit(RankSchedule& s, Pass pass, int m) {
    auto& out = s.kernel_calls[static_cast<std::size_t>(pass)][static_cast<std::size_t>(m)];
    for (const Pending& c : calls_) {
      const Region& r = s.regions[static_cast<std::size_t>(c.where.region)];
      KernelCall k;
      k.region = c.where.region;
      k.h0 = c.h0;
      k.h1 = c.h1;
      k.k0 = c.k0;
      k.k1 = c.k1;
      k.q_home = c.where.q_home;
      k.kv_home = c.where.kv_home;
      k.q = k.q_home ? Strided{c.h0, s.home_rows, c.h1 - c.h0, s.heads_q}
                     : Strided{r.q_offset + (c.h0 - r.q_heads.begin), r.q_row_count, c.h1 - c.h0, r.q_heads.size()};
      k.kv = k.kv_home ? Strided{c.k0, s.home_rows, c.k1 - c.k0, s.heads_kv}
                       : Strided{r.kv_offset + (c.k0 - r.kv_heads.begin), r.kv_row_count, c.k1 - c.k0, r.kv_heads.size()};
      k.fragment_begin = static_cast<std::int32_t>(s.fragments.size());
      s.fragments.insert(s.fragments.end(), c.frags.begin(), c.frags.end());
      k.fragment_end = static_cast<std::int32_t>(s.fragments.size());
      out.push_back(k);
    }
  }

 private:
  struct Pending {
    Where where;
    std::int32_t h0, h1, k0, k1;
    std::vector<CallFragment> frags;
  };
  std::vector<Pending> calls_;
};

// Sorted, merged runs of the given row ranges, packed from row 0.
std::vector<RowRun> pack_runs(std::vector<std::pair<std::int64_t, std::int64_t>> ranges, std::int64_t& count) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<RowRun> runs;
  for (auto [b, e] : ranges) {
    if (b >= e) continue;
    if (!runs.empty() && b <= runs.back().end) {
      runs.back().end = std::max(runs.back().end, e);
    } else {
      runs.push_back({b, e, 0});
    }
  }
  count = 0;
  for (RowRun& r : runs) {
    r.at = count;
    count += r.end - r.begin;
  }
  return runs;
}

// Home rows of CP rank c that hold tokens: samples are packed from position
// 0, padding follows them. Counted run by run of the home.
std::int64_t home_tokens(const PackedSequence& seq, const HomeMap& map, int c) {
  std::int64_t tokens = 0, at_home = 0;
  for (std::int64_t l : seq) tokens += l;
  for (std::int64_t i = 0; i < map.rows();) {
    const std::int64_t x = map.packed_row(c, i);
    const std::int64_t len = map.locate(x).run_end - x;
    at_home += std::clamp<std::int64_t>(tokens - x, 0, len);
    i += len;
  }
  return at_home;
}

void assign_offsets(RankSchedule& s) {
  std::int64_t q = 0, kv = 0;
  for (Region& r : s.regions) {
    r.q_offset = q;
    r.kv_offset = kv;
    q += r.q_row_count * r.q_heads.size();
    kv += r.kv_row_count * r.kv_heads.size();
  }
  s.compute_q_vectors = q;
  s.compute_kv_vectors = kv;
}

}  // namespace

std::int64_t Region::find(const std::vector<RowRun>& runs, std::int64_t t) {
  auto it = std::upper_bound(runs.begin(), runs.end(), t, [](std::int64_t x, const RowRun& r) { return x < r.begin; });
  if (it == runs.begin()) return -1;
  --it;
  return t < it->end ? it->at + (t - it->begin) : -1;
}

const char* field_name(Field f) {
  static const char* kNames[] = {"Q", "K", "V", "O", "LSE", "dO", "dQ", "dK", "dV"};
  return kNames[static_cast<int>(f)];
}

const char* phase_name(Phase p) {
  static const char* kNames[] = {"fwd in", "fwd out", "bwd in", "bwd out"};
  return kNames[static_cast<int>(p)];
}

std::span<const Field> phase_fields(Phase p, bool kv) {
  switch (p) {
    case Phase::kFwdIn: return kv ? std::span<const Field>(kKv) : std::span<const Field>(kQOnly);
    case Phase::kFwdOut: return kv ? std::span<const Field>() : std::span<const Field>(kOLse);
    case Phase::kBwdIn: return kv ? std::span<const Field>(kKv) : std::span<const Field>(kBwdQ);
    case Phase::kBwdOut: return kv ? std::span<const Field>(kDkv) : std::span<const Field>(kDq);
  }
  return {};
}

Result<RankSchedule> make_rank_schedule(const Plan& plan, int worker, const ScheduleOptions& options) {
  const PlanConfig& cfg = plan.config();
  const int W = plan.num_workers();
  if (worker < 0 || worker >= W) {
    return invalid_input(fmt::format("schedule: worker {} outside the plan's {} workers", worker, W));
  }
  RankSchedule s;
  s.worker = worker;
  s.workers = W;
  s.cp = cfg.cp;
  s.chunks = cfg.chunks;
  s.heads_q = cfg.shape.heads_q;
  s.heads_kv = cfg.shape.heads_kv;
  s.head_dim = cfg.shape.head_dim;
  s.dtype = cfg.shape.dtype;
  s.window = cfg.shape.window;
  s.slot = worker / cfg.cp;
  s.home_map = cfg.home_map();
  s.home_rows = s.home_map.rows();
  s.home_row0 = s.packed_row(0);
  s.home_tokens = home_tokens(plan.pool()[static_cast<std::size_t>(s.slot)], s.home_map, worker % cfg.cp);
  s.fingerprint = plan.fingerprint();
  s.what = "plan";
  const int grp = s.heads_q / s.heads_kv;
  const auto tiles = plan.tiles();
  const auto frags = plan.fragments();
  const auto groups = plan.groups();
  const auto my_tiles = plan.worker_tiles(worker);
  // What the kernel reads in place: a tile on its own Q home; a sample whose
  // tokens all lie in one home run of this worker (its keys are then
  // contiguous at home too).
  const bool in_place = options.read_home_in_place;
  auto q_at_home = [&](const Tile& t) { return in_place && t.home == worker; };
  // The K/V this worker reads of group g: the whole sample, or its causal
  // prefix (PlanConfig::kv_prefix); it always starts at the sample's start.
  auto span_of = [&](std::int32_t gid) { return plan.kv_span(worker, gid); };
  auto kv_at_home = [&](const KvGroup& g, TokenSpan span) {
    if (!in_place || g.slot != s.slot) return false;
    const HomeSpot h = s.home_map.locate(span.begin);
    return h.rank == worker % cfg.cp && span.end <= h.run_end;
  };

  // Regions: every slot this worker computes on, with the rows and heads of
  // its tiles (Q family) and the tokens and KV heads of the groups they use
  // (KV family).
  struct Touched {
    Region r;
    std::vector<std::pair<std::int64_t, std::int64_t>> q, kv;
  };
  std::map<std::int32_t, Touched> by_slot;
  auto grow = [](HeadRange& into, HeadRange h) {
    if (h.size() <= 0) return;
    into = into.size() <= 0 ? h : HeadRange{std::min(into.begin, h.begin), std::max(into.end, h.end)};
  };
  for (std::int32_t id : my_tiles) {
    const Tile& t = tiles[static_cast<std::size_t>(id)];
    Touched& x = by_slot[t.slot];
    x.r.slot = t.slot;
    if (!q_at_home(t)) {
      grow(x.r.q_heads, t.heads);
      x.q.emplace_back(t.begin, t.end);
    }
    for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
      const std::int32_t gid = frags[static_cast<std::size_t>(f)].group;
      const KvGroup& g = groups[static_cast<std::size_t>(gid)];
      const TokenSpan span = span_of(gid);
      if (kv_at_home(g, span)) continue;
      grow(x.r.kv_heads, t.kv_heads);
      grow(x.r.kv_heads, g.kv_heads);
      x.kv.emplace_back(span.begin, span.end);
    }
  }
  std::map<std::int32_t, std::int32_t> region_of;
  for (auto& [slot, x] : by_slot) {
    x.r.q_rows = pack_runs(std::move(x.q), x.r.q_row_count);
    x.r.kv_rows = pack_runs(std::move(x.kv), x.r.kv_row_count);
    region_of[slot] = static_cast<std::int32_t>(s.regions.size());
    s.regions.push_back(std::move(x.r));
  }
  assign_offsets(s);
  auto region = [&](std::int32_t slot) -> const Region* {
    auto it = region_of.find(slot);
    return it == region_of.end() ? nullptr : &s.regions[static_cast<std::size_t>(it->second)];
  };

  // Relays exist only when asked for and the plan has some, so every rank
  // decides alike from the plan; the fingerprint carries the choice, so a
  // rank that was not asked does not run a different exchange silently.
  RelayTable relays;
  if (options.relay) {
    relays = plan_relays(plan);
    s.relayed = relays.any();
  }
  if (s.relayed) s.fingerprint = mix64(s.fingerprint, 0x72656c6179ULL);  // "relay"
  Builder b(s);
  // dK/dV returns, one per (from worker, to home, slot, rows, KV head): a
  // head fetched once per head shard (contract dedup, H > h_kv) lands in one
  // place of the worker's compute buffer, whose gradient sums every shard's
  // contribution, so it goes home once, with the chunk of its last use.
  using Cell = std::tuple<int, int, std::int32_t, std::int64_t, std::int64_t, std::int32_t>;
  std::map<Cell, int> last_use;
  std::map<Cell, int> first_use;  // local cells only: when the resident rows are copied in

  // Remote transfers of the plan, chunk by chunk, in the plan's order.
  for (int m = 0; m < s.chunks; ++m) {
    for (int src = 0; src < W; ++src) {
      for (int dst = 0; dst < W; ++dst) {
        const int via = s.relayed ? relays.via(m, src, dst) : src;
        if (src != worker && dst != worker && via != worker) continue;
        for (const Transfer& x : plan.chunk_transfers(m, src, dst)) {
          const std::int32_t h0 = x.heads.begin, h1 = x.heads.end;
          // Both passes' inputs of a relayed item share one staging place.
          auto input = [&](bool kv) {
            if (via == src) {
              b.item(Phase::kFwdIn, m, src, dst, kv, x.slot, x.begin, x.end, h0, h1, nullptr, region(x.slot));
              b.item(Phase::kBwdIn, m, src, dst, kv, x.slot, x.begin, x.end, h0, h1, nullptr, region(x.slot));
              return;
            }
            std::int64_t at = 0;
            if (via == worker) {
              std::int64_t& cursor = kv ? s.stage_kv_vectors : s.stage_q_vectors;
              at = cursor;
              cursor += (x.end - x.begin) * (h1 - h0);
            }
            for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) {
              b.relayed_item(p, m, src, via, dst, kv, x.slot, x.begin, x.end, h0, h1, region(x.slot), at);
            }
          };
          switch (x.kind) {
            case TransferKind::kQ:
              input(false);
              break;
            case TransferKind::kKv:
              input(true);
              if (src != worker && dst != worker) break;
              for (std::int32_t k = h0; k < h1; ++k) {
                const int last = plan.kv_use(dst, x.group, k).last;
                auto [it, fresh] = last_use.try_emplace(Cell{dst, src, x.slot, x.begin, x.end, k}, last);
                if (!fresh) it->second = std::max(it->second, last);
              }
              break;
            case TransferKind::kO:
              if (src != worker && dst != worker) break;
              b.item(Phase::kFwdOut, m, src, dst, false, x.slot, x.begin, x.end, h0, h1, region(x.slot), nullptr);
              b.item(Phase::kBwdOut, m, src, dst, false, x.slot, x.begin, x.end, h0, h1, region(x.slot), nullptr);
              break;
          }
        }
      }
    }
  }

  // Tiles computed on their own Q home and not read in place move through
  // the message to self.
  for (std::int32_t id : my_tiles) {
    const Tile& t = tiles[static_cast<std::size_t>(id)];
    if (t.home != worker || q_at_home(t)) continue;
    const Region* r = region(t.slot);
    for (int m = 0; m < s.chunks; ++m) {
      const HeadRange ch = plan.chunk_heads(t, m);
      for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) b.item(p, m, worker, worker, false, t.slot, t.begin, t.end, ch.begin, ch.end, nullptr, r);
      for (Phase p : {Phase::kFwdOut, Phase::kBwdOut}) b.item(p, m, worker, worker, false, t.slot, t.begin, t.end, ch.begin, ch.end, r, nullptr);
    }
  }

  // KV tokens resident on this worker: in with the first use of each head,
  // home with the last.
  for (std::int32_t gid : plan.worker_groups(worker)) {
    const KvGroup& g = groups[static_cast<std::size_t>(gid)];
    const TokenSpan span = span_of(gid);
    if (g.slot != s.slot || kv_at_home(g, span)) continue;
    // Each home run of the tokens read on this worker is one rectangle.
    for (std::int64_t t0 = span.begin; t0 < span.end;) {
      const HomeSpot h = s.home_map.locate(t0);
      const std::int64_t t1 = std::min(span.end, h.run_end);
      if (h.rank == worker % cfg.cp) {
        for (std::int32_t k = g.kv_heads.begin; k < g.kv_heads.end; ++k) {
          const ChunkUse u = plan.kv_use(worker, gid, k);
          if (!u.used()) continue;
          const Cell c{worker, worker, g.slot, t0, t1, k};
          auto [lt, fresh_l] = last_use.try_emplace(c, u.last);
          if (!fresh_l) lt->second = std::max(lt->second, u.last);
          auto [ft, fresh_f] = first_use.try_emplace(c, u.first);
          if (!fresh_f) ft->second = std::min(ft->second, u.first);
        }
      }
      t0 = t1;
    }
  }
  // With kv_prefix two groups of one KV head (head shards sharing it, H >
  // h_kv) may hold different prefixes of the same run: [t0, t1) and [t0,
  // t1'). Both land in one place of the compute buffer, so the rows go in
  // and their dK/dV home once, as the longer range: [t0, max t1), at the
  // earliest first and the latest last use.
  auto merge_prefixes = [](std::map<Cell, int>& cells, bool earliest) {
    std::map<std::tuple<int, int, std::int32_t, std::int64_t, std::int32_t>, std::pair<std::int64_t, int>> by_start;
    for (const auto& [c, chunk] : cells) {
      auto [from, to, slot, t0, t1, k] = c;
      auto [it, fresh] = by_start.try_emplace({from, to, slot, t0, k}, t1, chunk);
      if (fresh) continue;
      it->second.first = std::max(it->second.first, t1);
      it->second.second = earliest ? std::min(it->second.second, chunk) : std::max(it->second.second, chunk);
    }
    if (by_start.size() == cells.size()) return;
    cells.clear();
    for (const auto& [key, v] : by_start) {
      auto [from, to, slot, t0, k] = key;
      cells.emplace(Cell{from, to, slot, t0, v.first, k}, v.second);
    }
  };
  merge_prefixes(first_use, true);
  merge_prefixes(last_use, false);
  // Consecutive heads of one (from, to, slot, rows) with the same chunk
  // become one rectangle.
  auto for_runs = [](const std::map<Cell, int>& cells, auto&& emit) {
    for (auto it = cells.begin(); it != cells.end();) {
      auto [from, to, slot, t0, t1, k] = it->first;
      const int chunk = it->second;
      std::int32_t end = k + 1;
      auto next = std::next(it);
      while (next != cells.end()) {
        auto [f2, to2, s2, a2, e2, k2] = next->first;
        if (f2 != from || to2 != to || s2 != slot || a2 != t0 || e2 != t1 || k2 != end || next->second != chunk) break;
        ++end;
        ++next;
      }
      emit(from, to, slot, t0, t1, k, end, chunk);
      it = next;
    }
  };
  for_runs(first_use, [&](int, int, std::int32_t slot, std::int64_t t0, std::int64_t t1, std::int32_t k0,
                          std::int32_t k1, int chunk) {
    for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) b.item(p, chunk, worker, worker, true, slot, t0, t1, k0, k1, nullptr, region(slot));
  });
  for_runs(last_use, [&](int from, int to, std::int32_t slot, std::int64_t t0, std::int64_t t1, std::int32_t k0,
                         std::int32_t k1, int chunk) {
    b.item(Phase::kBwdOut, chunk, from, to, true, slot, t0, t1, k0, k1, region(slot), nullptr, /*add=*/true);
  });

  // Kernel calls, fragments relative to their region's rows.
  for (int m = 0; m < s.chunks; ++m) {
    CallList calls;
    for (std::int32_t id : my_tiles) {
      const Tile& t = tiles[static_cast<std::size_t>(id)];
      const std::int32_t ri = region_of.at(t.slot);
      const Region& r = s.regions[static_cast<std::size_t>(ri)];
      const bool q_home = q_at_home(t);
      std::vector<CallFragment> split[2];  // by whether the sample's K/V is read in place
      for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
        const Fragment& x = frags[static_cast<std::size_t>(f)];
        const bool kv_home = kv_at_home(groups[static_cast<std::size_t>(x.group)], span_of(x.group));
        const std::int64_t q_row = q_home ? s.home_row(x.sample_start + x.a) : r.q_row(x.sample_start + x.a);
        const std::int64_t kv_row = kv_home ? s.home_row(x.sample_start) : r.kv_row(x.sample_start);
        split[kv_home].push_back({q_row, kv_row, x.sample_length, x.a, x.e});
      }
      for (int kv_home = 0; kv_home < 2; ++kv_home) {
        calls.add_split({ri, q_home, kv_home == 1}, plan.chunk_heads(t, m), grp, split[kv_home]);
      }
    }
    calls.emit(s, Pass::kForward, m);
    s.kernel_calls[1][static_cast<std::size_t>(m)] = s.kernel_calls[0][static_cast<std::size_t>(m)];
  }
  b.finish();
  return s;
}

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
  RankSchedule s;
  s.worker = worker;
  s.workers = W;
  s.cp = cp;
  s.chunks = 1;
  s.heads_q = hq;
  s.heads_kv = hkv;
  s.head_dim = config.shape.head_dim;
  s.dtype = config.shape.dtype;
  s.window = config.shape.window;
  s.slot = worker / cp;
  s.home_map = c.home_map();
  s.home_rows = config.seq_len / cp;
  s.home_row0 = static_cast<std::int64_t>(worker % cp) * s.home_rows;
  s.home_tokens = home_tokens(pool[static_cast<std::size_t>(s.slot)], s.home_map, worker % cp);
  s.what = "ulysses pool and configuration";
  std::uint64_t fp = mix64(0x756c7973736573ULL, static_cast<std::uint64_t>(config.seq_len));
  for (std::int64_t v : {std::int64_t{cp}, std::int64_t{hq}, std::int64_t{hkv}, std::int64_t{config.shape.head_dim},
                         static_cast<std::int64_t>(dtype_code(config.shape.dtype)), config.shape.window}) {
    fp = mix64(fp, static_cast<std::uint64_t>(v));
  }
  for (const auto& seq : pool) {
    fp = mix64(fp, seq.size());
    for (std::int64_t l : seq) fp = mix64(fp, static_cast<std::uint64_t>(l));
  }
  s.fingerprint = fp;

  const int grp = hq / hkv, nq = hq / cp, me = worker % cp, base = s.slot * cp;
  auto q_heads = [&](int r) { return HeadRange{r * nq, (r + 1) * nq}; };
  auto kv_heads = [&](int r) { return HeadRange{r * nq / grp, ((r + 1) * nq - 1) / grp + 1}; };
  const std::int64_t lc = s.home_rows, lo = me * lc, hi = lo + lc;
  // Samples inside my home shard are computed at home (ScheduleOptions);
  // the compute region then holds every other row: the peers' shards, and
  // of mine only the parts of samples that cross into a peer's shard.
  std::vector<CallFragment> at_home, in_compute;
  std::vector<std::pair<std::int64_t, std::int64_t>> mine;  // my shard's rows in the region
  std::int64_t start = 0;
  for (std::int64_t len : pool[static_cast<std::size_t>(s.slot)]) {
    if (options.read_home_in_place && start >= lo && start + len <= hi) {
      at_home.push_back({start - lo, start - lo, len, 0, len});
    } else {
      in_compute.push_back({start, start, len, 0, len});
      if (options.read_home_in_place && start < hi && start + len > lo) mine.emplace_back(std::max(start, lo), std::min(start + len, hi));
    }
    start += len;
  }
  if (!options.read_home_in_place) mine = {{lo, hi}};
  std::vector<std::pair<std::int64_t, std::int64_t>> rows = mine;
  rows.emplace_back(0, lo);
  rows.emplace_back(hi, config.seq_len);
  Region whole;
  whole.slot = s.slot;
  whole.q_heads = q_heads(me);
  whole.kv_heads = kv_heads(me);
  whole.q_rows = pack_runs(rows, whole.q_row_count);
  whole.kv_rows = pack_runs(rows, whole.kv_row_count);
  s.regions.push_back(whole);
  assign_offsets(s);
  const Region* r = &s.regions[0];
  Builder b(s);
  for (int peer = 0; peer < cp; ++peer) {
    const int w = base + peer;
    for (Phase p : {Phase::kFwdIn, Phase::kBwdIn}) {
      if (w == worker) {
        for (auto [t0, t1] : mine) {
          b.item(p, 0, worker, worker, false, s.slot, t0, t1, q_heads(me).begin, q_heads(me).end, nullptr, r);
          b.item(p, 0, worker, worker, true, s.slot, t0, t1, kv_heads(me).begin, kv_heads(me).end, nullptr, r);
        }
        continue;
      }
      // Head scatter: my rows of the peer's heads go to the peer; its rows of my heads come here.
      b.item(p, 0, worker, w, false, s.slot, lo, hi, q_heads(peer).begin, q_heads(peer).end, nullptr, nullptr);
      b.item(p, 0, worker, w, true, s.slot, lo, hi, kv_heads(peer).begin, kv_heads(peer).end, nullptr, nullptr);
      b.item(p, 0, w, worker, false, s.slot, peer * lc, (peer + 1) * lc, q_heads(me).begin, q_heads(me).end, nullptr, r);
      b.item(p, 0, w, worker, true, s.slot, peer * lc, (peer + 1) * lc, kv_heads(me).begin, kv_heads(me).end, nullptr, r);
    }
  }
  // Gather back: outputs of the peer's rows for my heads go to the peer.
  for (int peer = 0; peer < cp; ++peer) {
    const int w = base + peer;
    if (w == worker) {
      for (auto [t0, t1] : mine) {
        b.item(Phase::kFwdOut, 0, worker, worker, false, s.slot, t0, t1, q_heads(me).begin, q_heads(me).end, r, nullptr);
        b.item(Phase::kBwdOut, 0, worker, worker, false, s.slot, t0, t1, q_heads(me).begin, q_heads(me).end, r, nullptr);
        b.item(Phase::kBwdOut, 0, worker, worker, true, s.slot, t0, t1, kv_heads(me).begin, kv_heads(me).end, r, nullptr, true);
      }
      continue;
    }
    b.item(Phase::kFwdOut, 0, worker, w, false, s.slot, peer * lc, (peer + 1) * lc, q_heads(me).begin, q_heads(me).end, r, nullptr);
    b.item(Phase::kBwdOut, 0, worker, w, false, s.slot, peer * lc, (peer + 1) * lc, q_heads(me).begin, q_heads(me).end, r, nullptr);
    b.item(Phase::kBwdOut, 0, worker, w, true, s.slot, peer * lc, (peer + 1) * lc, kv_heads(me).begin, kv_heads(me).end, r, nullptr, true);
    b.item(Phase::kFwdOut, 0, w, worker, false, s.slot, lo, hi, q_heads(peer).begin, q_heads(peer).end, nullptr, nullptr);
    b.item(Phase::kBwdOut, 0, w, worker, false, s.slot, lo, hi, q_heads(peer).begin, q_heads(peer).end, nullptr, nullptr);
    b.item(Phase::kBwdOut, 0, w, worker, true, s.slot, lo, hi, kv_heads(peer).begin, kv_heads(peer).end, nullptr, nullptr, true);
  }
  for (CallFragment& f : in_compute) {
    f.q_row = whole.q_row(f.q_row);
    f.kv_row = whole.kv_row(f.kv_row);
  }
  CallList calls;
  calls.add({0, false, false}, q_heads(me).begin, q_heads(me).end, kv_heads(me).begin, kv_heads(me).end, in_compute);
  calls.add({0, true, true}, q_heads(me).begin, q_heads(me).end, kv_heads(me).begin, kv_heads(me).end, at_home);
  calls.emit(s, Pass::kForward, 0);
  s.kernel_calls[1][0] = s.kernel_calls[0][0];
  b.finish();
  return s;
}

}  // namespace libra
