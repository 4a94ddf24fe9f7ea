// The training-step model of the end-to-end figures (docs/simulator.md,
// "End-to-end step"): micro-batches flowing through S pipeline stages in a
// 1F1B schedule, replicas coupled in groups that wait for their slowest
// member at every micro-batch, and the gradient all-reduce. Pure functions of
// plain values, so that the tests check them on hand-made cases.
//
//   // Two replicas, one stage, coupled: each micro-batch costs its slower replica.
//   std::vector<ReplicaCosts> r = {{{{1, 2}}, {{3, 1}}}, {{{2, 2}}, {{1, 1}}}};  // [replica][mb][stage]
//   double t = step_seconds(r, {.span = 2}, /*allreduce=*/0.5);   // (2 + 2) + (3 + 1) + 0.5 = 8.5
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace libra::detail {

// One micro-batch's forward and backward seconds on one pipeline stage.
struct StageCost {
  double fwd = 0;
  double bwd = 0;
};
// One micro-batch's cost on every stage, first stage first.
using MicroBatchCost = std::vector<StageCost>;
// A replica's (or a coupled group's) micro-batches in GA order.
using ReplicaCosts = std::vector<MicroBatchCost>;

// Makespan of the non-interleaved 1F1B schedule (Megatron's default with
// PP): stage s runs min(S - 1 - s, G) warm-up forwards, then one forward
// and one backward in turn, then the remaining backwards. A forward waits
// for the same micro-batch's forward on the stage before, a backward for
// its backward on the stage after (its own forward precedes it on the
// stage). No transfer time between stages. One stage: the sum of every
// micro-batch's forward and backward, in order.
double one_f_one_b_seconds(const ReplicaCosts& mbs);

// How replicas wait for each other inside a step. span 1: not at all (pure
// DP + CP: they meet at the gradient all-reduce); span k: replicas
// k * i .. k * i + k - 1 wait for their slowest member at every micro-batch
// (an expert-parallel all-to-all across ep / cp replicas, or a pool); span
// >= the replica count: all of them.
struct Coupling {
  std::int64_t span = 1;  // kCoupleAll (0): every replica
};
inline constexpr std::int64_t kCoupleAll = 0;
// "none", "all" or the span as a number; the inverse of parse_coupling.
std::string coupling_name(std::int64_t span);

// Elementwise max over the members of a coupled group: every member runs
// each micro-batch's stage in the slowest member's time.
ReplicaCosts coupled_costs(std::span<const ReplicaCosts> members);

// The step: replicas grouped by `coupling`, each group's 1F1B makespan, the
// slowest group, plus the gradient all-reduce. Every replica lists the same
// number of micro-batches and stages.
double step_seconds(std::span<const ReplicaCosts> replicas, Coupling coupling, double allreduce_seconds);

// Layers of stage s when `layers` are split over `stages`: the first
// layers % stages stages take one more.
std::int64_t stage_layers(std::int64_t layers, std::int64_t stages, std::int64_t s);

}  // namespace libra::detail
