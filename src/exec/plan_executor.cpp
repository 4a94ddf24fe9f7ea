// The plan executor: runs a libra::Plan forward and backward over a pool
// communicator, pipelined over the plan's equal-head chunks.
//
// Every rank is both a home (it holds Q, K, V of its L/CP tokens and receives
// their outputs and gradients) and a worker (it computes the tiles the plan
// placed on it). A worker keeps one "mirror" per slot it touches: rows
// [lo, hi) of that slot for the head ranges its tiles use. Transfers in the
// plan fill the mirrors (Q and KV from the homes), the kernel runs on the
// mirrors, and the O (backward: dQ) items and the reversed KV items carry the
// results home. Data that stays on a rank (a tile on its own Q home, KV
// tokens resident on the worker) is copied locally, never sent.
//
// Schedule (paper section 6.3): chunk 0's input is posted first; while
// chunk m is waited for, chunk m+1's input is already posted; after chunk m
// computes, its outputs are posted at once and complete while chunk m+1
// computes. Between kernel calls the worker polls the in-flight requests so
// that MPI progresses them during compute. Partial dK/dV of a KV head go home
// after the last chunk that uses it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <chrono>
#include <map>
#include <tuple>

#include "exec/exec_internal.hpp"
#include "libra/executor.hpp"
#include "libra/kernel.hpp"

namespace libra {

using namespace exec_detail;

namespace {

// Tags: phase * kPhaseStride + chunk.
constexpr int kPhaseStride = 1 << 16;
enum Phase : int { kFwdIn = 0, kFwdOut = 1, kBwdIn = 2, kBwdOut = 3 };

enum class Field { kQ, kK, kV, kO, kLse, kDo, kDq, kDk, kDv };

// One plan transfer as the executor moves it.
struct Item {
  Rect rect;
  bool kv = false;  // KV item (K, V / dK, dV); otherwise a tile's rows (Q / O)
  std::int32_t tile = -1;
  std::int32_t group = -1;
};

struct Message {
  std::vector<Item> items;
};

// A byte buffer kept across calls (the executor is reused by every layer)
// and not zero-filled again on every call: mirrors are large (rows of every
// slot a worker touches) and only the rows that transfers and local copies
// fill are read.
class RawBuffer {
 public:
  void ensure(std::size_t n) {
    if (n != n_) {
      // Zeroed once when (re)allocated, so rows no transfer fills (the
      // loopback measurement of `libra bench exec`) never hold stale bytes
      // that read as NaN or denormal floats and slow the kernel down.
      p_.reset(n ? new std::byte[n]() : nullptr);
      n_ = n;
    }
  }
  void zero() {
    if (n_) std::memset(p_.get(), 0, n_);
  }
  void release() {
    p_.reset();
    n_ = 0;
  }
  std::byte* data() { return p_.get(); }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0;
};

struct Mirror {
  std::int32_t slot = 0;
  std::int64_t lo = 0, hi = 0;
  HeadRange qh{0, 0}, kh{0, 0};
  RawBuffer q, k, v, o, d_o, dq, dk, dv, lse;
};

// One kernel call: the fragments of every tile of one slot whose chunk has
// the same query heads (their query rows are disjoint). Batching a chunk's
// tiles into few calls keeps per-call overhead low and gives the kernel's
// threads enough work.
struct KernelCall {
  std::size_t mirror;
  std::int32_t h0, h1, k0, k1;  // query heads, KV heads
  std::vector<kernel::Fragment> fragments;
};

class PlanExecutor final : public Executor {
 public:
  PlanExecutor(Communicator& comm, Plan plan, ExecOptions opts) : comm_(comm), plan_(std::move(plan)), opts_(opts) {}

  Status init();
  Result<ForwardOutputs> forward(const AttentionInputs& in) override;
  Result<BackwardOutputs> backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                   std::span<const float> d_o) override;
  double last_compute_seconds() const override { return compute_seconds_; }

 private:
  // Layout of a field on this rank's home, or in the mirror of `slot`.
  Layout home_layout(Field f);
  Layout mirror_layout(Field f, std::size_t mi);
  DType wire_type(Field f) const;
  std::int64_t width(Field f) const { return f == Field::kLse ? 1 : d_; }
  std::int64_t message_bytes(const std::vector<Item>& items, Phase phase, bool from_worker) const;
  std::vector<Field> fields(Phase phase, bool kv) const;

  Status check_inputs(const AttentionInputs& in, const ForwardOutputs* fwd, std::span<const float> d_o) const;
  void allocate_mirrors(bool backward);
  Status local_kv_copy();
  Status local_q_copy(int m, bool backward);
  Status local_out_copy(int m, bool backward);
  Status local_dkv_add();
  Status post_inputs(int m, Phase phase, std::vector<std::vector<std::byte>>& send_bufs,
                     std::vector<std::vector<std::byte>>& recv_bufs, InFlight& group);
  Status unpack_inputs(int m, Phase phase, const std::vector<std::vector<std::byte>>& recv_bufs);
  Status compute_chunk(int m, bool backward, std::vector<InFlight*>& pollable);
  Status run_pipeline(bool backward);
  Status send_outputs(int m, Phase phase, std::vector<std::vector<std::byte>>& send_bufs, InFlight& group);
  Status post_output_recvs(Phase phase, std::vector<std::vector<std::vector<std::byte>>>& bufs, InFlight& group);
  Status unpack_outputs(Phase phase, const std::vector<std::vector<std::vector<std::byte>>>& bufs);
  Status pack_message(const Message& msg, Phase phase, bool from_worker, std::vector<std::byte>& out);
  Status unpack_message(const Message& msg, Phase phase, bool from_worker, std::span<const std::byte> in, bool add);

