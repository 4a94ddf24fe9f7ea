// sim/plan_pricer.hpp (private): the simulator's latency of one planned
// pool, for units outside simulator.cpp (elastic pools price fused domains
// with exactly the cost model that prices ordinary pools).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "libra/plan.hpp"
#include "libra/simulator.hpp"

namespace libra::detail {

class PlanPricer {
 public:
  // `config` must outlive the pricer; seq_len is the packed length planned.
  PlanPricer(const SimConfig& config, std::int64_t seq_len);
  ~PlanPricer();
  PlanPricer(const PlanPricer&) = delete;
  PlanPricer& operator=(const PlanPricer&) = delete;
  // Forward core-attention seconds of one layer for the pool-step of `plan`
  // whose workers sit on `gpus` (the libra-full variant when pipelined),
  // with the device noise of (window, step).
  double forward_seconds(const Plan& plan, std::span<const std::int64_t> gpus, std::uint64_t window,
                         std::uint64_t step, bool pipelined) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace libra::detail
