// The training-step model (step_model.hpp): 1F1B pipeline makespan,
// coupled replica groups, the step.
#include "sim/step_model.hpp"

#include <algorithm>
#include <cstddef>

namespace libra::detail {

namespace {

struct Op {
  std::size_t mb = 0;
  bool backward = false;
};

// Stage s's order of operations in the non-interleaved 1F1B schedule.
std::vector<Op> stage_order(std::size_t stages, std::size_t s, std::size_t mbs) {
  std::vector<Op> ops;
  const std::size_t warmup = std::min(stages - 1 - s, mbs);
  std::size_t f = 0, b = 0;
  for (; f < warmup; ++f) ops.push_back({f, false});
  while (f < mbs) {
    ops.push_back({f++, false});
    ops.push_back({b++, true});
  }
  while (b < mbs) ops.push_back({b++, true});
  return ops;
}

}  // namespace

double one_f_one_b_seconds(const ReplicaCosts& mbs) {
  if (mbs.empty() || mbs[0].empty()) return 0;
  const std::size_t g_count = mbs.size(), stages = mbs[0].size();
  // end[s][mb] of forwards and backwards; < 0 while not run.
  std::vector<std::vector<double>> fwd_end(stages, std::vector<double>(g_count, -1)), bwd_end = fwd_end;
  std::vector<std::vector<Op>> order(stages);
  for (std::size_t s = 0; s < stages; ++s) order[s] = stage_order(stages, s, g_count);
  std::vector<std::size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0);
  // Each pass runs every operation whose dependency has run; 1F1B never
  // deadlocks, so every pass makes progress.
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < stages; ++s) {
      while (next[s] < order[s].size()) {
        const Op op = order[s][next[s]];
        double ready = 0;
        if (!op.backward && s > 0) ready = fwd_end[s - 1][op.mb];
        if (op.backward && s + 1 < stages) ready = bwd_end[s + 1][op.mb];
        if (ready < 0) break;
        const StageCost& c = mbs[op.mb][s];
        const double end = std::max(free_at[s], ready) + (op.backward ? c.bwd : c.fwd);
        (op.backward ? bwd_end : fwd_end)[s][op.mb] = end;
        free_at[s] = end;
        ++next[s];
        progress = true;
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

std::string coupling_name(std::int64_t span) {
  if (span == kCoupleAll) return "all";
  if (span == 1) return "none";
  return std::to_string(span);
}

ReplicaCosts coupled_costs(std::span<const ReplicaCosts> members) {
  ReplicaCosts out = members[0];
  for (const ReplicaCosts& m : members.subspan(1)) {
    for (std::size_t g = 0; g < out.size(); ++g) {
      for (std::size_t s = 0; s < out[g].size(); ++s) {
        out[g][s].fwd = std::max(out[g][s].fwd, m[g][s].fwd);
        out[g][s].bwd = std::max(out[g][s].bwd, m[g][s].bwd);
      }
    }
  }
  return out;
}

double step_seconds(std::span<const ReplicaCosts> replicas, Coupling coupling, double allreduce_seconds) {
  const std::size_t n = replicas.size();
  const std::size_t span = coupling.span == kCoupleAll || static_cast<std::size_t>(coupling.span) > n
                               ? std::max<std::size_t>(n, 1)
                               : static_cast<std::size_t>(std::max<std::int64_t>(coupling.span, 1));
  double slowest = 0;
  for (std::size_t first = 0; first < n; first += span) {
    const auto group = replicas.subspan(first, std::min(span, n - first));
    const double t = group.size() == 1 ? one_f_one_b_seconds(group[0]) : one_f_one_b_seconds(coupled_costs(group));
    slowest = std::max(slowest, t);
  }
  return slowest + allreduce_seconds;
}

std::int64_t stage_layers(std::int64_t layers, std::int64_t stages, std::int64_t s) {
  return layers / stages + (s < layers % stages ? 1 : 0);
}

}  // namespace libra::detail