  std::size_t mirror_of(std::int32_t slot) const { return mirror_index_.at(slot); }

  Communicator& comm_;
  Plan plan_;
  ExecOptions opts_;
  int r_ = 0, w_ = 0, cp_ = 0, m_ = 1, hq_ = 0, hkv_ = 0, grp_ = 1;
  std::int64_t d_ = 0, lc_ = 0, home_lo_ = 0, window_ = kFullCausal;
  std::int32_t slot_ = 0;
  DType dt_ = DType::kF32;
  DType grad_dt_ = DType::kF32;

  // Inputs to this worker, [m][src]; outputs from this worker, [m][home].
  std::vector<std::vector<Message>> in_recv_, in_send_, out_send_, out_recv_;
  // Backward outputs: dQ items by chunk plus reversed KV items at their last use.
  std::vector<std::vector<Message>> bwd_out_send_, bwd_out_recv_;
  std::vector<Item> local_kv_;
  std::vector<std::vector<Item>> local_q_;  // [m]
  std::vector<std::vector<KernelCall>> calls_;  // [m]
  std::vector<std::vector<kernel::Fragment>> tile_fragments_;  // by tile id (this worker's only)

  std::vector<Mirror> mirrors_;
  std::map<std::int32_t, std::size_t> mirror_index_;

