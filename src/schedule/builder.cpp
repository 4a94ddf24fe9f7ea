// The pieces both schedules are assembled from (builder.hpp).
#include "schedule/builder.hpp"

#include <algorithm>

namespace libra::schedule_detail {

namespace {

bool is_in(Phase p) { return p == Phase::kFwdIn || p == Phase::kBwdIn; }

// One exchange per chunk, each with a list per peer.
void size_exchanges(std::vector<Exchange>& per_chunk, int chunks, int workers) {
  per_chunk.assign(static_cast<std::size_t>(chunks), Exchange{});
  for (Exchange& x : per_chunk) {
    x.send.assign(static_cast<std::size_t>(workers), {});
    x.recv.assign(static_cast<std::size_t>(workers), {});
  }
}

// Bytes per peer of a side's lists, their displacements and total.
void count_bytes(const RankSchedule& s, const std::vector<std::vector<Segment>>& lists, std::vector<std::int64_t>& bytes,
                 std::vector<std::int64_t>& displs, std::int64_t& total) {
  bytes.assign(lists.size(), 0);
  displs.assign(lists.size(), 0);
  total = 0;
  for (std::size_t p = 0; p < lists.size(); ++p) {
    for (const Segment& seg : lists[p]) bytes[p] += seg.at.count() * s.vector_bytes(seg.field);
    displs[p] = total;
    total += bytes[p];
  }
}

Segment segment(Field f, bool add, const Rect& r, Strided at, bool stage = false) {
  return Segment{f, add, r.slot, r.t0, r.t1, r.h0, r.h1, at, stage};
}

}  // namespace

std::uint64_t mix64(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  return h;
}

RankSchedule schedule_header(const PlanConfig& config, int workers, int worker) {
  RankSchedule s;
  s.worker = worker;
  s.workers = workers;
  s.cp = config.cp;
  s.chunks = config.chunks;
  s.heads_q = config.shape.heads_q;
  s.heads_kv = config.shape.heads_kv;
  s.head_dim = config.shape.head_dim;
  s.dtype = config.shape.dtype;
  s.window = config.shape.window;
  s.slot = worker / config.cp;
  s.home_map = config.home_map();
  s.home_rows = s.home_map.rows();
  s.home_row0 = s.packed_row(0);
  return s;
}

std::int64_t home_tokens(const PackedSequence& seq, const HomeMap& map, int c) {
  std::int64_t tokens = 0, at_home = 0;
  for (std::int64_t l : seq) tokens += l;
  // Counted run by run of the home.
  for (std::int64_t i = 0; i < map.rows();) {
    const std::int64_t x = map.packed_row(c, i);
    const std::int64_t len = map.locate(x).run_end - x;
    at_home += std::clamp<std::int64_t>(tokens - x, 0, len);
    i += len;
  }
  return at_home;
}

std::vector<RowRun> pack_runs(RowRanges ranges, std::int64_t& count) {
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

// ---- Builder ----------------------------------------------------------------

Builder::Builder(RankSchedule& s) : s_(s) {
  for (auto& per_phase : s_.exchanges) size_exchanges(per_phase, s_.chunks, s_.workers);
  for (auto& per_pass : s_.kernel_calls) per_pass.assign(static_cast<std::size_t>(s_.chunks), {});
  if (s_.relayed) {
    for (auto& per_pass : s_.stage_exchanges) size_exchanges(per_pass, s_.chunks, s_.workers);
  }
}

Strided Builder::home(bool kv, const Rect& r) const {
  const std::int64_t heads = kv ? s_.heads_kv : s_.heads_q;
  return {s_.home_row(r.t0) * heads + r.h0, r.t1 - r.t0, r.h1 - r.h0, heads};
}

Strided Builder::compute(const Region& region, bool kv, const Rect& r) const {
  const HeadRange hr = kv ? region.kv_heads : region.q_heads;
  const std::int64_t row = kv ? region.kv_row(r.t0) : region.q_row(r.t0);
  return {(kv ? region.kv_offset : region.q_offset) + row * hr.size() + (r.h0 - hr.begin), r.t1 - r.t0, r.h1 - r.h0,
          hr.size()};
}

void Builder::item(Phase p, int m, Route route, bool kv, Rect r, Sides sides, bool add) {
  Exchange& x = s_.exchanges[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
  const bool in = is_in(p);
  for (Field f : phase_fields(p, kv)) {
    if (route.src == s_.worker) {
      const Strided at = in ? home(kv, r) : compute(*sides.src, kv, r);
      x.send[static_cast<std::size_t>(route.dst)].push_back(segment(f, false, r, at));
    }
    if (route.dst == s_.worker) {
      const Strided at = in ? compute(*sides.dst, kv, r) : home(kv, r);
      x.recv[static_cast<std::size_t>(route.src)].push_back(segment(f, add, r, at));
    }
  }
}

void Builder::relayed_item(Phase p, int m, Route route, int via, bool kv, Rect r, const Region* dst_region,
                           std::int64_t stage_offset) {
  const auto pass = static_cast<std::size_t>(p == Phase::kFwdIn ? Pass::kForward : Pass::kBackward);
  Exchange& stage = s_.stage_exchanges[pass][static_cast<std::size_t>(m)];
  Exchange& x = s_.exchanges[static_cast<std::size_t>(p)][static_cast<std::size_t>(m)];
  const Strided staged{stage_offset, r.t1 - r.t0, r.h1 - r.h0, r.h1 - r.h0};
  for (Field f : phase_fields(p, kv)) {
    if (route.src == s_.worker) stage.send[static_cast<std::size_t>(via)].push_back(segment(f, false, r, home(kv, r)));
    if (via == s_.worker) {
      stage.recv[static_cast<std::size_t>(route.src)].push_back(segment(f, false, r, staged, true));
      x.send[static_cast<std::size_t>(route.dst)].push_back(segment(f, false, r, staged, true));
    }
    if (route.dst == s_.worker) {
      x.recv[static_cast<std::size_t>(via)].push_back(segment(f, false, r, compute(*dst_region, kv, r)));
    }
  }
}

void Builder::finish() {
  std::vector<Exchange*> all;
  for (auto& per_phase : s_.exchanges)
    for (Exchange& x : per_phase) all.push_back(&x);
  for (auto& per_pass : s_.stage_exchanges)
    for (Exchange& x : per_pass) all.push_back(&x);
  for (Exchange* x : all) {
    count_bytes(s_, x->send, x->send_bytes, x->send_displs, x->total_send_bytes);
    count_bytes(s_, x->recv, x->recv_bytes, x->recv_displs, x->total_recv_bytes);
  }
  s_.apply_order.clear();
  for (int p = 0; p < s_.workers; ++p)
    for (int m = 0; m < s_.chunks; ++m) s_.apply_order.emplace_back(p, m);
}

// ---- CallList ---------------------------------------------------------------

void CallList::add(Where w, Heads heads, const std::vector<CallFragment>& frags) {
  if (frags.empty()) return;
  for (Pending& c : calls_) {
    if (c.where == w && c.heads == heads) {
      c.frags.insert(c.frags.end(), frags.begin(), frags.end());
      return;
    }
  }
  calls_.push_back({w, heads, frags});
}

void CallList::add_split(Where w, HeadRange ch, int grp, const std::vector<CallFragment>& frags) {
  const int k0 = ch.begin / grp, k1 = (ch.end - 1) / grp + 1;
  const int n = ch.size(), nk = k1 - k0;
  bool uniform = n % nk == 0;
  for (int i = 0; uniform && i < n; ++i) uniform = (ch.begin + i) / grp - k0 == i / (n / nk);
  if (uniform) {
    add(w, {ch.begin, ch.end, k0, k1}, frags);
    return;
  }
  for (int k = k0; k < k1; ++k) add(w, {std::max(ch.begin, k * grp), std::min(ch.end, (k + 1) * grp), k, k + 1}, frags);
}

void CallList::emit(RankSchedule& s, Pass pass, int m) const {
  auto& out = s.kernel_calls[static_cast<std::size_t>(pass)][static_cast<std::size_t>(m)];
  for (const Pending& c : calls_) {
    const Region& r = s.regions[static_cast<std::size_t>(c.where.region)];
    const Heads& h = c.heads;
    KernelCall k;
    k.region = c.where.region;
    k.h0 = h.h0;
    k.h1 = h.h1;
    k.k0 = h.k0;
    k.k1 = h.k1;
    k.q_home = c.where.q_home;
    k.kv_home = c.where.kv_home;
    k.q = k.q_home ? Strided{h.h0, s.home_rows, h.h1 - h.h0, s.heads_q}
                   : Strided{r.q_offset + (h.h0 - r.q_heads.begin), r.q_row_count, h.h1 - h.h0, r.q_heads.size()};
    k.kv = k.kv_home ? Strided{h.k0, s.home_rows, h.k1 - h.k0, s.heads_kv}
                     : Strided{r.kv_offset + (h.k0 - r.kv_heads.begin), r.kv_row_count, h.k1 - h.k0, r.kv_heads.size()};
    k.fragment_begin = static_cast<std::int32_t>(s.fragments.size());
    s.fragments.insert(s.fragments.end(), c.frags.begin(), c.frags.end());
    k.fragment_end = static_cast<std::int32_t>(s.fragments.size());
    out.push_back(k);
  }
}

}  // namespace libra::schedule_detail
