// The Ulysses baseline, written from its definition rather than from a plan:
// inside each slot's CP group, an all-to-all turns sequence-sharded Q, K, V
// (every rank: L/CP tokens, all heads) into head-sharded ones (every rank:
// all L tokens, h_q/CP query heads and the KV heads they use), each rank runs
// full causal attention over every sample of its slot, and a second
// all-to-all brings the outputs back. Backward does the same with Q, dO, O
// and LSE, and sums dK/dV back (a KV head shared by several ranks when
// CP > h_kv gets every rank's partial sum).
#include <fmt/format.h>

#include <chrono>
#include <functional>

#include "exec/exec_internal.hpp"
#include "libra/executor.hpp"
#include "libra/kernel.hpp"

namespace libra {

using namespace exec_detail;

namespace {

constexpr int kUlyssesTag = 1 << 19;

class UlyssesExecutor final : public Executor {
 public:
  UlyssesExecutor(Communicator& comm, std::vector<PackedSequence> pool, const PlanConfig& cfg, ExecOptions opts)
      : comm_(comm), pool_(std::move(pool)), cfg_(cfg), opts_(opts) {}

  Status init();
  Result<ForwardOutputs> forward(const AttentionInputs& in) override;
  Result<BackwardOutputs> backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                   std::span<const float> d_o) override;
  double last_compute_seconds() const override { return compute_seconds_; }

 private:
  HeadRange q_heads(int c) const { return {c * nq_, (c + 1) * nq_}; }
  HeadRange kv_heads(int c) const { return {c * nq_ / grp_, ((c + 1) * nq_ - 1) / grp_ + 1}; }
  Layout home(std::vector<std::byte>& buf, DType t, int heads, std::int64_t width) const {
    Layout l{nullptr, t, c_ * lc_, lc_, 0, heads, width};
    if (static_cast<std::int64_t>(buf.size()) == l.bytes()) l.data = buf.data();
    return l;
  }
  Layout whole(std::vector<std::byte>& buf, DType t, HeadRange h, std::int64_t width) const {
    Layout l{nullptr, t, 0, cfg_.seq_len, h.begin, h.size(), width};
    buf.assign(static_cast<std::size_t>(l.bytes()), std::byte{0});
    l.data = buf.data();
    return l;
  }
  // One all-to-all inside the CP group: for every peer c', `out(c')` lists
  // (source layout, rect) pieces to send and `in(c')` (destination layout,
  // rect, add) pieces to receive, in matching order.
  struct Piece {
    Layout layout;
    Rect rect;
    bool add = false;
  };
  Status all_to_all(int tag, const std::function<std::vector<Piece>(int)>& out,
                    const std::function<std::vector<Piece>(int)>& in, const std::string& name);
  Status compute(bool backward);