  // Home buffers of the call in progress.
  std::vector<std::byte> hq_buf_, hk_buf_, hv_buf_, ho_buf_, hdo_buf_, hdq_buf_;
  std::vector<std::byte> hlse_buf_, hdk_buf_, hdv_buf_;
  double compute_seconds_ = 0;
};

DType PlanExecutor::wire_type(Field f) const {
  switch (f) {
    case Field::kLse: return DType::kF32;
    case Field::kDq:
    case Field::kDk:
    case Field::kDv: return grad_dt_;
    default: return dt_;
  }
}

std::vector<Field> PlanExecutor::fields(Phase phase, bool kv) const {
  switch (phase) {
    case kFwdIn: return kv ? std::vector<Field>{Field::kK, Field::kV} : std::vector<Field>{Field::kQ};
    case kFwdOut: return {Field::kO, Field::kLse};
    case kBwdIn:
      return kv ? std::vector<Field>{Field::kK, Field::kV}
                : std::vector<Field>{Field::kQ, Field::kDo, Field::kO, Field::kLse};
    case kBwdOut: return kv ? std::vector<Field>{Field::kDk, Field::kDv} : std::vector<Field>{Field::kDq};
  }
  return {};
}

std::int64_t PlanExecutor::message_bytes(const std::vector<Item>& items, Phase phase, bool) const {
  std::int64_t total = 0;
  for (const Item& it : items) {
    for (Field f : fields(phase, it.kv)) total += it.rect.elems(width(f)) * kernel::dtype_bytes(wire_type(f));
  }
  return total;
}

Layout PlanExecutor::home_layout(Field f) {
  Layout l;
  l.row0 = home_lo_;
  l.rows = lc_;
  l.head0 = 0;
  l.width = width(f);
  const bool kv = f == Field::kK || f == Field::kV || f == Field::kDk || f == Field::kDv;
  l.heads = kv ? hkv_ : hq_;
  std::vector<std::byte>* buf = nullptr;
  switch (f) {
    case Field::kQ: buf = &hq_buf_; break;
    case Field::kK: buf = &hk_buf_; break;
    case Field::kV: buf = &hv_buf_; break;
    case Field::kO: buf = &ho_buf_; break;
    case Field::kLse: buf = &hlse_buf_; break;
    case Field::kDo: buf = &hdo_buf_; break;
    case Field::kDq: buf = &hdq_buf_; break;
    case Field::kDk: buf = &hdk_buf_; break;
    case Field::kDv: buf = &hdv_buf_; break;
  }
  // Home dK/dV accumulate every worker's partial sum in fp32.
  l.dtype = (f == Field::kDk || f == Field::kDv) ? DType::kF32 : wire_type(f);
  l.data = buf->empty() ? nullptr : buf->data();
  if (static_cast<std::int64_t>(buf->size()) != l.bytes()) l.data = nullptr;
  return l;
}

Layout PlanExecutor::mirror_layout(Field f, std::size_t mi) {
  Mirror& mr = mirrors_[mi];
  Layout l;
  l.row0 = mr.lo;
  l.rows = mr.hi - mr.lo;
  l.width = width(f);
  l.dtype = wire_type(f);
  const bool kv = f == Field::kK || f == Field::kV || f == Field::kDk || f == Field::kDv;
  l.head0 = kv ? mr.kh.begin : mr.qh.begin;
  l.heads = kv ? mr.kh.size() : mr.qh.size();
  RawBuffer* buf = nullptr;
  switch (f) {
    case Field::kQ: buf = &mr.q; break;
    case Field::kK: buf = &mr.k; break;
    case Field::kV: buf = &mr.v; break;
    case Field::kO: buf = &mr.o; break;
    case Field::kLse: buf = &mr.lse; break;
    case Field::kDo: buf = &mr.d_o; break;
    case Field::kDq: buf = &mr.dq; break;
    case Field::kDk: buf = &mr.dk; break;
    case Field::kDv: buf = &mr.dv; break;
  }
  l.data = (static_cast<std::int64_t>(buf->size()) == l.bytes() && !buf->empty()) ? buf->data() : nullptr;
  return l;
}

Status PlanExecutor::init() {
  const PlanConfig& cfg = plan_.config();
  w_ = plan_.num_workers();
  if (comm_.size() != w_) {
    return invalid_input(fmt::format("executor: the pool communicator has {} ranks but the plan has {} workers "
                                     "(P = {}, CP = {}); run with W = P * CP ranks per pool",
                                     comm_.size(), w_, plan_.pool_size(), cfg.cp));
  }
  LIBRA_TRY(agree_on_fingerprint(comm_, plan_.fingerprint(), "plan"));
  r_ = comm_.rank();
  cp_ = cfg.cp;
  m_ = cfg.chunks;
  hq_ = cfg.shape.heads_q;
  hkv_ = cfg.shape.heads_kv;
  grp_ = hq_ / hkv_;
  d_ = cfg.shape.head_dim;
  window_ = cfg.shape.window;
  lc_ = cfg.seq_len / cp_;
  slot_ = r_ / cp_;
  home_lo_ = static_cast<std::int64_t>(r_ % cp_) * lc_;
  dt_ = cfg.shape.dtype;
  if (dt_ == DType::kF16) return invalid_input("executor: dtype fp16 is not supported by the CPU kernel yet");
  // Gradients are computed, sent and summed in fp32 whatever the input type.
  grad_dt_ = DType::kF32;
  if (opts_.threads < 1) return invalid_input(fmt::format("executor: threads {} must be at least 1", opts_.threads));

  const auto tiles = plan_.tiles();
  const auto frags = plan_.fragments();
  const auto groups = plan_.groups();

  // Mirrors: every slot this worker computes on, spanning its tiles' rows
  // and the token ranges of the groups they use.
  std::map<std::int32_t, Mirror> by_slot;
  auto touch = [&](std::int32_t slot, std::int64_t lo, std::int64_t hi, HeadRange qh, HeadRange kh) {
    auto [it, fresh] = by_slot.try_emplace(slot);
    Mirror& mr = it->second;
    if (fresh) {
      mr.slot = slot;
      mr.lo = lo;
      mr.hi = hi;
      mr.qh = qh;
      mr.kh = kh;
      return;
    }
    mr.lo = std::min(mr.lo, lo);
    mr.hi = std::max(mr.hi, hi);
    if (qh.size() > 0) {
      if (mr.qh.size() == 0) mr.qh = qh;
      mr.qh = {std::min(mr.qh.begin, qh.begin), std::max(mr.qh.end, qh.end)};
    }
    if (kh.size() > 0) {
      if (mr.kh.size() == 0) mr.kh = kh;
      mr.kh = {std::min(mr.kh.begin, kh.begin), std::max(mr.kh.end, kh.end)};
    }
  };
  const auto my_tiles = plan_.worker_tiles(r_);
  for (std::int32_t id : my_tiles) {
    const Tile& t = tiles[static_cast<std::size_t>(id)];
    touch(t.slot, t.begin, t.end, t.heads, t.kv_heads);
    for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
      const KvGroup& g = groups[static_cast<std::size_t>(frags[static_cast<std::size_t>(f)].group)];
      touch(g.slot, g.begin, g.end, HeadRange{0, 0}, g.kv_heads);
    }
  }
  for (auto& [slot, mr] : by_slot) {
    mirror_index_[slot] = mirrors_.size();
    mirrors_.push_back(std::move(mr));
  }

