// libra/executor.hpp: distributed attention executors and their trace.
//
// Defines `libra::Executor`, the drop-in replacement for a context-parallel
// core-attention call: every rank of a pool hands in Q, K and V of its home
// tokens (contract section 5: the L/CP tokens x of its slot with
// x / (L/CP) = its CP rank, all heads) and gets back exactly the output, the
// log-sum-exp and, in the backward pass, the gradients that plain causal
// attention over the whole packed sequences gives for those tokens.
//
// Two executors share the interface:
//   - make_plan_executor: runs a libra::Plan (modes tap, tap-split, and
//     ulysses as a plan). Follows the plan's per-chunk transfer lists: Q and
//     KV go to the worker computing a tile, O (and LSE) come back to the Q
//     home; backward sends Q, dO, O and LSE the same way, returns dQ and sums
//     dK/dV partials back onto the ranks holding those tokens. Pipelined over
//     the plan's M equal-head chunks (paper section 6.3): chunk m+1's input is
//     dispatched and chunk m-1's output returned while chunk m computes.
//   - make_ulysses_executor: the classic Ulysses baseline written without a
//     plan: a head-scatter all-to-all inside each slot's CP group, full
//     attention on h_q/CP heads per rank, all-to-all back.
// Both first agree with every rank on a fingerprint of what they will run;
// a disagreement ends every rank with the same error naming the ranks.
//
//   libra::Result<libra::Plan> plan = libra::make_plan(pool, cfg);
//   libra::ExecOptions opts;  opts.threads = 1;
//   auto ex = libra::make_plan_executor(pool_comm, *plan, opts);   // collective
//   libra::Result<libra::ForwardOutputs> f = (*ex)->forward({q, k, v});
//   libra::Result<libra::BackwardOutputs> g = (*ex)->backward({q, k, v}, *f, d_o);
//
// Tensors in the API are fp32, row-major [L/CP, heads, head_dim]; with a bf16
// plan (elem_bytes 2) they are rounded to bf16 for transfer and compute
// (LSE, dK/dV sums at the homes stay fp32).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "libra/comm.hpp"
#include "libra/plan.hpp"
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

// Gathers every rank's events on rank 0 of `comm` and writes one Chrome
// trace JSON file there (write_file_atomic). Collective.
[[nodiscard]] Status write_trace(Communicator& comm, const TraceRecorder& trace, const std::string& path);

struct ExecOptions {
  int threads = 1;                 // kernel threads per rank
  TraceRecorder* trace = nullptr;  // optional; must outlive the executor
};

// One rank's home tensors (fp32, row-major): q [L/CP, h_q, d], k and v
// [L/CP, h_kv, d].
struct AttentionInputs {
  std::span<const float> q, k, v;
};

struct ForwardOutputs {
  std::vector<float> o;    // [L/CP, h_q, d]; padding rows (past the sequence's tokens) are 0
  std::vector<float> lse;  // [L/CP, h_q]; natural log; padding rows 0
};

struct BackwardOutputs {
  std::vector<float> dq;      // [L/CP, h_q, d]
  std::vector<float> dk, dv;  // [L/CP, h_kv, d]
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Collective over the pool communicator.
  [[nodiscard]] virtual Result<ForwardOutputs> forward(const AttentionInputs& in) = 0;
  // `fwd` is this rank's forward result, d_o the output gradient [L/CP, h_q, d].
  [[nodiscard]] virtual Result<BackwardOutputs> backward(const AttentionInputs& in, const ForwardOutputs& fwd,
                                                         std::span<const float> d_o) = 0;
  // Seconds spent inside kernel calls by the last forward / backward call.
  virtual double last_compute_seconds() const = 0;
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

// Ranks agree on `fingerprint`: on a mismatch every rank returns the same
// kMismatch error listing which ranks hold which value.
[[nodiscard]] Status agree_on_fingerprint(Communicator& comm, std::uint64_t fingerprint, const std::string& what);

// ---- test harness: deterministic data and a whole-sequence reference ----

// Deterministic pseudo-random values in [-1, 1) from (seed, stream, index)
// (splitmix64; identical on every machine and standard library).
float harness_value(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// The home tensors of worker r (= slot * cp + c) for a data seed: each
// slot's whole-sequence tensors are generated from (seed, slot, tensor), so
// any rank and the reference see the same numbers. `tensor` 0 Q, 1 K, 2 V,
// 3 dO. The returned vector is [L/CP, heads, d].
std::vector<float> harness_home_tensor(std::uint64_t seed, const PlanConfig& config, int worker, int tensor);

// Whole-slot results of plain attention over all samples of one slot, laid
// out [L, heads, d] like the concatenation of the slot's homes. kNaive: the
// double-precision naive reference of libra/attention_reference.hpp (tiny
// shapes); kKernel: the fp32 kernel in one process on the whole sequence
// (no tiles, no communication), for sizes the naive reference cannot reach.
enum class ReferenceKind { kNaive, kKernel };
struct SlotReference {
  std::vector<double> o, lse, dq, dk, dv;
};
[[nodiscard]] Result<SlotReference> harness_reference(std::uint64_t seed, const PlanConfig& config,
                                                      const PackedSequence& sequence, int slot,
                                                      ReferenceKind kind = ReferenceKind::kNaive, int threads = 1);

// Error of a computed tensor against the reference over the rows of one
// home: max |x - ref| and that divided by max |ref| (relative to the
// tensor's scale, not per element, so near-zero entries do not dominate).
struct ErrorStats {
  double max_abs = 0;
  double max_ref = 0;
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  void merge(const ErrorStats& o);
};
ErrorStats compare_home(std::span<const float> got, std::span<const double> reference, std::int64_t row_begin,
                        std::int64_t rows, std::int64_t row_width);

// Tolerances (relative to the tensor's largest magnitude) that the tests
// and `libra exec --check` apply, by element size.
struct Tolerance {
  double o, lse, dq, dk, dv;
};
Tolerance tolerance_for(DType dtype);

}  // namespace libra
