// exec/harness.hpp: the executors' check harness, for tests and
// `libra exec --check` only (target libra_exec_harness, not installed).
//
// Defines deterministic home tensors for any worker, a whole-sequence
// reference of plain attention per slot, error metrics of a home against
// it, and the tolerances the tests and --check apply.
//
//   std::vector<float> q = libra::harness_home_tensor(seed, cfg, rank, 0);
//   libra::Result<libra::SlotReference> ref = libra::harness_reference(seed, cfg, pool[slot], slot);
//   libra::ErrorStats e = libra::compare_home(out.o, ref->o, row_begin, rows, heads_q * head_dim);
//   bool ok = e.rel() <= libra::tolerance_for(cfg.shape.dtype).o;
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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

}  // namespace libra