  // Kernel fragments per tile, relative to the mirror rows.
  tile_fragments_.assign(tiles.size(), {});
  for (std::int32_t id : my_tiles) {
    const Tile& t = tiles[static_cast<std::size_t>(id)];
    const Mirror& mr = mirrors_[mirror_of(t.slot)];
    for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
      const Fragment& fr = frags[static_cast<std::size_t>(f)];
      tile_fragments_[static_cast<std::size_t>(id)].push_back(
          kernel::Fragment{fr.sample_start + fr.a - mr.lo, fr.sample_start - mr.lo, fr.sample_length, fr.a, fr.e});
    }
  }

  // Kernel calls per chunk: the chunk's query heads of every tile, split
  // into runs whose KV mapping the kernel's i / (h_q / h_kv) rule expresses.
  calls_.assign(static_cast<std::size_t>(m_), {});
  // first/last chunk in which worker w uses KV head k of group g.
  std::map<std::tuple<int, int, int>, std::pair<int, int>> use;
  for (const Tile& t : tiles) {
    for (int m = 0; m < m_; ++m) {
      const HeadRange ch = plan_.chunk_heads(t, m);
      if (ch.size() <= 0) continue;
      const int k0 = ch.begin / grp_, k1 = (ch.end - 1) / grp_ + 1;
      for (std::int32_t f = t.fragment_begin; f < t.fragment_end; ++f) {
        const int g = frags[static_cast<std::size_t>(f)].group;
        for (int k = k0; k < k1; ++k) {
          auto [it, fresh] = use.try_emplace({t.worker, g, k}, m, m);
          if (!fresh) it->second = {std::min(it->second.first, m), std::max(it->second.second, m)};
        }
      }
      if (t.worker != r_) continue;
      const int n = ch.size(), nk = k1 - k0;
      bool uniform = n % nk == 0;
      for (int i = 0; uniform && i < n; ++i) uniform = (ch.begin + i) / grp_ - k0 == i / (n / nk);
      const std::size_t mi = mirror_of(t.slot);
      auto add_call = [&](std::int32_t h0, std::int32_t h1, std::int32_t c0, std::int32_t c1) {
        auto& list = calls_[static_cast<std::size_t>(m)];
        const auto& fr = tile_fragments_[static_cast<std::size_t>(t.id)];
        for (KernelCall& call : list) {
          if (call.mirror == mi && call.h0 == h0 && call.h1 == h1 && call.k0 == c0 && call.k1 == c1) {
            call.fragments.insert(call.fragments.end(), fr.begin(), fr.end());
            return;
          }
        }
        list.push_back({mi, h0, h1, c0, c1, fr});
      };
      if (uniform) {
        add_call(ch.begin, ch.end, k0, k1);
      } else {
        for (int k = k0; k < k1; ++k) add_call(std::max(ch.begin, k * grp_), std::min(ch.end, (k + 1) * grp_), k, k + 1);
      }
    }
  }

  // Messages from the plan's per-chunk transfer lists.
  const auto W = static_cast<std::size_t>(w_);
  const auto M = static_cast<std::size_t>(m_);
  auto grid = [&] { return std::vector<std::vector<Message>>(M, std::vector<Message>(W)); };
  in_recv_ = grid();
  in_send_ = grid();
  out_send_ = grid();
  out_recv_ = grid();
  bwd_out_send_ = grid();
  bwd_out_recv_ = grid();
  std::map<std::pair<int, int>, bool> q_seen;  // (tile, m) of this worker's remote-home tiles
  // dK/dV returns, one per distinct (src, dst, rectangle): with H > h_kv the
  // contract fetches a shared KV head once per head shard, but the worker's
  // mirror holds one copy whose gradient sums every shard's contribution, so
  // it must go home once, after the last chunk that uses any of them.
  std::map<std::tuple<int, int, std::int32_t, std::int64_t, std::int64_t, std::int32_t, std::int32_t>,
           std::pair<Item, int>>
      reversed;
  for (int m = 0; m < m_; ++m) {
    for (int s = 0; s < w_; ++s) {
      for (int dst = 0; dst < w_; ++dst) {
        if (s != r_ && dst != r_) continue;
        for (const Transfer& x : plan_.chunk_transfers(m, s, dst)) {
          Item it{Rect{x.slot, x.begin, x.end, x.heads.begin, x.heads.end}, x.kind == TransferKind::kKv, x.tile, x.group};
          if (x.src == x.dst) return internal_error(fmt::format("plan lists a transfer from worker {} to itself", x.src));
          if (x.kind == TransferKind::kO) {
            // Worker x.src -> home x.dst, forward O and backward dQ.
            auto& fo = (s == r_) ? out_send_[static_cast<std::size_t>(m)][static_cast<std::size_t>(dst)]
                                 : out_recv_[static_cast<std::size_t>(m)][static_cast<std::size_t>(s)];
            fo.items.push_back(it);
            auto& bo = (s == r_) ? bwd_out_send_[static_cast<std::size_t>(m)][static_cast<std::size_t>(dst)]
                                 : bwd_out_recv_[static_cast<std::size_t>(m)][static_cast<std::size_t>(s)];
            bo.items.push_back(it);
            continue;
          }
          // Q and KV: home / resident x.src -> worker x.dst.
          auto& in = (dst == r_) ? in_recv_[static_cast<std::size_t>(m)][static_cast<std::size_t>(s)]
                                 : in_send_[static_cast<std::size_t>(m)][static_cast<std::size_t>(dst)];
          in.items.push_back(it);
          if (x.kind == TransferKind::kQ && dst == r_) q_seen[{x.tile, m}] = true;
          if (x.kind == TransferKind::kKv) {
            // The dK/dV partial of these heads goes back after the last
            // chunk of the worker that uses them; they must arrive no later
            // than the first.
            int first = m_, last = -1;
            for (int k = x.heads.begin; k < x.heads.end; ++k) {
              auto u = use.find({x.dst, x.group, k});
              if (u == use.end()) continue;
              first = std::min(first, u->second.first);
              last = std::max(last, u->second.second);
            }
            if (last < 0) {
              return internal_error(fmt::format("plan sends KV group {} heads [{}, {}) to worker {}, which never uses them",
                                                x.group, x.heads.begin, x.heads.end, x.dst));
            }
            if (first < m) {
              return internal_error(fmt::format("plan sends KV group {} heads [{}, {}) to worker {} with chunk {}, after "
                                                "its first use in chunk {}",
                                                x.group, x.heads.begin, x.heads.end, x.dst, m, first));
            }
            // Reversed later: worker x.dst -> resident x.src.
            auto key = std::make_tuple(s, dst, it.rect.slot, it.rect.t0, it.rect.t1, it.rect.h0, it.rect.h1);
            auto [rv, fresh] = reversed.try_emplace(key, std::make_pair(it, last));
            if (!fresh) rv->second.second = std::max(rv->second.second, last);
          }
        }
      }
    }
  }
  for (const auto& [key, v] : reversed) {
    const int s = std::get<0>(key), dst = std::get<1>(key);
    auto& bo = (dst == r_) ? bwd_out_send_[static_cast<std::size_t>(v.second)][static_cast<std::size_t>(s)]
                           : bwd_out_recv_[static_cast<std::size_t>(v.second)][static_cast<std::size_t>(dst)];
    bo.items.push_back(v.first);
  }
  // The sums are only right when distinct returns never partly overlap.
  for (const auto* grid_ptr : {&bwd_out_send_, &bwd_out_recv_}) {
    for (int p = 0; p < w_; ++p) {
      std::vector<Rect> rects;
      for (int m = 0; m < m_; ++m)
        for (const Item& it : (*grid_ptr)[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)].items)
          if (it.kv) rects.push_back(it.rect);
      for (std::size_t i = 0; i < rects.size(); ++i) {
        for (std::size_t j = i + 1; j < rects.size(); ++j) {
          const Rect &a = rects[i], &b = rects[j];
          if (a.slot == b.slot && a.t0 < b.t1 && b.t0 < a.t1 && a.h0 < b.h1 && b.h0 < a.h1) {
            return internal_error(fmt::format("plan: KV transfers between workers {} and {} overlap partly in slot {} "
                                              "rows [{}, {}) and [{}, {})",
                                              r_, p, a.slot, a.t0, a.t1, b.t0, b.t1));
          }
        }
      }
    }
  }

  // Local copies: tiles on their own Q home, and KV tokens resident here.
  local_q_.assign(M, {});
  for (std::int32_t id : my_tiles) {
    const Tile& t = tiles[static_cast<std::size_t>(id)];
    for (int m = 0; m < m_; ++m) {
      const HeadRange ch = plan_.chunk_heads(t, m);
      if (t.home == r_) {
        local_q_[static_cast<std::size_t>(m)].push_back(
            Item{Rect{t.slot, t.begin, t.end, ch.begin, ch.end}, false, t.id, -1});
      } else if (!q_seen.count({t.id, m})) {
        return internal_error(fmt::format("plan: tile {} on worker {} has no Q transfer from its home {} in chunk {}",
                                          t.id, r_, t.home, m));
      }
    }
  }
  for (std::int32_t gid : plan_.worker_groups(r_)) {
    const KvGroup& g = groups[static_cast<std::size_t>(gid)];
    if (g.slot != slot_) continue;
    const std::int64_t t0 = std::max(g.begin, home_lo_), t1 = std::min(g.end, home_lo_ + lc_);
    if (t0 >= t1) continue;
    const Rect rect{g.slot, t0, t1, g.kv_heads.begin, g.kv_heads.end};
    // Groups of several head shards may name the same KV rows (H > h_kv):
    // copy, and later sum, them once.
    bool dup = false;
    for (const Item& it : local_kv_) {
      const Rect& a = it.rect;
      if (a.t0 == rect.t0 && a.t1 == rect.t1 && a.h0 == rect.h0 && a.h1 == rect.h1) dup = true;
      else if (a.t0 < rect.t1 && rect.t0 < a.t1 && a.h0 < rect.h1 && rect.h0 < a.h1) {
        return internal_error(fmt::format("plan: KV groups of worker {} overlap partly in rows [{}, {})", r_, t0, t1));
      }
    }
    if (!dup) local_kv_.push_back(Item{rect, true, -1, gid});
  }
  return Status();
}

