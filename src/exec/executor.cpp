// The execution engine: one RankSchedule run over a Communicator with an
// AttentionBackend. Both passes go through run_pass, the pipeline loop of
// paper section 6.3; everything the loop moves is a move of the schedule's
// flat program (libra/program.hpp), carried out here with copies, so this
// file has no knowledge of plans, tiles, segments or Ulysses.
#include <fmt/format.h>

#include <time.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <new>

#include "libra/backend.hpp"
#include "libra/comm.hpp"
#include "core/fault.hpp"
#include "libra/executor.hpp"
#include "libra/program.hpp"
#include "libra/schedule.hpp"

namespace libra {

namespace {

// A byte buffer kept across calls (an executor serves every layer) and not
// zero-filled again on every call: only the bytes segments fill are read.
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
  std::byte* data() { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0;
};

// Message bytes: fully written before they are read, so never zeroed.
class WireBuffer {
 public:
  void ensure(std::size_t n) {
    if (n > cap_) {
      p_.reset(new std::byte[n]);
      cap_ = n;
    }
    n_ = n;
  }
  std::byte* data() { return p_.get(); }
  std::size_t size() const { return n_; }

 private:
  std::unique_ptr<std::byte[]> p_;
  std::size_t n_ = 0, cap_ = 0;
};

// One all-to-all-v in flight, traced from posting to the end of its wait.
struct Wire {
  WireBuffer send, recv;
  PendingExchange pending;
  double posted_us = 0;
};

bool is_in(Phase p) { return p == Phase::kFwdIn || p == Phase::kBwdIn; }

// dst[0..n) += src[0..n), both fp32 (src possibly unaligned: message bytes).
void add_f32(std::byte* dst, const std::byte* src, std::int64_t n) {
  float* d = reinterpret_cast<float*>(dst);
  for (std::int64_t j = 0; j < n; ++j) {
    float v;
    std::memcpy(&v, src + 4 * j, 4);
    d[j] += v;
  }
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Fills a pass's wall and CPU totals when the call returns.
class PassTimer {
 public:
  explicit PassTimer(PassStats& s) : s_(s), c0_(thread_cpu_seconds()) { s_ = PassStats{}; }
  ~PassTimer() {
    s_.wall = since(t0_);
    s_.cpu = thread_cpu_seconds() - c0_;
  }
  PassTimer(const PassTimer&) = delete;
  PassTimer& operator=(const PassTimer&) = delete;

 private:
  PassStats& s_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double c0_;
};

class ScheduleExecutor final : public Executor {
 public:
  ScheduleExecutor(Communicator& comm, RankSchedule s, ExecOptions opts)
      : comm_(comm), s_(std::move(s)), opts_(opts) {}

  Status init();
  Status forward_into(const AttentionInputs& in, const ForwardOutputSpans& out) override;
  Status backward_into(const AttentionInputs& in, const HomeTensor& o, std::span<const float> lse,
                       const HomeTensor& d_o, const BackwardOutputSpans& out) override;
  std::size_t q_elements() const override { return static_cast<std::size_t>(s_.home_vectors(Field::kQ) * s_.head_dim); }
  std::size_t kv_elements() const override { return static_cast<std::size_t>(s_.home_vectors(Field::kK) * s_.head_dim); }
  std::size_t lse_elements() const override { return static_cast<std::size_t>(s_.home_vectors(Field::kLse)); }
  double last_compute_seconds() const override { return stats_.kernel; }
  PassStats last_stats() const override { return stats_; }

 private:
  RawBuffer& buf(Field f) { return compute_[static_cast<std::size_t>(f)]; }
  std::byte* at(Field f, Loc where, std::int64_t vector) {
    const auto fi = static_cast<std::size_t>(f);
    std::byte* base = where == Loc::kHome ? home_[fi] : where == Loc::kStage ? stage_[fi].data() : buf(f).data();
    return base + vector * s_.vector_bytes(f);
  }
  struct Sizes {
    const char* name;
    Field field;
    std::size_t got;
    DType dtype;  // of the caller's tensor
  };
  Status check_sizes(std::initializer_list<Sizes> sizes) const;
  void load_home(Field f, const HomeTensor& x);
  void output_home(Field f, void* out, DType type);
  void finish_output(Field f, const HomeOutput& out);
  void prepare(bool backward);
  void run_moves(std::span<const Move> moves, const std::byte* recv, std::byte* send);
  Status post(Phase p, const ExchangeProgram& x, Wire& w);
  Status wait(Phase p, int m, Wire& w, bool stage = false);
  Status compute(Pass pass, int m);
  Status grow_workspace(std::size_t bytes);
  Status of_this_rank(Status s) const;
  Status run_pass(Pass pass);
  Status run_pass_steps(Pass pass);

  Communicator& comm_;
  RankSchedule s_;
  RankProgram prog_;
  ExecOptions opts_;
  std::unique_ptr<AttentionBackend> owned_backend_;
  AttentionBackend* backend_ = nullptr;
  // Home buffers: fp32 fields are the caller's tensors themselves (inputs
  // are only read; outputs are written straight into the result vectors);
  // other types live converted in home_store_.
  std::array<std::byte*, kNumFields> home_{};
  std::array<RawBuffer, kNumFields> home_store_, compute_, stage_;
  // [pass][chunk]: each pass keeps its own message buffers across calls
  // (stages_: relayed schedules only).
  std::array<std::vector<Wire>, 2> in_, out_, stages_;
  std::vector<std::byte> workspace_;
  PassStats stats_;
};

Status ScheduleExecutor::init() {
  if (opts_.threads < 1) return invalid_input(fmt::format("executor: threads {} must be at least 1", opts_.threads));
  backend_ = opts_.backend;
  if (!backend_) {
    owned_backend_ = make_cpu_backend();
    backend_ = owned_backend_.get();
  }
  Status local = validate_schedule(s_);
  if (local.ok()) {
    Result<RankProgram> p = make_rank_program(s_);
    if (p.ok()) prog_ = std::move(*p);
    local = p.status();
  }
  if (local.ok()) local = backend_->supports(s_.dtype);
  LIBRA_TRY(agree_on_status(comm_, local, "executor setup"));
  for (auto* w : {&in_, &out_})
    for (auto& per_pass : *w) per_pass.resize(static_cast<std::size_t>(s_.chunks));
  if (s_.relayed)
    for (auto& per_pass : stages_) per_pass.resize(static_cast<std::size_t>(s_.chunks));
  return Status();
}

// Sizes against the schedule's home buffers; element types: fp32, or the
// field's own type (a 16-bit tensor is used where it lies).
Status ScheduleExecutor::check_sizes(std::initializer_list<Sizes> sizes) const {
  for (const Sizes& x : sizes) {
    const auto want = static_cast<std::size_t>(s_.home_vectors(x.field) * s_.width(x.field));
    if (x.got != want) {
      return invalid_input(fmt::format("executor rank {}: {} has {} elements, expected {} (L/CP rows x heads{})",
                                       s_.worker, x.name, x.got, want, x.field == Field::kLse ? "" : " x head_dim"));
    }
    const DType own = field_dtype(x.field, s_.dtype);
    if (x.dtype != DType::kF32 && x.dtype != own) {
      return invalid_input(fmt::format("executor rank {}: {} is {} but the plan's type for it is {} (give fp32 or {})",
                                       s_.worker, x.name, dtype_name(x.dtype), dtype_name(own), dtype_name(own)));
    }
  }
  return Status();
}

void ScheduleExecutor::load_home(Field f, const HomeTensor& x) {
  const DType t = field_dtype(f, s_.dtype);
  if (x.dtype == t) {
    // Read only: In phases pack and copy from home, never into it.
    home_[static_cast<std::size_t>(f)] = static_cast<std::byte*>(const_cast<void*>(x.data));
    return;
  }
  RawBuffer& b = home_store_[static_cast<std::size_t>(f)];
  b.ensure(x.elements * static_cast<std::size_t>(dtype_bytes(t)));
  store_all_from_f32(static_cast<const float*>(x.data), static_cast<std::int64_t>(x.elements), t, b.data());
  home_[static_cast<std::size_t>(f)] = b.data();
}

// An output's home: the caller's memory itself when it has the field's
// type. Every real row is written by an exchange or a kernel call, so only
// the padding rows are zeroed, and dK/dV, which are sums, entirely.
void ScheduleExecutor::output_home(Field f, void* out, DType type) {
  std::byte* home = static_cast<std::byte*>(out);
  if (type != field_dtype(f, s_.dtype)) {
    RawBuffer& b = home_store_[static_cast<std::size_t>(f)];
    b.ensure(static_cast<std::size_t>(s_.home_vectors(f) * s_.vector_bytes(f)));
    home = b.data();
  }
  home_[static_cast<std::size_t>(f)] = home;
  const std::int64_t heads = is_kv_field(f) ? s_.heads_kv : s_.heads_q;
  const std::int64_t first = (f == Field::kDk || f == Field::kDv) ? 0 : s_.home_tokens * heads;
  std::memset(home + first * s_.vector_bytes(f), 0, static_cast<std::size_t>((s_.home_vectors(f) - first) * s_.vector_bytes(f)));
}

void ScheduleExecutor::finish_output(Field f, const HomeOutput& out) {
  const DType t = field_dtype(f, s_.dtype);
  if (out.dtype == t) return;
  load_all_as_f32(home_[static_cast<std::size_t>(f)], static_cast<std::int64_t>(out.elements), t,
                  static_cast<float*>(out.data));
}

// Compute buffers sized for the pass.
void ScheduleExecutor::prepare(bool backward) {
  for (int fi = 0; fi < kNumFields; ++fi) {
    const Field f = static_cast<Field>(fi);
    const bool needed = backward || f == Field::kQ || f == Field::kK || f == Field::kV || f == Field::kO || f == Field::kLse;
    if (!needed) continue;
    RawBuffer& b = buf(f);
    b.ensure(static_cast<std::size_t>(s_.compute_vectors(f) * s_.vector_bytes(f)));
    if (s_.relayed) stage_[static_cast<std::size_t>(fi)].ensure(static_cast<std::size_t>(s_.stage_vectors(f) * s_.vector_bytes(f)));
    // The kernel adds into dK and dV.
    if (f == Field::kDk || f == Field::kDv) b.zero();
  }
}

// Carries out moves: buffers to the send message, the receive message to
// buffers (assigned, or fp32 sums added), or buffer to buffer.
void ScheduleExecutor::run_moves(std::span<const Move> moves, const std::byte* recv, std::byte* send) {
  for (const Move& mv : moves) {
    const std::int64_t vb = s_.vector_bytes(mv.field);
    const auto n = static_cast<std::size_t>(mv.run * vb);
    const std::byte* from = mv.src == Loc::kWire ? recv + mv.wire_byte : at(mv.field, mv.src, mv.src_offset);
    std::byte* to = mv.dst == Loc::kWire ? send + mv.wire_byte : at(mv.field, mv.dst, mv.dst_offset);
    const std::int64_t from_step = mv.src_stride * vb, to_step = mv.dst_stride * vb;
    for (std::int64_t i = 0; i < mv.rows; ++i) {
      if (mv.add) {
        // dK/dV partial sums: fp32 on the wire and at home.
        add_f32(to + i * to_step, from + i * from_step, mv.run * s_.width(mv.field));
      } else {
        std::memcpy(to + i * to_step, from + i * from_step, n);
      }
    }
  }
}

Status ScheduleExecutor::post(Phase p, const ExchangeProgram& x, Wire& w) {
  w.send.ensure(static_cast<std::size_t>(x.total_send_bytes));
  w.recv.ensure(static_cast<std::size_t>(x.total_recv_bytes));
  run_moves(x.gather, nullptr, w.send.data());
  if (opts_.trace) w.posted_us = opts_.trace->now_us();
  LIBRA_ASSIGN_OR_RETURN(w.pending, comm_.post({std::span<const std::byte>(w.send.data(), w.send.size()), x.send_bytes,
                                                x.send_displs, std::span<std::byte>(w.recv.data(), w.recv.size()),
                                                x.recv_bytes, x.recv_displs}));
  // Inputs kept are ready now; outputs kept are applied in order at the end.
  if (is_in(p)) run_moves(x.local, nullptr, nullptr);
  return Status();
}

Status ScheduleExecutor::wait(Phase p, int m, Wire& w, bool stage) {
  TraceRecorder* tr = opts_.trace;
  const double w0 = tr ? tr->now_us() : 0;
  const auto t0 = std::chrono::steady_clock::now();
  LIBRA_TRY(comm_.wait(w.pending));
  stats_.wait += since(t0);
  if (tr) {
    const std::string pass = (p == Phase::kFwdIn || p == Phase::kFwdOut) ? "fwd" : "bwd";
    const std::string name = fmt::format("{} {} chunk {}", pass, stage ? "stage" : is_in(p) ? "input" : "output", m);
    const double w1 = tr->now_us();
    tr->record("wait " + name, TraceRecorder::kWait, w0, w1);
    tr->record(name, TraceRecorder::kTransfer, w.posted_us, w1);
  }
  return Status();
}

// The allocation that fails under memory pressure is named, with its size,
// rather than surfacing as a bare std::bad_alloc.
Status ScheduleExecutor::grow_workspace(std::size_t bytes) {
  try {
    workspace_.resize(bytes);
  } catch (const std::bad_alloc&) {
    return internal_error(fmt::format("executor rank {}: out of memory allocating {} bytes of kernel workspace",
                                      comm_.rank(), bytes));
  }
  return Status();
}

// A backend's error (the kernel's scratch allocation failing, say) as this
// rank's: the one line the job prints names the rank that failed. (The
// test hook's injected failures name it already.)
Status ScheduleExecutor::of_this_rank(Status s) const {
  if (s.ok() || s.message().starts_with(fmt::format("rank {}: ", comm_.rank()))) return s;
  return Error(s.error().code(), fmt::format("executor rank {}: {}", comm_.rank(), s.error().message()));
}

Status ScheduleExecutor::compute(Pass pass, int m) {
  TraceRecorder* tr = opts_.trace;
  const double t0 = tr ? tr->now_us() : 0;
  const auto c0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_seconds();
  for (const KernelCall& c : s_.calls(pass, m)) {
    const auto frags = s_.call_fragments(c);
    auto view = [&](Field f) {
      const bool home = is_kv_field(f) ? c.kv_home : c.q_home;
      const Strided& v = is_kv_field(f) ? c.kv : c.q;
      return View{at(f, home ? Loc::kHome : Loc::kCompute, v.offset), field_dtype(f, s_.dtype), v.rows, v.run, s_.width(f), v.stride * s_.width(f),
                  Device::kCpu};
    };
    if (pass == Pass::kForward) {
      AttentionForward a{view(Field::kQ), view(Field::kK),   view(Field::kV), view(Field::kO),
                         view(Field::kLse), frags,           s_.window,       opts_.threads};
      LIBRA_TRY(grow_workspace(backend_->forward_workspace_bytes(a)));
      LIBRA_TRY(of_this_rank(backend_->forward(a, workspace_)));
    } else {
      AttentionBackward a{view(Field::kQ),  view(Field::kK),  view(Field::kV),  view(Field::kO),
                          view(Field::kDo), view(Field::kLse), view(Field::kDq), view(Field::kDk),
                          view(Field::kDv), frags,             s_.window,        opts_.threads};
      LIBRA_TRY(grow_workspace(backend_->backward_workspace_bytes(a)));
      LIBRA_TRY(of_this_rank(backend_->backward(a, workspace_)));
    }
    // Let the communication library move the other chunks' data.
    LIBRA_TRY(comm_.progress());
  }
  stats_.kernel += since(c0);
  stats_.kernel_cpu += thread_cpu_seconds() - cpu0;
  if (tr) {
    tr->record(fmt::format("{} compute chunk {}", pass == Pass::kForward ? "fwd" : "bwd", m), TraceRecorder::kCompute,
               t0, tr->now_us());
  }
  return Status();
}

// The pipeliner schedule of paper section 6.3, shared by both passes: post
// chunk 0's inputs; for each chunk m, post chunk m+1's inputs, wait only for
// chunk m's, compute it while chunk m+1 arrives and chunk m-1 returns, then
// post chunk m's outputs; wait for every return at the end and apply them in
// the schedule's fixed order.
Status ScheduleExecutor::run_pass(Pass pass) {
  Status st;
  try {
    st = run_pass_steps(pass);
  } catch (const std::bad_alloc& e) {
    // As an error, so that the exchanges already posted are waited out
    // below before their buffers can be freed.
    st = internal_error(fmt::format("executor rank {}: out of memory: {}", comm_.rank(), e.what()));
  }
  if (!st.ok()) {
    // Peers may still move bytes into or out of this pass's buffers (the
    // in-process communicator copies straight between ranks' buffers, MPI
    // owns them until the request completes): wait out every exchange this
    // rank posted before its caller can free them. A peer that failed too
    // has posted the same exchanges up to the same point, or withdraws.
    for (auto* wires : {&stages_[static_cast<std::size_t>(pass)], &in_[static_cast<std::size_t>(pass)],
                        &out_[static_cast<std::size_t>(pass)]}) {
      for (Wire& w : *wires) {
        if (w.pending.valid()) (void)comm_.wait(w.pending);
        w.pending = {};
      }
    }
  }
  return st;
}

Status ScheduleExecutor::run_pass_steps(Pass pass) {
  const PassProgram& pp = prog_.pass(pass);
  const int M = s_.chunks;
  std::vector<Wire>& ins = in_[static_cast<std::size_t>(pass)];
  std::vector<Wire>& outs = out_[static_cast<std::size_t>(pass)];
  std::vector<Wire>& stages = stages_[static_cast<std::size_t>(pass)];
  // Relayed: stage(m) lands in the staging buffer before in(m), which sends
  // from it, is posted; stages run a chunk ahead (libra/schedule.hpp).
  const bool relayed = !pp.stage.empty();
  auto post_stage = [&](int m) -> Status {
    if (!relayed || m >= M) return Status();
    return post(pp.in_phase, pp.stage[static_cast<std::size_t>(m)], stages[static_cast<std::size_t>(m)]);
  };
  auto land_stage = [&](int m) -> Status {
    if (!relayed) return Status();
    Wire& w = stages[static_cast<std::size_t>(m)];
    LIBRA_TRY(wait(pp.in_phase, m, w, /*stage=*/true));
    run_moves(pp.stage[static_cast<std::size_t>(m)].scatter, w.recv.data(), nullptr);
    return Status();
  };
  LIBRA_TRY(detail::fault_point(detail::FaultPoint::kBeforePost));
  LIBRA_TRY(post_stage(0));
  LIBRA_TRY(land_stage(0));
  LIBRA_TRY(post(pp.in_phase, pp.in[0], ins[0]));
  // Stage 1 after in 0: on NVLink beside in 0's cross-node bytes, not ahead
  // of stage 0 (the simulator prices stage 0, then in 0).
  LIBRA_TRY(post_stage(1));
  LIBRA_TRY(detail::fault_point(detail::FaultPoint::kMidPass));
  for (int m = 0; m < M; ++m) {
    const auto mu = static_cast<std::size_t>(m);
    if (m + 1 < M) {
      LIBRA_TRY(land_stage(m + 1));
      LIBRA_TRY(post(pp.in_phase, pp.in[mu + 1], ins[mu + 1]));
      LIBRA_TRY(post_stage(m + 2));
    }
    LIBRA_TRY(wait(pp.in_phase, m, ins[mu]));
    run_moves(pp.in[mu].scatter, ins[mu].recv.data(), nullptr);
    LIBRA_TRY(compute(pass, m));
    LIBRA_TRY(post(pp.out_phase, pp.out[mu], outs[mu]));
  }
  for (int m = 0; m < M; ++m) LIBRA_TRY(wait(pp.out_phase, m, outs[static_cast<std::size_t>(m)]));
  // Compute rows of an output are final once its chunk computed (a dK/dV
  // rectangle goes home after its last use), so the outputs kept are read
  // now, in the same order as the receipts.
  for (const Move& mv : pp.apply) {
    run_moves(std::span<const Move>(&mv, 1), mv.src == Loc::kWire ? outs[static_cast<std::size_t>(mv.chunk)].recv.data() : nullptr,
              nullptr);
  }
  return Status();
}

Status ScheduleExecutor::forward_into(const AttentionInputs& in, const ForwardOutputSpans& out) {
  PassTimer timer(stats_);
  constexpr DType kF32 = DType::kF32;
  LIBRA_TRY(agree_on_status(comm_,
                            check_sizes({{"q", Field::kQ, in.q.elements, in.q.dtype},
                                         {"k", Field::kK, in.k.elements, in.k.dtype},
                                         {"v", Field::kV, in.v.elements, in.v.dtype},
                                         {"o (output)", Field::kO, out.o.elements, out.o.dtype},
                                         {"lse (output)", Field::kLse, out.lse.size(), kF32}}),
                            "executor forward inputs"));
  load_home(Field::kQ, in.q);
  load_home(Field::kK, in.k);
  load_home(Field::kV, in.v);
  output_home(Field::kO, out.o.data, out.o.dtype);
  output_home(Field::kLse, out.lse.data(), kF32);
  prepare(false);
  LIBRA_TRY(run_pass(Pass::kForward));
  finish_output(Field::kO, out.o);
  return Status();
}

Status ScheduleExecutor::backward_into(const AttentionInputs& in, const HomeTensor& o, std::span<const float> lse,
                                       const HomeTensor& d_o, const BackwardOutputSpans& out) {
  PassTimer timer(stats_);
  constexpr DType kF32 = DType::kF32;
  LIBRA_TRY(agree_on_status(
      comm_,
      check_sizes({{"q", Field::kQ, in.q.elements, in.q.dtype},
                   {"k", Field::kK, in.k.elements, in.k.dtype},
                   {"v", Field::kV, in.v.elements, in.v.dtype},
                   {"o", Field::kO, o.elements, o.dtype},
                   {"lse", Field::kLse, lse.size(), kF32},
                   {"d_o", Field::kDo, d_o.elements, d_o.dtype},
                   {"dq (output)", Field::kDq, out.dq.size(), kF32},
                   {"dk (output)", Field::kDk, out.dk.size(), kF32},
                   {"dv (output)", Field::kDv, out.dv.size(), kF32}}),
      "executor backward inputs"));
  load_home(Field::kQ, in.q);
  load_home(Field::kK, in.k);
  load_home(Field::kV, in.v);
  load_home(Field::kO, o);
  load_home(Field::kLse, lse);
  load_home(Field::kDo, d_o);
  output_home(Field::kDq, out.dq.data(), kF32);
  output_home(Field::kDk, out.dk.data(), kF32);
  output_home(Field::kDv, out.dv.data(), kF32);
  prepare(true);
  return run_pass(Pass::kBackward);
}

}  // namespace

Result<ForwardOutputs> Executor::forward(const AttentionInputs& in) {
  ForwardOutputs out;
  out.o.resize(q_elements());
  out.lse.resize(lse_elements());
  LIBRA_TRY(forward_into(in, {out.o, out.lse}));
  return out;
}

Result<BackwardOutputs> Executor::backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                           std::span<const float> d_o) {
  BackwardOutputs out;
  out.dq.resize(q_elements());
  out.dk.resize(kv_elements());
  out.dv.resize(kv_elements());
  LIBRA_TRY(backward_into(in, fwd.o, fwd.lse, HomeTensor(d_o), {out.dq, out.dk, out.dv}));
  return out;
}

Result<std::unique_ptr<Executor>> make_schedule_executor(Communicator& pool, RankSchedule schedule,
                                                         const ExecOptions& options) {
  if (pool.size() != schedule.workers || pool.rank() != schedule.worker) {
    return invalid_input(fmt::format("executor: rank {} of a {}-rank communicator was given the schedule of worker {} "
                                     "of {}",
                                     pool.rank(), pool.size(), schedule.worker, schedule.workers));
  }
  LIBRA_TRY(agree_on_fingerprint(pool, schedule.fingerprint, schedule.what));
  auto ex = std::make_unique<ScheduleExecutor>(pool, std::move(schedule), options);
  LIBRA_TRY(ex->init());
  return std::unique_ptr<Executor>(std::move(ex));
}

Result<std::unique_ptr<Executor>> make_plan_executor(Communicator& pool, const Plan& plan, const ExecOptions& options) {
  // The size check is agreed on like the fingerprint: a rank that returned
  // alone would leave the others waiting on it in the collective below.
  Status size_ok;
  if (pool.size() != plan.num_workers()) {
    size_ok = invalid_input(fmt::format("executor: the pool communicator has {} ranks but the plan has {} workers "
                                        "(P = {}, CP = {}); run with W = P * CP ranks per pool",
                                        pool.size(), plan.num_workers(), plan.pool_size(), plan.config().cp));
  }
  LIBRA_TRY(agree_on_status(pool, size_ok, "executor"));
  // Agree before building: the schedule of a plan another rank does not
  // hold would not match its messages.
  LIBRA_TRY(agree_on_fingerprint(pool, plan.fingerprint(), "plan"));
  LIBRA_ASSIGN_OR_RETURN(RankSchedule s, make_rank_schedule(plan, pool.rank(), {.relay = options.relay}));
  return make_schedule_executor(pool, std::move(s), options);
}

Result<std::unique_ptr<Executor>> make_ulysses_executor(Communicator& pool, std::span<const PackedSequence> sequences,
                                                        const PlanConfig& config, const ExecOptions& options) {
  const std::int64_t W = static_cast<std::int64_t>(sequences.size()) * config.cp;
  if (pool.size() != W) {
    return invalid_input(fmt::format("ulysses executor: the pool communicator has {} ranks but the pool has {} slots x "
                                     "CP {} = {} workers",
                                     pool.size(), sequences.size(), config.cp, W));
  }
  // Relays are chosen from a plan's transfers (plan_relays); this schedule
  // has none, so a relay would be claimed, not done.
  Result<RankSchedule> s = options.relay ? Result<RankSchedule>(invalid_input(
                                               "ulysses: relay is not supported by the direct Ulysses schedule (no plan "
                                               "to relay by); plan it as mode ulysses"))
                                         : make_ulysses_schedule(sequences, config, pool.rank());
  LIBRA_TRY(agree_on_status(pool, s.status(), "ulysses schedule"));
  return make_schedule_executor(pool, std::move(*s), options);
}

}  // namespace libra
