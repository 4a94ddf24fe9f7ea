// libra/executor.hpp: distributed attention executors and their trace.
//
// Defines `libra::Executor`, the drop-in replacement for a context-parallel
// core-attention call: every rank of a pool hands in Q, K and V of its home
// tokens (contract section 5: the L/CP tokens x of its slot with
// x / (L/CP) = its CP rank, all heads) and gets back exactly the output, the
// log-sum-exp and, in the backward pass, the gradients that plain causal
// attention over the whole packed sequences gives for those tokens.
//
// Every executor is one engine running a RankSchedule (libra/schedule.hpp)
// over a Communicator (libra/comm.hpp: one all-to-all-v per phase and
// chunk) with an AttentionBackend (libra/backend.hpp: the kernel calls),
// forward and backward through the same pipeline loop (paper section 6.3):
// chunk m+1's input is posted and chunk m-1's output is in flight while
// chunk m computes. The schedules differ:
//   - make_plan_executor: a libra::Plan (modes tap, tap-split, and ulysses as
//     a plan), via make_rank_schedule;
//   - make_ulysses_executor: the classic Ulysses baseline written without a
//     plan (make_ulysses_schedule): a head-scatter all-to-all inside each
//     slot's CP group, full attention on h_q/CP heads per rank, all-to-all back;
//   - make_schedule_executor: any schedule.
// All first agree with every rank on a fingerprint of what they will run;
// a disagreement ends every rank with the same error naming the ranks.
//
//   libra::Result<libra::Plan> plan = libra::make_plan(pool, cfg);
//   libra::ExecOptions opts;  opts.threads = 1;
//   auto ex = libra::make_plan_executor(pool_comm, *plan, opts);   // collective
//   libra::Result<libra::ForwardOutputs> f = (*ex)->forward({q, k, v});
//   libra::Result<libra::BackwardOutputs> g = (*ex)->backward({q, k, v}, *f, d_o);
//
// A training loop that owns its output memory (a caching allocator, buffers
// reused per layer) calls forward_into / backward_into instead: the forms
// above allocate fresh vectors, whose first touch costs page faults that
// are not attention work.
//
// Tensors in the API are row-major [L/CP, heads, head_dim]. Q, K, V, O and
// dO are fp32 or the plan's own type (AttentionShape::dtype: bf16 or fp16
// bit patterns, HomeTensor / HomeOutput); fp32 ones are rounded to the
// plan's type for transfer and compute, the plan's type is used where it
// lies, with no conversion. LSE, dQ and the dK/dV sums are always fp32.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "libra/backend.hpp"
#include "libra/comm.hpp"
#include "libra/plan.hpp"
#include "libra/schedule.hpp"
#include "libra/status.hpp"