Status PlanExecutor::check_inputs(const AttentionInputs& in, const ForwardOutputs* fwd,
                                  std::span<const float> d_o) const {
  const auto qn = static_cast<std::size_t>(lc_ * hq_ * d_), kn = static_cast<std::size_t>(lc_ * hkv_ * d_);
  auto check = [&](std::size_t got, std::size_t want, const char* name) -> Status {
    if (got != want) {
      return invalid_input(fmt::format("executor rank {}: {} has {} elements, expected L/CP x heads x head_dim = {}",
                                       r_, name, got, want));
    }
    return Status();
  };
  LIBRA_TRY(check(in.q.size(), qn, "q"));
  LIBRA_TRY(check(in.k.size(), kn, "k"));
  LIBRA_TRY(check(in.v.size(), kn, "v"));
  if (fwd) {
    LIBRA_TRY(check(fwd->o.size(), qn, "o"));
    LIBRA_TRY(check(fwd->lse.size(), static_cast<std::size_t>(lc_ * hq_), "lse"));
    LIBRA_TRY(check(d_o.size(), qn, "d_o"));
  }
  return Status();
}

void PlanExecutor::allocate_mirrors(bool backward) {
  for (std::size_t mi = 0; mi < mirrors_.size(); ++mi) {
    Mirror& mr = mirrors_[mi];
    auto alloc = [&](RawBuffer& buf, Field f, bool need) {
      if (!need) {
        buf.release();
        return;
      }
      Layout l = mirror_layout(f, mi);
      buf.ensure(static_cast<std::size_t>(l.bytes()));
      // The kernel adds into dK and dV.
      if (f == Field::kDk || f == Field::kDv) buf.zero();
    };
    alloc(mr.q, Field::kQ, true);
    alloc(mr.k, Field::kK, true);
    alloc(mr.v, Field::kV, true);
    alloc(mr.o, Field::kO, true);
    alloc(mr.lse, Field::kLse, true);
    alloc(mr.d_o, Field::kDo, backward);
    alloc(mr.dq, Field::kDq, backward);
    alloc(mr.dk, Field::kDk, backward);
    alloc(mr.dv, Field::kDv, backward);
  }
}