  Communicator& comm_;
  std::vector<PackedSequence> pool_;
  PlanConfig cfg_;
  ExecOptions opts_;
  int r_ = 0, cp_ = 0, c_ = 0, slot_ = 0, hq_ = 0, hkv_ = 0, grp_ = 1, nq_ = 0;
  std::int64_t d_ = 0, lc_ = 0;
  DType dt_ = DType::kF32;
  std::vector<kernel::Fragment> frags_;
  // Head-sharded whole-sequence buffers of this rank.
  std::vector<std::byte> q_, k_, v_, o_, lse_, do_, dq_, dk_, dv_;
  Layout lq_, lk_, lv_, lo_, llse_, ldo_, ldq_, ldk_, ldv_;
  double compute_seconds_ = 0;
};

Status UlyssesExecutor::init() {
  LIBRA_TRY(validate_plan_config([&] {
    PlanConfig c = cfg_;
    c.mode = PlanMode::kUlysses;
    c.chunks = 1;
    return c;
  }()));
  cp_ = cfg_.cp;
  hq_ = cfg_.shape.heads_q;
  hkv_ = cfg_.shape.heads_kv;
  const int W = static_cast<int>(pool_.size()) * cp_;
  if (comm_.size() != W) {
    return invalid_input(fmt::format("ulysses executor: the pool communicator has {} ranks but the pool has {} slots x "
                                     "CP {} = {} workers",
                                     comm_.size(), pool_.size(), cp_, W));
  }
  if (hq_ % cp_ != 0) return invalid_input(fmt::format("ulysses: --cp {} must divide --heads-q {}", cp_, hq_));
  if (hkv_ % cp_ != 0 && cp_ % hkv_ != 0) {
    return invalid_input(fmt::format("ulysses: --heads-kv {} and --cp {} must divide one another", hkv_, cp_));
  }
  if (cfg_.shape.dtype == DType::kF16) return invalid_input("ulysses: dtype fp16 is not supported by the CPU kernel yet");
  for (std::size_t p = 0; p < pool_.size(); ++p) {
    std::int64_t total = 0;
    for (std::int64_t l : pool_[p]) {
      if (l <= 0) return invalid_input(fmt::format("ulysses: slot {} has a sample of length {}", p, l));
      total += l;
    }
    if (total > cfg_.seq_len) {
      return invalid_input(fmt::format("ulysses: slot {} holds {} tokens, more than --seq-len {}", p, total, cfg_.seq_len));
    }
  }
  std::uint64_t fp = mix64(0x756c7973736573ULL, static_cast<std::uint64_t>(cfg_.seq_len));
  for (std::int64_t v : {std::int64_t{cp_}, std::int64_t{hq_}, std::int64_t{hkv_}, std::int64_t{cfg_.shape.head_dim},
                         static_cast<std::int64_t>(dtype_code(cfg_.shape.dtype)), cfg_.shape.window}) {
    fp = mix64(fp, static_cast<std::uint64_t>(v));
  }
  for (const auto& seq : pool_) {
    fp = mix64(fp, seq.size());
    for (std::int64_t l : seq) fp = mix64(fp, static_cast<std::uint64_t>(l));
  }
  LIBRA_TRY(agree_on_fingerprint(comm_, fp, "ulysses pool and configuration"));
  r_ = comm_.rank();
  slot_ = r_ / cp_;
  c_ = r_ % cp_;
  grp_ = hq_ / hkv_;
  nq_ = hq_ / cp_;
  d_ = cfg_.shape.head_dim;
  lc_ = cfg_.seq_len / cp_;
  dt_ = cfg_.shape.dtype;
  if (opts_.threads < 1) return invalid_input(fmt::format("executor: threads {} must be at least 1", opts_.threads));
  std::int64_t start = 0;
  for (std::int64_t len : pool_[static_cast<std::size_t>(slot_)]) {
    frags_.push_back({start, start, len, 0, len});
    start += len;
  }
  return Status();
}

Status UlyssesExecutor::all_to_all(int tag, const std::function<std::vector<Piece>(int)>& out,
                                   const std::function<std::vector<Piece>(int)>& in, const std::string& name) {
  const auto n = static_cast<std::size_t>(cp_);
  std::vector<std::vector<std::byte>> send(n), recv(n);
  InFlight group(name, opts_.trace);
  const int base = slot_ * cp_;
  auto size_of = [](const std::vector<Piece>& ps) {
    std::int64_t b = 0;
    for (const Piece& p : ps) b += p.rect.elems(p.layout.width) * p.layout.eb();
    return b;
  };
  for (int c = 0; c < cp_; ++c) {
    if (c == c_) continue;
    auto pieces = in(c);
    auto& buf = recv[static_cast<std::size_t>(c)];
    buf.assign(static_cast<std::size_t>(size_of(pieces)), std::byte{0});
    if (!buf.empty()) {
      LIBRA_ASSIGN_OR_RETURN(Request r, comm_.irecv(base + c, tag, buf));
      group.add(r);
    }
  }
  for (int c = 0; c < cp_; ++c) {
    if (c == c_) continue;
    auto pieces = out(c);
    auto& buf = send[static_cast<std::size_t>(c)];
    buf.assign(static_cast<std::size_t>(size_of(pieces)), std::byte{0});
    std::byte* cur = buf.data();
    for (const Piece& p : pieces) LIBRA_TRY(pack_rect(p.layout, p.rect, cur, buf.data() + buf.size()));
    if (!buf.empty()) {
      LIBRA_ASSIGN_OR_RETURN(Request r, comm_.isend(base + c, tag, buf));
      group.add(r);
    }
  }
  // This rank's own share moves by copy (or sum) in its rank-order place.
  LIBRA_TRY(group.wait(comm_));
  for (int c = 0; c < cp_; ++c) {
    if (c == c_) {
      auto src = out(c);
      auto dst = in(c);
      for (std::size_t i = 0; i < src.size() && i < dst.size(); ++i) {
        if (dst[i].add) {
          LIBRA_TRY(add_rect(src[i].layout, dst[i].layout, dst[i].rect));
        } else {
          LIBRA_TRY(copy_rect(src[i].layout, dst[i].layout, dst[i].rect));
        }
      }
      continue;
    }
    const auto& buf = recv[static_cast<std::size_t>(c)];
    const std::byte* cur = buf.data();
    for (const Piece& p : in(c)) {
      // Sender and receiver layouts of a piece always share the element type.
      LIBRA_TRY(unpack_rect(p.layout, p.rect, p.layout.dtype, p.add, cur, buf.data() + buf.size()));
    }
  }
  return Status();
}

Status UlyssesExecutor::compute(bool backward) {
  TraceRecorder* tr = opts_.trace;
  const double t0 = tr ? tr->now_us() : 0;
  const auto c0 = std::chrono::steady_clock::now();
  const HeadRange qh = q_heads(c_), kh = kv_heads(c_);
  if (!backward) {
    kernel::ForwardArgs a;
    a.q = lq_.view(qh.begin, qh.end);
    a.k = lk_.view(kh.begin, kh.end);
    a.v = lv_.view(kh.begin, kh.end);
    a.o = lo_.view(qh.begin, qh.end);
    a.lse = llse_.view(qh.begin, qh.end);
    a.fragments = frags_;
    a.window = cfg_.shape.window;
    a.threads = opts_.threads;
    LIBRA_TRY(kernel::attention_forward(a));
  } else {
    kernel::BackwardArgs a;
    a.q = lq_.view(qh.begin, qh.end);
    a.k = lk_.view(kh.begin, kh.end);
    a.v = lv_.view(kh.begin, kh.end);
    a.o = lo_.view(qh.begin, qh.end);
    a.d_o = ldo_.view(qh.begin, qh.end);
    a.lse = llse_.view(qh.begin, qh.end);
    a.dq = ldq_.view(qh.begin, qh.end);
    a.dk = ldk_.view(kh.begin, kh.end);
    a.dv = ldv_.view(kh.begin, kh.end);
    a.fragments = frags_;
    a.window = cfg_.shape.window;
    a.threads = opts_.threads;
    LIBRA_TRY(kernel::attention_backward(a));
  }
  compute_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  if (tr) tr->record(backward ? "bwd compute" : "fwd compute", TraceRecorder::kCompute, t0, tr->now_us());
  return Status();
}

Result<ForwardOutputs> UlyssesExecutor::forward(const AttentionInputs& in) {
  const auto qn = static_cast<std::size_t>(lc_ * hq_ * d_), kn = static_cast<std::size_t>(lc_ * hkv_ * d_);
  Status local;
  if (in.q.size() != qn || in.k.size() != kn || in.v.size() != kn) {
    local = invalid_input(fmt::format("ulysses rank {}: q/k/v have {}/{}/{} elements, expected {}/{}/{}", r_,
                                      in.q.size(), in.k.size(), in.v.size(), qn, kn, kn));
  }
  LIBRA_TRY(agree_on_status(comm_, local, "executor forward inputs"));
  std::vector<std::byte> hq = to_dtype(in.q, dt_), hk = to_dtype(in.k, dt_), hv = to_dtype(in.v, dt_);
  std::vector<std::byte> ho(qn * static_cast<std::size_t>(kernel::dtype_bytes(dt_))), hlse(static_cast<std::size_t>(lc_ * hq_ * 4));
  const Layout Hq = home(hq, dt_, hq_, d_), Hk = home(hk, dt_, hkv_, d_), Hv = home(hv, dt_, hkv_, d_);
  const Layout Ho = home(ho, dt_, hq_, d_), Hlse = home(hlse, DType::kF32, hq_, 1);
  lq_ = whole(q_, dt_, q_heads(c_), d_);
  lk_ = whole(k_, dt_, kv_heads(c_), d_);
  lv_ = whole(v_, dt_, kv_heads(c_), d_);
  lo_ = whole(o_, dt_, q_heads(c_), d_);
  llse_ = whole(lse_, DType::kF32, q_heads(c_), 1);
  auto rows_of = [&](int c) { return std::pair<std::int64_t, std::int64_t>{c * lc_, (c + 1) * lc_}; };
  auto rect = [&](std::pair<std::int64_t, std::int64_t> rows, HeadRange h) {
    return Rect{slot_, rows.first, rows.second, h.begin, h.end};
  };
  // Scatter heads: my rows of peer c's heads go to c.
  LIBRA_TRY(all_to_all(
      kUlyssesTag + 0,
      [&](int c) {
        return std::vector<Piece>{{Hq, rect(rows_of(c_), q_heads(c))},
                                  {Hk, rect(rows_of(c_), kv_heads(c))},
                                  {Hv, rect(rows_of(c_), kv_heads(c))}};
      },
      [&](int c) {
        return std::vector<Piece>{{lq_, rect(rows_of(c), q_heads(c_))},
                                  {lk_, rect(rows_of(c), kv_heads(c_))},
                                  {lv_, rect(rows_of(c), kv_heads(c_))}};
      },
      "fwd scatter"));
  LIBRA_TRY(compute(false));
  LIBRA_TRY(all_to_all(
      kUlyssesTag + 1,
      [&](int c) {
        return std::vector<Piece>{{lo_, rect(rows_of(c), q_heads(c_))}, {llse_, rect(rows_of(c), q_heads(c_))}};
      },
      [&](int c) {
        return std::vector<Piece>{{Ho, rect(rows_of(c_), q_heads(c))}, {Hlse, rect(rows_of(c_), q_heads(c))}};
      },
      "fwd gather"));
  ForwardOutputs out;
  out.o = to_f32(ho, dt_);
  out.lse = to_f32(hlse, DType::kF32);
  return out;
}

Result<BackwardOutputs> UlyssesExecutor::backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                                  std::span<const float> d_o) {
  const auto qn = static_cast<std::size_t>(lc_ * hq_ * d_), kn = static_cast<std::size_t>(lc_ * hkv_ * d_);
  Status local;
  if (in.q.size() != qn || in.k.size() != kn || in.v.size() != kn || fwd.o.size() != qn || d_o.size() != qn ||
      fwd.lse.size() != static_cast<std::size_t>(lc_ * hq_)) {
    local = invalid_input(fmt::format("ulysses rank {}: backward tensors do not have L/CP x heads x head_dim elements", r_));
  }
  LIBRA_TRY(agree_on_status(comm_, local, "executor backward inputs"));
  std::vector<std::byte> hq = to_dtype(in.q, dt_), hk = to_dtype(in.k, dt_), hv = to_dtype(in.v, dt_);
  std::vector<std::byte> ho = to_dtype(fwd.o, dt_), hdo = to_dtype(d_o, dt_), hlse = to_dtype(fwd.lse, DType::kF32);
  std::vector<std::byte> hdq(qn * 4), hdk(kn * 4), hdv(kn * 4);
  const Layout Hq = home(hq, dt_, hq_, d_), Hk = home(hk, dt_, hkv_, d_), Hv = home(hv, dt_, hkv_, d_);
  const Layout Ho = home(ho, dt_, hq_, d_), Hdo = home(hdo, dt_, hq_, d_), Hlse = home(hlse, DType::kF32, hq_, 1);
  const Layout Hdq = home(hdq, DType::kF32, hq_, d_), Hdk = home(hdk, DType::kF32, hkv_, d_), Hdv = home(hdv, DType::kF32, hkv_, d_);
  lq_ = whole(q_, dt_, q_heads(c_), d_);
  lk_ = whole(k_, dt_, kv_heads(c_), d_);
  lv_ = whole(v_, dt_, kv_heads(c_), d_);
  lo_ = whole(o_, dt_, q_heads(c_), d_);
  ldo_ = whole(do_, dt_, q_heads(c_), d_);
  llse_ = whole(lse_, DType::kF32, q_heads(c_), 1);
  // Gradients are computed, sent and summed in fp32 whatever the input type.
  ldq_ = whole(dq_, DType::kF32, q_heads(c_), d_);
  ldk_ = whole(dk_, DType::kF32, kv_heads(c_), d_);
  ldv_ = whole(dv_, DType::kF32, kv_heads(c_), d_);
  auto rows_of = [&](int c) { return std::pair<std::int64_t, std::int64_t>{c * lc_, (c + 1) * lc_}; };
  auto rect = [&](std::pair<std::int64_t, std::int64_t> rows, HeadRange h) {
    return Rect{slot_, rows.first, rows.second, h.begin, h.end};
  };
  LIBRA_TRY(all_to_all(
      kUlyssesTag + 2,
      [&](int c) {
        const auto rows = rows_of(c_);
        return std::vector<Piece>{{Hq, rect(rows, q_heads(c))},   {Hdo, rect(rows, q_heads(c))},
                                  {Ho, rect(rows, q_heads(c))},   {Hlse, rect(rows, q_heads(c))},
                                  {Hk, rect(rows, kv_heads(c))},  {Hv, rect(rows, kv_heads(c))}};
      },
      [&](int c) {
        const auto rows = rows_of(c);
        return std::vector<Piece>{{lq_, rect(rows, q_heads(c_))},   {ldo_, rect(rows, q_heads(c_))},
                                  {lo_, rect(rows, q_heads(c_))},   {llse_, rect(rows, q_heads(c_))},
                                  {lk_, rect(rows, kv_heads(c_))},  {lv_, rect(rows, kv_heads(c_))}};
      },
      "bwd scatter"));
  LIBRA_TRY(compute(true));
  LIBRA_TRY(all_to_all(
      kUlyssesTag + 3,
      [&](int c) {
        const auto rows = rows_of(c);
        return std::vector<Piece>{{ldq_, rect(rows, q_heads(c_))}, {ldk_, rect(rows, kv_heads(c_))},
                                  {ldv_, rect(rows, kv_heads(c_))}};
      },
      [&](int c) {
        const auto rows = rows_of(c_);
        return std::vector<Piece>{{Hdq, rect(rows, q_heads(c))}, {Hdk, rect(rows, kv_heads(c)), true},
                                  {Hdv, rect(rows, kv_heads(c)), true}};
      },
      "bwd gather"));
  BackwardOutputs out;
  out.dq = to_f32(hdq, DType::kF32);
  out.dk = to_f32(hdk, DType::kF32);
  out.dv = to_f32(hdv, DType::kF32);
  return out;
}

}  // namespace

Result<std::unique_ptr<Executor>> make_ulysses_executor(Communicator& pool, std::span<const PackedSequence> sequences,
                                                        const PlanConfig& config, const ExecOptions& options) {
  auto ex = std::make_unique<UlyssesExecutor>(pool, std::vector<PackedSequence>(sequences.begin(), sequences.end()),
                                              config, options);
  LIBRA_TRY(ex->init());
  return std::unique_ptr<Executor>(std::move(ex));
}

}  // namespace libra
