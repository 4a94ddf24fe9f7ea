// Internal: the random stream and length model behind the built-in corpora,
// exposed to the tests and the calibration notes in docs/corpora.md.
#pragma once

#include <cstdint>
#include <vector>

#include "libra/splitmix64.hpp"

namespace libra::detail {

// libra's splitmix64 stream with a unit-interval draw.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return splitmix64_next(state_); }
  // Uniform in the open interval (0, 1): the top 53 bits plus one half.
  double next_unit() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Standard normal quantile Phi^-1(p) for p in (0, 1).
double inverse_normal_cdf(double p);

// Sample lengths with a lognormal body up to the p99 and a Pareto tail above
// it, truncated at the longest sample c = cap_fraction * max_length:
//   Q(u) = exp(mu + sigma * Phi^-1(u))                 u <= 0.99
//   Q(u) = p99 * (1 - v * (1 - (p99 / c)^alpha))^(-1 / alpha)
//          with v = (u - 0.99) / 0.01                   u >  0.99
// with mu = ln(median), sigma = ln(p99 / median) / Phi^-1(0.99): the tail is
// a Pareto of index alpha truncated to [p99, c], so Q(0.5) is the median,
// Q(0.99) the p99 and Q(1) the longest sample c exactly (before rounding).
// Two tail parameters: alpha sets how the 1% above the p99 spreads (how many
// heavy packed sequences a window holds, hence random grouping's R-1), the
// cap how far it reaches (whether one sample can outweigh a pool, hence
// VRSP's R-1). cap_fraction 1 is the one-parameter model of v1 and v2.
//   LengthModel m(644, 71006, 0.3, 1 << 20, 0.5);  // samples in [1, 2^19]
class LengthModel {
 public:
  static constexpr double kTailStart = 0.99;
  LengthModel(double median, double p99, double tail_alpha, std::int64_t max_length, double cap_fraction = 1.0);
  double quantile(double u) const;
  // Maps a uniform (0, 1) draw to a length in [1, max_length].
  std::int64_t sample(double uniform01) const;

 private:
  double mu_, sigma_, x0_, alpha_;
  std::int64_t max_;
  double tail_cut_ = 0;
};

std::vector<std::int64_t> generate_lengths(const LengthModel& model, std::int64_t count, std::uint64_t seed);

}  // namespace libra::detail