Status PlanExecutor::local_kv_copy() {
  for (const Item& it : local_kv_) {
    const std::size_t mi = mirror_of(it.rect.slot);
    LIBRA_TRY(copy_rect(home_layout(Field::kK), mirror_layout(Field::kK, mi), it.rect));
    LIBRA_TRY(copy_rect(home_layout(Field::kV), mirror_layout(Field::kV, mi), it.rect));
  }
  return Status();
}

Status PlanExecutor::local_q_copy(int m, bool backward) {
  for (const Item& it : local_q_[static_cast<std::size_t>(m)]) {
    const std::size_t mi = mirror_of(it.rect.slot);
    LIBRA_TRY(copy_rect(home_layout(Field::kQ), mirror_layout(Field::kQ, mi), it.rect));
    if (backward) {
      for (Field f : {Field::kDo, Field::kO, Field::kLse}) {
        LIBRA_TRY(copy_rect(home_layout(f), mirror_layout(f, mi), it.rect));
      }
    }
  }
  return Status();
}

Status PlanExecutor::local_out_copy(int m, bool backward) {
  for (const Item& it : local_q_[static_cast<std::size_t>(m)]) {
    const std::size_t mi = mirror_of(it.rect.slot);
    if (backward) {
      LIBRA_TRY(copy_rect(mirror_layout(Field::kDq, mi), home_layout(Field::kDq), it.rect));
    } else {
      LIBRA_TRY(copy_rect(mirror_layout(Field::kO, mi), home_layout(Field::kO), it.rect));
      LIBRA_TRY(copy_rect(mirror_layout(Field::kLse, mi), home_layout(Field::kLse), it.rect));
    }
  }
  return Status();
}

Status PlanExecutor::local_dkv_add() {
  for (const Item& it : local_kv_) {
    const std::size_t mi = mirror_of(it.rect.slot);
    LIBRA_TRY(add_rect(mirror_layout(Field::kDk, mi), home_layout(Field::kDk), it.rect));
    LIBRA_TRY(add_rect(mirror_layout(Field::kDv, mi), home_layout(Field::kDv), it.rect));
  }
  return Status();
}

Status PlanExecutor::pack_message(const Message& msg, Phase phase, bool from_worker, std::vector<std::byte>& out) {
  out.assign(static_cast<std::size_t>(message_bytes(msg.items, phase, from_worker)), std::byte{0});
  std::byte* cur = out.data();
  const std::byte* end = out.data() + out.size();
  for (const Item& it : msg.items) {
    for (Field f : fields(phase, it.kv)) {
      Layout src = from_worker ? mirror_layout(f, mirror_of(it.rect.slot)) : home_layout(f);
      LIBRA_TRY(pack_rect(src, it.rect, cur, end));
    }
  }
  return Status();
}

Status PlanExecutor::unpack_message(const Message& msg, Phase phase, bool from_worker, std::span<const std::byte> in,
                                    bool add) {
  const std::byte* cur = in.data();
  const std::byte* end = in.data() + in.size();
  for (const Item& it : msg.items) {
    for (Field f : fields(phase, it.kv)) {
      // from_worker: the message came from a worker, so it lands on the home.
      Layout dst = from_worker ? home_layout(f) : mirror_layout(f, mirror_of(it.rect.slot));
      LIBRA_TRY(unpack_rect(dst, it.rect, wire_type(f), add && it.kv, cur, end));
    }
  }
  if (cur != end) return internal_error("exec: message longer than its items");
  return Status();
}

Status PlanExecutor::post_inputs(int m, Phase phase, std::vector<std::vector<std::byte>>& send_bufs,
                                 std::vector<std::vector<std::byte>>& recv_bufs, InFlight& group) {
  const int tag = phase * kPhaseStride + m;
  for (int p = 0; p < w_; ++p) {
    const Message& rm = in_recv_[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)];
    if (!rm.items.empty()) {
      auto& buf = recv_bufs[static_cast<std::size_t>(p)];
      buf.assign(static_cast<std::size_t>(message_bytes(rm.items, phase, false)), std::byte{0});
      LIBRA_ASSIGN_OR_RETURN(Request req, comm_.irecv(p, tag, buf));
      group.add(req);
    }
  }
  for (int p = 0; p < w_; ++p) {
    const Message& sm = in_send_[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)];
    if (!sm.items.empty()) {
      auto& buf = send_bufs[static_cast<std::size_t>(p)];
      LIBRA_TRY(pack_message(sm, phase, false, buf));
      LIBRA_ASSIGN_OR_RETURN(Request req, comm_.isend(p, tag, buf));
      group.add(req);
    }
  }
  return Status();
}

Status PlanExecutor::unpack_inputs(int m, Phase phase, const std::vector<std::vector<std::byte>>& recv_bufs) {
  for (int p = 0; p < w_; ++p) {
    const Message& rm = in_recv_[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)];
    if (!rm.items.empty()) LIBRA_TRY(unpack_message(rm, phase, false, recv_bufs[static_cast<std::size_t>(p)], false));
  }
  return Status();
}

