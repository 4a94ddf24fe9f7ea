// exec/harness.hpp: the executors' check harness, for tests and
// `libra exec --check` only (target libra_exec_harness, not installed).
//
// Defines deterministic home tensors for any worker, a whole-sequence
// reference of plain attention per slot, error metrics of a home against
// it, the tolerances the tests and --check apply, and the distributed check
// itself (run_check): the one function `libra exec`, the MPI test program
// and the in-process executor tests run.
//
//   std::vector<float> q = libra::harness_home_tensor(seed, cfg, rank, 0);
//   libra::Result<libra::SlotReference> ref = libra::harness_reference(seed, cfg, pool[slot], slot);
//   libra::ErrorStats e = libra::compare_home(out.o, ref->o, row_begin, rows, heads_q * head_dim);
//   bool ok = e.rel() <= libra::tolerance_for(cfg.shape.dtype).o;
//   libra::Result<libra::CheckReport> r = libra::run_check(world, job);   // collective
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "libra/comm.hpp"
#include "libra/executor.hpp"
#include "libra/plan.hpp"
#include "libra/status.hpp"

namespace libra {


// Deterministic pseudo-random values in [-1, 1) from (seed, stream, index)
// (splitmix64; identical on every machine and standard library).
float harness_value(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// The home tensors of worker r (= slot * cp + c) for a data seed: each
// slot's whole-sequence tensors are generated from (seed, slot, tensor), so
// any rank and the reference see the same numbers. `tensor` 0 Q, 1 K, 2 V,
// 3 dO. The returned vector is [L/CP, heads, d], rows in home order
// (config.home_layout).
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
// The same over worker r's whole home under config's home layout (got:
// [L/CP, row_width] in home order; reference: [L, row_width] packed order).
ErrorStats compare_home(std::span<const float> got, std::span<const double> reference, const PlanConfig& config,
                        int worker, std::int64_t row_width);

// Tolerances (relative to the tensor's largest magnitude) that the tests
// and `libra exec --check` apply, by element size.
struct Tolerance {
  double o, lse, dq, dk, dv;
};
Tolerance tolerance_for(DType dtype);

// ---- the distributed check --------------------------------------------------

// One job of pools side by side on `world`: the world splits into pools of
// W = P x CP ranks (numbered inside a pool as the contract numbers workers),
// each runs forward and backward through an executor on deterministic data
// and, with `check`, gathers every home on its pool's rank 0, which compares
// each slot with the whole-sequence reference.
struct CheckJob {
  PlanConfig config;              // plan: the plan's own config
  bool ulysses_direct = false;    // the Ulysses baseline executor (make_ulysses_executor), no plan
  const Plan* plan = nullptr;     // a saved plan every pool runs (its pool, not `sequences`)
  // Pool k of the job is sequences [(first_pool + k) * P, (first_pool + k + 1) * P).
  std::span<const PackedSequence> sequences;
  std::string source = "pool";    // names the sequences in errors
  std::int64_t first_pool = 0;
  int pool_size = 0;              // P; 0: world size / cp
  std::uint64_t seed = 1;         // pool k's data seed: seed * 1000003 + first_pool + k
  int threads = 1;                // kernel threads per rank
  bool relay = false;             // ExecOptions::relay
  std::string backend = "cpu";    // a registered attention backend (make_backend)
  int repeat = 1;                 // forward + backward runs on one executor; the last is timed and checked
  bool check = true;
  std::optional<ReferenceKind> reference;  // none: naive fp64 unless a slot is too large for it
  TraceRecorder* trace = nullptr;
  // A rank's own failure once the pools run, while its peers may wait on it
  // (`libra exec` ends the job here). Every error run_check returns without
  // passing through on_fatal is the same on every rank.
  std::function<void(const Error&)> on_fatal;
};

inline constexpr int kCheckedTensors = 5;  // O, LSE, dQ, dK, dV
inline constexpr const char* kCheckedTensorNames[kCheckedTensors] = {"O", "LSE", "dQ", "dK", "dV"};

struct PoolResult {
  std::int64_t pool = 0;  // index in the source (0 for a saved plan)
  std::int64_t samples = 0;
  std::vector<std::int64_t> tokens_per_slot;
  bool planned = false;   // the plan figures below are set
  std::int64_t tiles = 0, comm_bytes = 0;
  std::int64_t relayed_pairs = 0;  // CheckJob::relay: (chunk, sender, receiver) pairs relayed
  double imbalance = 0;
  std::array<ErrorStats, kCheckedTensors> errors{};  // over the pool's homes (check)
  ReferenceKind reference = ReferenceKind::kNaive;   // the weaker one when a pool mixes them
};

struct MaxMean {
  double max = 0, mean = 0;  // over the world's ranks
};

struct CheckReport {
  int ranks = 0, pool_ranks = 0, pool_size = 0, pools = 0;
  MaxMean forward_wall, forward_compute, backward_wall, backward_compute;
  // The executor's own thread CPU time outside the kernel over its kernel CPU time.
  MaxMean forward_own, backward_own;
  std::vector<PoolResult> pool_results;  // every pool, on world rank 0 only
};

// Collective over `world`.
[[nodiscard]] Result<CheckReport> run_check(Communicator& world, const CheckJob& job);

// ---- the report of a run -----------------------------------------------------
// What `libra exec` prints, as values (harness_report.cpp), so that tests
// and bindings read the same statistics, verdict and JSON as the CLI (the
// Python binding: libra.report, python/src/report.cpp):
//
//   libra::CheckVerdict v = libra::check_verdict(report, libra::tolerance_for(cfg.shape.dtype));
//   if (!v.ok) use(libra::kCheckedTensorNames[v.first_failed], v.total[v.first_failed].rel());
//   std::string json = libra::run_report_json(description, report, &v);

// The check's verdict: every tensor's error merged over the pools against
// its tolerance.
struct CheckVerdict {
  std::array<double, kCheckedTensors> tolerance{};
  std::array<ErrorStats, kCheckedTensors> total{};  // over every pool
  bool ok = true;         // every tensor of `total` within its tolerance
  int first_failed = -1;  // the first tensor beyond it, -1 when ok
  // Tensor i of `errors` (the total or one pool's) within its tolerance.
  bool within(const std::array<ErrorStats, kCheckedTensors>& errors, int i) const {
    return errors[static_cast<std::size_t>(i)].rel() <= tolerance[static_cast<std::size_t>(i)];
  }
};
// `tolerance` per tensor (O, LSE, dQ, dK, dV), as tolerance_for gives them
// or one for all (`libra exec --check-tolerance`).
[[nodiscard]] CheckVerdict check_verdict(const CheckReport& report, const Tolerance& tolerance);
[[nodiscard]] Tolerance uniform_tolerance(double tolerance);

// "naive fp64" or "fp32 kernel in one process".
[[nodiscard]] const char* reference_name(ReferenceKind kind);

// The slowest rank's value and the mean over the ranks (run_check gathers every rank's times into these).
[[nodiscard]] MaxMean max_mean_of(std::span<const double> per_rank);

// The executor's own thread CPU time outside the kernel over its kernel CPU time (0 without kernel time).
[[nodiscard]] inline double own_cpu_fraction(double cpu, double kernel_cpu) {
  return kernel_cpu > 0 ? (cpu - kernel_cpu) / kernel_cpu : 0.0;
}

// Wall time of the slowest rank over the busiest rank's kernel time, minus 1.
[[nodiscard]] inline double wall_overhead(const MaxMean& wall, const MaxMean& compute) {
  return wall.max / compute.max - 1;
}

// How a run was asked for: what the report says besides the CheckReport.
struct RunDescription {
  PlanConfig config;
  std::string mode;   // as printed: "tap", "tap (plan FILE)", "... with KV prefix", ", relayed inputs"
  std::vector<std::int32_t> chunk_widths;  // query heads a chunk; printed for an unequal cut only
  std::string source;
  double length_scale = 1.0;  // sample lengths of a built-in corpus scaled by it
  int threads = 1;
  bool relay = false;         // pools report their relayed pairs
  std::string trace;          // the trace file written, or empty
};

// The report as one JSON document (`libra exec --json`; docs/executor.md):
// the run, every pool, the timings, the trace, and with a verdict the
// check. Indented by one space.
[[nodiscard]] std::string run_report_json(const RunDescription& run, const CheckReport& report,
                                          const CheckVerdict* verdict);

// Pool `index` of P sequences from `all` (sequences [index * P, (index + 1) * P)); `source` names `all` in the error.
[[nodiscard]] Result<std::vector<PackedSequence>> draw_pool(std::span<const PackedSequence> all, const std::string& source,
                                                            std::int64_t index, int P);

}  // namespace libra
