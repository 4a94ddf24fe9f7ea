#include "libra/sampler.hpp"

#include <string>
#include <utility>

#include "placement/random.hpp"

namespace libra {

std::uint64_t step_seed(std::uint64_t seed, std::int64_t step) {
  // Two splitmix64 rounds so that nearby (seed, step) pairs give unrelated
  // shuffles; the mapping is fixed forever because resumed runs rely on it.
  std::uint64_t state = seed;
  const std::uint64_t a = splitmix64_next(state);
  std::uint64_t s2 = a ^ static_cast<std::uint64_t>(step);
  return splitmix64_next(s2);
}

Result<PlacementSampler> PlacementSampler::from_workloads(std::vector<std::int64_t> workloads,
                                                          const SamplerOptions& options) {
  const std::int64_t p = options.placement.pool_size;
  const std::int64_t d = options.gbs;
  const std::int64_t dp = options.dp == 0 ? p : options.dp;
  if (p < 1) return invalid_input("--pool-size " + std::to_string(p) + ": must be at least 1");
  if (d < 1) return invalid_input("--gbs " + std::to_string(d) + ": must be at least 1");
  if (dp < 1) return invalid_input("--dp " + std::to_string(dp) + ": must be at least 1");
  if (d > std::int64_t{1} << 30) {
    return invalid_input("--gbs " + std::to_string(d) + ": exceeds the limit of 1073741824 sequences per step");
  }
  if (d % p != 0) return invalid_input("--pool-size " + std::to_string(p) + ": must divide --gbs " + std::to_string(d));
  if (dp % p != 0) return invalid_input("--pool-size " + std::to_string(p) + ": must divide --dp " + std::to_string(dp));
  if (d % dp != 0) return invalid_input("--dp " + std::to_string(dp) + ": must divide --gbs " + std::to_string(d));
  const auto n = static_cast<std::int64_t>(workloads.size());
  if (n < d) {
    return invalid_input("source: " + std::to_string(n) + " packed sequences, fewer than --gbs " +
                         std::to_string(d) + " (one optimizer step)");
  }
  for (std::size_t i = 0; i < workloads.size(); ++i) {
    if (workloads[i] < 0) {
      return invalid_input("packed sequence " + std::to_string(i) + ": negative workload " +
                           std::to_string(workloads[i]));
    }
  }
  PlacementSampler s;
  s.options_ = options;
  s.options_.dp = dp;
  s.workloads_ = std::move(workloads);
  s.num_steps_ = n / d;
  return s;
}

Result<PlacementSampler> PlacementSampler::create(std::vector<PackedSequence> sequences,
                                                  const SamplerOptions& options) {
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> w, sequence_workloads(sequences));
  LIBRA_ASSIGN_OR_RETURN(PlacementSampler s, from_workloads(std::move(w), options));
  s.sequences_ = std::move(sequences);
  return s;
}

std::int64_t PlacementSampler::dropped_tail() const {
  return static_cast<std::int64_t>(workloads_.size()) - num_steps_ * options_.gbs;
}

Result<SamplerStep> PlacementSampler::at(std::int64_t step) const {
  if (step < 0 || step >= num_steps_) {
    return invalid_input("sampler step " + std::to_string(step) + ": out of range [0, " +
                         std::to_string(num_steps_) + ")");
  }
  const std::int64_t d = options_.gbs;
  const std::int64_t first = step * d;
  const std::span<const std::int64_t> window(workloads_.data() + first, static_cast<std::size_t>(d));
  PlacementOptions po = options_.placement;
  po.seed = step_seed(options_.placement.seed, step);
  po.dp = options_.dp;  // elastic pools fuse pools of one GA step, so they need the layout's DP
  auto placed = [&]() -> Result<WindowPlacement> {
    if (!options_.placer) return place_window(window, po);
    const auto seqs = sequences_.empty() ? std::span<const PackedSequence>()
                                         : std::span<const PackedSequence>(sequences_).subspan(
                                               static_cast<std::size_t>(first), static_cast<std::size_t>(d));
    return options_.placer(seqs, window, step);
  }();
  if (!placed.ok()) {
    return invalid_input("step " + std::to_string(step) + " (sequences " + std::to_string(first) + ".." +
                         std::to_string(first + d - 1) + "): " + placed.error().message());
  }
  LIBRA_ASSIGN_OR_RETURN(StepLayout layout, layout_window(*placed, options_.dp));
  SamplerStep out;
  out.step = step;
  out.order.reserve(layout.order.size());
  for (std::int32_t i : layout.order) out.order.push_back(first + i);
  out.placement = std::move(placed).value();
  out.layout = std::move(layout);
  return out;
}

std::optional<SamplerStep> PlacementSampler::next() {
  if (cursor_ < 0 || cursor_ >= num_steps_) return std::nullopt;
  auto s = at(cursor_);
  if (!s.ok()) {
    last_error_ = s.error();
    return std::nullopt;
  }
  last_error_.reset();
  ++cursor_;
  return std::move(s).value();
}

}  // namespace libra