Status PlanExecutor::compute_chunk(int m, bool backward, std::vector<InFlight*>& pollable) {
  TraceRecorder* tr = opts_.trace;
  const double t0 = tr ? tr->now_us() : 0;
  const auto c0 = std::chrono::steady_clock::now();
  for (const KernelCall& c : calls_[static_cast<std::size_t>(m)]) {
    const auto& fr = c.fragments;
    if (!backward) {
      kernel::ForwardArgs a;
      a.q = mirror_layout(Field::kQ, c.mirror).view(c.h0, c.h1);
      a.k = mirror_layout(Field::kK, c.mirror).view(c.k0, c.k1);
      a.v = mirror_layout(Field::kV, c.mirror).view(c.k0, c.k1);
      a.o = mirror_layout(Field::kO, c.mirror).view(c.h0, c.h1);
      a.lse = mirror_layout(Field::kLse, c.mirror).view(c.h0, c.h1);
      a.fragments = fr;
      a.window = window_;
      a.threads = opts_.threads;
      LIBRA_TRY(kernel::attention_forward(a));
    } else {
      kernel::BackwardArgs a;
      a.q = mirror_layout(Field::kQ, c.mirror).view(c.h0, c.h1);
      a.k = mirror_layout(Field::kK, c.mirror).view(c.k0, c.k1);
      a.v = mirror_layout(Field::kV, c.mirror).view(c.k0, c.k1);
      a.o = mirror_layout(Field::kO, c.mirror).view(c.h0, c.h1);
      a.d_o = mirror_layout(Field::kDo, c.mirror).view(c.h0, c.h1);
      a.lse = mirror_layout(Field::kLse, c.mirror).view(c.h0, c.h1);
      a.dq = mirror_layout(Field::kDq, c.mirror).view(c.h0, c.h1);
      a.dk = mirror_layout(Field::kDk, c.mirror).view(c.k0, c.k1);
      a.dv = mirror_layout(Field::kDv, c.mirror).view(c.k0, c.k1);
      a.fragments = fr;
      a.window = window_;
      a.threads = opts_.threads;
      LIBRA_TRY(kernel::attention_backward(a));
    }
    // Let the communication library move the other chunks' data.
    for (InFlight* f : pollable) LIBRA_TRY(f->poll(comm_));
  }
  compute_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  if (tr) tr->record(fmt::format("{} compute chunk {}", backward ? "bwd" : "fwd", m), TraceRecorder::kCompute, t0,
                     tr->now_us());
  return Status();
}

Status PlanExecutor::send_outputs(int m, Phase phase, std::vector<std::vector<std::byte>>& send_bufs, InFlight& group) {
  const int tag = phase * kPhaseStride + m;
  const auto& row = (phase == kFwdOut ? out_send_ : bwd_out_send_)[static_cast<std::size_t>(m)];
  for (int p = 0; p < w_; ++p) {
    const Message& sm = row[static_cast<std::size_t>(p)];
    if (sm.items.empty()) continue;
    auto& buf = send_bufs[static_cast<std::size_t>(p)];
    LIBRA_TRY(pack_message(sm, phase, true, buf));
    LIBRA_ASSIGN_OR_RETURN(Request req, comm_.isend(p, tag, buf));
    group.add(req);
  }
  return Status();
}

Status PlanExecutor::post_output_recvs(Phase phase, std::vector<std::vector<std::vector<std::byte>>>& bufs,
                                       InFlight& group) {
  const auto& grid = phase == kFwdOut ? out_recv_ : bwd_out_recv_;
  for (int m = 0; m < m_; ++m) {
    for (int p = 0; p < w_; ++p) {
      const Message& rm = grid[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)];
      if (rm.items.empty()) continue;
      auto& buf = bufs[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)];
      buf.assign(static_cast<std::size_t>(message_bytes(rm.items, phase, true)), std::byte{0});
      LIBRA_ASSIGN_OR_RETURN(Request req, comm_.irecv(p, phase * kPhaseStride + m, buf));
      group.add(req);
    }
  }
  return Status();
}

Status PlanExecutor::unpack_outputs(Phase phase, const std::vector<std::vector<std::vector<std::byte>>>& bufs) {
  const auto& grid = phase == kFwdOut ? out_recv_ : bwd_out_recv_;
  // Fixed order (source worker, then chunk), this rank's own partial sums in
  // its place, so the fp32 sums of dK/dV do not depend on arrival order.
  for (int p = 0; p < w_; ++p) {
    if (p == r_) {
      if (phase == kBwdOut) LIBRA_TRY(local_dkv_add());
      continue;
    }
    for (int m = 0; m < m_; ++m) {
      const Message& rm = grid[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)];
      if (!rm.items.empty())
        LIBRA_TRY(unpack_message(rm, phase, true, bufs[static_cast<std::size_t>(m)][static_cast<std::size_t>(p)], true));
    }
  }
  return Status();
}