namespace libra {

// Per-rank Chrome trace-event recorder (catapult "X" complete events, time
// in microseconds since the recorder was made). Lanes: 0 compute, 1
// transfers in flight (post -> observed completion), 2 blocked waits.
class TraceRecorder {
 public:
  enum Lane : int { kCompute = 0, kTransfer = 1, kWait = 2 };
  TraceRecorder();
  explicit TraceRecorder(std::chrono::steady_clock::time_point origin);
  double now_us() const;
  void record(const std::string& name, Lane lane, double begin_us, double end_us);
  struct Event {
    std::string name;
    Lane lane;
    double begin_us, end_us;
  };
  std::vector<Event> events() const;
  // The events as a comma-separated list of JSON objects with pid = rank.
  std::string json_events(int rank) const;

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// The one trace file format of libra's engines (the C++ executor's
// write_trace and libra.torch.write_trace through the binding): Chrome
// trace-event JSON {"displayTimeUnit":"ms","traceEvents":[...]} of every
// rank's json_events: per rank (pid) a process_name "rank N" and a
// thread_name per lane (tid 0 compute, 1 transfer, 2 wait), then "X"
// events {name, cat = the lane's name, ph, pid, tid, ts, dur} in
// microseconds of the steady clock (CLOCK_MONOTONIC: one origin for every
// process of a machine). Names: "{fwd|bwd} compute chunk M", a transfer
// "{fwd|bwd} {input|output} chunk M" (libra.torch: one per element class,
// " class C" appended) from its post to the end of its wait, and
// "wait " + the transfer's name for the wait itself.
[[nodiscard]] std::string trace_document(const std::vector<std::string>& rank_events);

// Gathers every rank's events on rank 0 of `comm` and writes one Chrome
// trace JSON file there (write_file_atomic, trace_document). Collective.
[[nodiscard]] Status write_trace(Communicator& comm, const TraceRecorder& trace, const std::string& path);

struct ExecOptions {
  int threads = 1;                 // kernel threads per rank
  TraceRecorder* trace = nullptr;  // optional; must outlive the executor
  // The kernel; null: make_cpu_backend(). Must outlive the executor.
  AttentionBackend* backend = nullptr;
  // make_plan_executor: send cross-node inputs through node-mates
  // (ScheduleOptions::relay, libra/relay.hpp). All ranks must agree (the
  // schedule fingerprint checks it).
  bool relay = false;
};

// A home tensor the executor reads: fp32, or 16-bit bit patterns of type
// `dtype` (bf16 or fp16), which must then be the plan's type.
struct HomeTensor {
  const void* data = nullptr;
  std::size_t elements = 0;
  DType dtype = DType::kF32;
  HomeTensor() = default;
  HomeTensor(std::span<const float> x) : data(x.data()), elements(x.size()) {}  // NOLINT: implicit by design
  HomeTensor(const std::vector<float>& x) : HomeTensor(std::span<const float>(x)) {}  // NOLINT
  HomeTensor(std::span<const std::uint16_t> bits, DType type) : data(bits.data()), elements(bits.size()), dtype(type) {}
};

// A home output the executor writes (O): fp32, or the plan's 16-bit type.
struct HomeOutput {
  void* data = nullptr;
  std::size_t elements = 0;
  DType dtype = DType::kF32;
  HomeOutput() = default;
  HomeOutput(std::span<float> x) : data(x.data()), elements(x.size()) {}  // NOLINT
  HomeOutput(std::vector<float>& x) : HomeOutput(std::span<float>(x)) {}  // NOLINT
  HomeOutput(std::span<std::uint16_t> bits, DType type) : data(bits.data()), elements(bits.size()), dtype(type) {}
};

// One rank's home tensors: q [L/CP, h_q, d], k and v [L/CP, h_kv, d].
struct AttentionInputs {
  HomeTensor q, k, v;
};

struct ForwardOutputs {
  std::vector<float> o;    // [L/CP, h_q, d]; padding rows (past the sequence's tokens) are 0
  std::vector<float> lse;  // [L/CP, h_q]; natural log; padding rows 0
};

struct BackwardOutputs {
  std::vector<float> dq;      // [L/CP, h_q, d]
  std::vector<float> dk, dv;  // [L/CP, h_kv, d]
};

// Caller-owned outputs, shaped as above. Every element is written (padding
// rows with 0), so they need no initialisation.
struct ForwardOutputSpans {
  HomeOutput o;
  std::span<float> lse;
};
struct BackwardOutputSpans {
  std::span<float> dq, dk, dv;
};

// Where the last forward or backward call of a rank spent its time.
// CPU times are of the calling thread (CLOCK_THREAD_CPUTIME_ID): with
// ExecOptions::threads == 1 the kernel runs on it, and the difference
// cpu - kernel_cpu is the executor's own work (packing, unpacking, type
// conversions, buffer set-up), which a busy or oversubscribed machine does
// not inflate the way it inflates wall times.
struct PassStats {
  double wall = 0;        // the whole call
  double kernel = 0;      // inside backend calls (wall)
  double cpu = 0;         // the whole call (thread CPU time)
  double kernel_cpu = 0;  // inside backend calls (thread CPU time)
  double wait = 0;        // blocked in Communicator::wait (wall)
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Collective over the pool communicator.
  [[nodiscard]] virtual Status forward_into(const AttentionInputs& in, const ForwardOutputSpans& out) = 0;
  // o and lse are this rank's forward outputs, d_o the output gradient [L/CP, h_q, d].
  [[nodiscard]] virtual Status backward_into(const AttentionInputs& in, const HomeTensor& o,
                                             std::span<const float> lse, const HomeTensor& d_o,
                                             const BackwardOutputSpans& out) = 0;
  // Home sizes in floats: q, o and d_o (and dq); k and v (and dk, dv); lse.
  virtual std::size_t q_elements() const = 0;
  virtual std::size_t kv_elements() const = 0;
  virtual std::size_t lse_elements() const = 0;
  // The same, allocating the outputs.
  [[nodiscard]] Result<ForwardOutputs> forward(const AttentionInputs& in);
  [[nodiscard]] Result<BackwardOutputs> backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                                 std::span<const float> d_o);
  // Seconds spent inside kernel calls by the last forward / backward call.
  virtual double last_compute_seconds() const = 0;
  // All timings of the last forward / backward call.
  virtual PassStats last_stats() const = 0;
};

// `pool` must have plan.num_workers() ranks, numbered as the plan numbers
// workers (r = slot * cp + cp_rank). Collective: agrees on the plan
// fingerprint first.
[[nodiscard]] Result<std::unique_ptr<Executor>> make_plan_executor(Communicator& pool, const Plan& plan,
                                                                   const ExecOptions& options);

// The Ulysses baseline for the same pool and shape (config.mode, block_size,
// head_shards and chunks are ignored; cp must divide heads_q, and heads_kv
// must divide by cp or cp by heads_kv). Collective: agrees on a fingerprint
// of pool and config first.
[[nodiscard]] Result<std::unique_ptr<Executor>> make_ulysses_executor(Communicator& pool,
                                                                      std::span<const PackedSequence> sequences,
                                                                      const PlanConfig& config,
                                                                      const ExecOptions& options);

// Runs `schedule` (this rank's: schedule.worker == pool.rank()) on `pool`.
// Checks every program of the schedule against its buffers first.
// Collective: agrees on schedule.fingerprint.
[[nodiscard]] Result<std::unique_ptr<Executor>> make_schedule_executor(Communicator& pool, RankSchedule schedule,
                                                                       const ExecOptions& options);

}  // namespace libra
