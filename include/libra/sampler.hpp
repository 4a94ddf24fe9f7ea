// libra/sampler.hpp: the data-sampler adapter that applies sequence
// placement to a training run.
//
// Defines `libra::PlacementSampler`: it wraps a stream of packed sequences in
// loader order, cuts it into windows of GBS consecutive sequences (one per
// optimizer step; a trailing partial window is dropped and counted), places
// each window with a placement mode and hands it out reordered as S' (GA-major,
// replica-minor; see placement.hpp). Step s is a pure function of (sequences,
// options, s): the `random` mode's seed is derived from (seed, s), so a
// resumed run needs nothing but the step index and no sampler state goes into
// a checkpoint.
//
//   libra::SamplerOptions o{.gbs = 128, .dp = 16, .placement = {.pool_size = 8}};
//   auto sampler = libra::PlacementSampler::create(std::move(sequences), o);
//   if (!sampler.ok()) return fail(sampler.error());
//   sampler->seek(resume_step);
//   while (auto step = sampler->next()) {       // std::optional<SamplerStep>
//     for (std::int64_t i : step->order) feed(sampler->sequence(i));
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "libra/workload.hpp"
#include "libra/placement.hpp"
#include "libra/status.hpp"

namespace libra {

struct SamplerOptions {
  std::int64_t gbs = 0;          // D: sequences per optimizer step
  std::int64_t dp = 0;           // DP replicas; 0 means dp = pool_size
  PlacementOptions placement{};  // pool size, mode, base seed
  // When set, places every window instead of place_window: (the window's
  // sequences, empty for a sampler built from workloads; its workloads; the
  // step) -> a placement of the window into pools of placement.pool_size.
  // The sim stage's priced elastic fusing (libra::priced_elastic_placer in
  // elastic_sim.hpp) is one: the placement stage has no cost model.
  using Placer = std::function<Result<WindowPlacement>(std::span<const PackedSequence>,
                                                       std::span<const std::int64_t>, std::int64_t)>;
  Placer placer{};
};

struct SamplerStep {
  std::int64_t step = 0;
  // S' as indices into the wrapped sequence list (global, not window-local):
  // order[g*DP + r] is what replica r trains on at GA index g.
  std::vector<std::int64_t> order;
  WindowPlacement placement;  // window-local indices (0 .. GBS-1)
  StepLayout layout;
};

// splitmix64-mixed seed of step `step` for base seed `seed`: what the
// `random` mode of step `step` uses.
std::uint64_t step_seed(std::uint64_t seed, std::int64_t step);

class PlacementSampler {
 public:
  // Validates the configuration (GBS divisible by P, P dividing DP, DP
  // dividing GBS, at least GBS sequences) and every sequence's workload.
  [[nodiscard]] static Result<PlacementSampler> create(std::vector<PackedSequence> sequences,
                                                       const SamplerOptions& options);
  // The same from workloads alone, for planning without the lengths.
  [[nodiscard]] static Result<PlacementSampler> from_workloads(std::vector<std::int64_t> workloads,
                                                               const SamplerOptions& options);

  std::int64_t num_steps() const { return num_steps_; }
  std::int64_t dropped_tail() const;  // sequences after the last full window
  const SamplerOptions& options() const { return options_; }
  // Empty when built from workloads.
  const std::vector<PackedSequence>& sequences() const { return sequences_; }
  const PackedSequence& sequence(std::int64_t index) const { return sequences_.at(static_cast<std::size_t>(index)); }
  const std::vector<std::int64_t>& workloads() const { return workloads_; }

  // Step `step` (0 .. num_steps()-1), independent of any cursor. Errors: step
  // out of range, a window whose workloads are all zero.
  [[nodiscard]] Result<SamplerStep> at(std::int64_t step) const;

  // Cursor API for a training loop: next() returns the step at the cursor and
  // advances; std::nullopt at the end (or on an error, kept in last_error()).
  std::optional<SamplerStep> next();
  void seek(std::int64_t step) { cursor_ = step; }
  std::int64_t position() const { return cursor_; }
  const std::optional<Error>& last_error() const { return last_error_; }

 private:
  PlacementSampler() = default;
  SamplerOptions options_{};
  std::vector<PackedSequence> sequences_;
  std::vector<std::int64_t> workloads_;
  std::int64_t num_steps_ = 0;
  std::int64_t cursor_ = 0;
  std::optional<Error> last_error_;
};

}  // namespace libra