// The pipeliner schedule of paper section 6.3, shared by both passes: post
// chunk 0's inputs; for each chunk m, dispatch chunk m+1's inputs, wait only
// for chunk m's, compute it while chunk m+1 arrives and chunk m-1 returns,
// then send chunk m's outputs home; wait for every return at the end.
Status PlanExecutor::run_pipeline(bool backward) {
  const std::string pass = backward ? "bwd" : "fwd";
  const Phase in_phase = backward ? kBwdIn : kFwdIn;
  const Phase out_phase = backward ? kBwdOut : kFwdOut;
  TraceRecorder* tr = opts_.trace;
  const auto W = static_cast<std::size_t>(w_);
  const auto M = static_cast<std::size_t>(m_);
  std::vector<std::vector<std::vector<std::byte>>> in_send(M, std::vector<std::vector<std::byte>>(W)),
      in_recv(M, std::vector<std::vector<std::byte>>(W)), out_send(M, std::vector<std::vector<std::byte>>(W)),
      out_recv(M, std::vector<std::vector<std::byte>>(W));
  std::vector<InFlight> inputs(M), outputs(M);
  InFlight returns(pass + " output receives", tr);
  LIBRA_TRY(post_output_recvs(out_phase, out_recv, returns));
  inputs[0] = InFlight(pass + " input chunk 0", tr);
  LIBRA_TRY(post_inputs(0, in_phase, in_send[0], in_recv[0], inputs[0]));
  for (int m = 0; m < m_; ++m) {
    const auto mu = static_cast<std::size_t>(m);
    if (m + 1 < m_) {
      inputs[mu + 1] = InFlight(fmt::format("{} input chunk {}", pass, m + 1), tr);
      LIBRA_TRY(post_inputs(m + 1, in_phase, in_send[mu + 1], in_recv[mu + 1], inputs[mu + 1]));
    }
    LIBRA_TRY(inputs[mu].wait(comm_));
    LIBRA_TRY(unpack_inputs(m, in_phase, in_recv[mu]));
    LIBRA_TRY(local_q_copy(m, backward));
    std::vector<InFlight*> pollable{&returns};
    if (m + 1 < m_) pollable.push_back(&inputs[mu + 1]);
    if (m > 0) pollable.push_back(&outputs[mu - 1]);
    LIBRA_TRY(compute_chunk(m, backward, pollable));
    LIBRA_TRY(local_out_copy(m, backward));
    outputs[mu] = InFlight(fmt::format("{} output chunk {}", pass, m), tr);
    LIBRA_TRY(send_outputs(m, out_phase, out_send[mu], outputs[mu]));
  }
  LIBRA_TRY(returns.wait(comm_));
  for (auto& o : outputs) LIBRA_TRY(o.wait(comm_));
  LIBRA_TRY(unpack_outputs(out_phase, out_recv));
  return Status();
}

Result<ForwardOutputs> PlanExecutor::forward(const AttentionInputs& in) {
  LIBRA_TRY(agree_on_status(comm_, check_inputs(in, nullptr, {}), "executor forward inputs"));
  compute_seconds_ = 0;
  hq_buf_ = to_dtype(in.q, dt_);
  hk_buf_ = to_dtype(in.k, dt_);
  hv_buf_ = to_dtype(in.v, dt_);
  ho_buf_.assign(static_cast<std::size_t>(lc_ * hq_ * d_ * kernel::dtype_bytes(dt_)), std::byte{0});
  hlse_buf_.assign(static_cast<std::size_t>(lc_ * hq_ * 4), std::byte{0});
  allocate_mirrors(false);
  LIBRA_TRY(local_kv_copy());

  LIBRA_TRY(run_pipeline(false));

  ForwardOutputs out;
  out.o = to_f32(ho_buf_, dt_);
  out.lse = to_f32(hlse_buf_, DType::kF32);
  return out;
}

Result<BackwardOutputs> PlanExecutor::backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                               std::span<const float> d_o) {
  LIBRA_TRY(agree_on_status(comm_, check_inputs(in, &fwd, d_o), "executor backward inputs"));
  compute_seconds_ = 0;
  hq_buf_ = to_dtype(in.q, dt_);
  hk_buf_ = to_dtype(in.k, dt_);
  hv_buf_ = to_dtype(in.v, dt_);
  ho_buf_ = to_dtype(fwd.o, dt_);
  hdo_buf_ = to_dtype(d_o, dt_);
  hlse_buf_ = to_dtype(fwd.lse, DType::kF32);
  hdq_buf_.assign(static_cast<std::size_t>(lc_ * hq_ * d_ * kernel::dtype_bytes(grad_dt_)), std::byte{0});
  hdk_buf_.assign(static_cast<std::size_t>(lc_ * hkv_ * d_ * 4), std::byte{0});
  hdv_buf_.assign(static_cast<std::size_t>(lc_ * hkv_ * d_ * 4), std::byte{0});
  allocate_mirrors(true);
  LIBRA_TRY(local_kv_copy());

  LIBRA_TRY(run_pipeline(true));

  BackwardOutputs out;
  out.dq = to_f32(hdq_buf_, grad_dt_);
  out.dk = to_f32(hdk_buf_, DType::kF32);
  out.dv = to_f32(hdv_buf_, DType::kF32);
  return out;
}

}  // namespace

Result<std::unique_ptr<Executor>> make_plan_executor(Communicator& pool, const Plan& plan, const ExecOptions& options) {
  auto ex = std::make_unique<PlanExecutor>(pool, plan, options);
  LIBRA_TRY(ex->init());
  return std::unique_ptr<Executor>(std::move(ex));
}

}  // namespace libra
