// libra/placement.hpp: sequence placement, the first level of Libra (paper
// section 4).
//
// Defines the placement modes (VRSP, paper Algorithm 1, and the baselines the
// paper compares it with, plus a refining mode of our own), the per-window
// placement of the GBS packed sequences of one optimizer step into GBS/P
// pools of exactly P sequences, the lower bound on the best achievable
// imbalance R, the paper's law-of-large-numbers prediction (eq. 4), and the
// layout that maps pools to gradient-accumulation (GA) indices and DP replicas
// (planning contract, section 3), and elastic pools (`vrsp-elastic`, ours):
// pools of one GA step that are fused into one TAP domain when an
// indivisible outlier sequence would otherwise make its pool the straggler.
//
// Every mode is a pure function of the window's workloads F_i (and, for
// `random`, the seed): it returns a permutation of the window, so the step's
// raw-sample multiset is unchanged.
//
//   std::vector<std::int64_t> f = {90, 10, 50, 50, 30, 70, 20, 80};
//   libra::Result<libra::WindowPlacement> w =
//       libra::place_window(f, {.pool_size = 4, .mode = libra::PlacementMode::kVrsp});
//   // w->pools[k][slot] indexes f; w->loads[k] = sum of F in pool k;
//   // w->imbalance = max_k load / mean_k load - 1.
//   libra::Result<libra::StepLayout> l = libra::layout_window(*w, /*dp=*/8);
//   // l->order is S': the window indices in the order a data loader hands
//   // them out, GA-major and replica-minor.
//
//   // Elastic pools need the GA structure (dp) to fuse pools of one GA step:
//   auto e = libra::place_window(f, {.pool_size = 2, .mode = libra::PlacementMode::kVrspElastic, .dp = 4});
//   // e->domains: lists of pool indices run as one TAP domain (k*P slots);
//   // e->imbalance: worst domain's load per worker over the window mean - 1.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/workload.hpp"
#include "libra/status.hpp"

namespace libra {

enum class PlacementMode {
  kVrsp,        // paper Algorithm 1, exactly as planning contract section 3
  kSampler,     // consecutive groups of P in loader order (production today)
  kRandom,      // seeded Fisher-Yates shuffle, then consecutive groups of P
  kZigzag,      // sort by decreasing F, deal to pools in boustrophedon order
  kZigzagSwap,  // zigzag, then heaviest<->lightest pool swaps while they help
  kVrspRefine,  // VRSP, then cardinality-preserving improvement; never worse
  kVrspElastic, // VRSP, plus pools of one GA step fused around outliers (ours)
};

// "vrsp", "sampler", "random", "zigzag", "zigzag-swap", "vrsp-refine",
// "vrsp-elastic".
[[nodiscard]] Result<PlacementMode> parse_placement_mode(std::string_view name);
std::string_view placement_mode_name(PlacementMode mode);
// The modes that place whole pools and never fuse them (every mode but
// kVrspElastic), in the order of the enum: the ones the simulator and
// `libra place --summary` compare.
std::span<const PlacementMode> all_placement_modes();

// How vrsp-elastic chooses the pools it fuses (docs/elastic.md compares them).
enum class ElasticRule {
  // Static buddy groups: when VRSP leaves a pool above the threshold, the
  // window is re-placed with fused domains at fixed pool positions of a GA
  // step (positions [j*k, (j+1)*k) of the step's DP/P pools), filled
  // heaviest-first with the outliers first and loads compared per pool, so
  // the outliers' buddies stay light. Process groups can be created once.
  kBuddy,
  // VRSP's pools and layout unchanged; per GA step the heaviest pool above
  // the threshold is fused with the step's k-1 lightest pools. Which pools
  // fuse changes from step to step (dynamic process groups).
  kLightest,
};
// "buddy", "lightest".
[[nodiscard]] Result<ElasticRule> parse_elastic_rule(std::string_view name);
std::string_view elastic_rule_name(ElasticRule rule);

struct ElasticOptions {
  std::int64_t max_pools = 2;  // k: at most k pools per domain (k*P*CP workers)
  // Fuse only when VRSP's predicted R - 1 exceeds this, and only pools whose
  // load exceeds the window's mean pool load by more than this.
  double threshold = 0.05;
  ElasticRule rule = ElasticRule::kBuddy;
  // Where the DP replicas sit, for the buddy rule's fixed positions: replica
  // r holds GPUs [r*cp, (r+1)*cp), GPUs are numbered node-major and nodes
  // supernode-major (the simulator's topology). Any field 0: unknown, and
  // the buddy domains tile each GA step's pools from position 0.
  struct Topology {
    std::int64_t cp = 0;
    std::int64_t gpus_per_node = 0;
    std::int64_t nodes_per_supernode = 0;
    friend bool operator==(const Topology&, const Topology&) = default;
  } topology{};
};

// The buddy rule's fused domains in one GA step of `pools_per_ga` pools of
// `pool_size` replicas (pool position q holds replicas [q*P, (q+1)*P)): the
// first position of each domain (domain j: positions [starts[j], +k)). A
// domain is k adjacent pools; left to right, a position starts one when the
// domain touches the fewest supernodes, then the fewest nodes, that any k
// adjacent pools of the step touch (so a domain that fits a supernode stays
// on one), else it stays unfused. Without a topology: 0, k, 2k, ...
// k < 2 or k > pools_per_ga: none.
std::vector<std::int64_t> buddy_domain_starts(std::int64_t pools_per_ga, std::int64_t pool_size, std::int64_t k,
                                              const ElasticOptions::Topology& topology);

// Where a pool's slots sit, for the node-interleaved slot order: slot s
// holds GPUs [s*cp, (s+1)*cp) of a node-aligned pool. 0 in either: off.
struct NodeInterleave {
  std::int64_t cp = 0;
  std::int64_t gpus_per_node = 0;
  friend bool operator==(const NodeInterleave&, const NodeInterleave&) = default;
};

// The slot order that spreads a pool's heaviest sequences over the nodes it
// spans (issue 20). VRSP lists a pool heaviest first, so with CP below the
// GPUs per node its two heaviest sequences share the first node, and that
// node's NICs carry both of their exchanges. Here the sequences, heaviest
// first (ties: lower slot), are dealt to the pool's nodes serpentine (nodes
// 0, 1, .., N-1, then N-1, .., 0, ...; a full node is skipped), each node
// filling its slots in order: with two slots per node, node n holds the
// n-th heaviest and the n-th lightest, which minimises the heaviest node's
// load. workloads[s] is slot s's F; the result is order[s'] = the slot whose
// sequence moves to slot s'. The identity when gpus_per_node is not a
// multiple of cp (a slot would straddle nodes), when a slot fills a node or
// more, or when the pool fits one node.
std::vector<std::int32_t> node_interleaved_slots(std::span<const std::int64_t> workloads,
                                                 const NodeInterleave& where);

struct PlacementOptions {
  std::int64_t pool_size = 8;  // P
  PlacementMode mode = PlacementMode::kVrsp;
  std::uint64_t seed = 0;      // used by kRandom only
  // DP replicas: DP/P pools share each GA step. Only kVrspElastic uses it
  // (0 means dp = P: one pool per GA step, so nothing can fuse).
  std::int64_t dp = 0;
  ElasticOptions elastic{};    // used by kVrspElastic only
  // Opt-in: every pool's slots in node_interleaved_slots order (not with
  // kVrspElastic, whose domains fix their slots). Off, the slot order is
  // the mode's own (for kVrsp the planning contract's, section 3).
  NodeInterleave interleave{};
};

struct WindowPlacement {
  // pools[k][slot] = index of the sequence within the window (0 .. D-1).
  std::vector<std::vector<std::int32_t>> pools;
  std::vector<std::int64_t> loads;  // per pool, the sum of F (exact)
  // Worst domain's load per worker over the window's mean load per worker,
  // minus 1: max_d (load_d / |d|) / mean_k load_k - 1. With every domain a
  // single pool (every mode but kVrspElastic) this is R - 1,
  // R = max_k load / mean_k load.
  double imbalance = 0;
  // TAP domains: each a list of pool indices (increasing) that run as one
  // pool of |d|*P slots; slot s of the domain is slot s % P of pool
  // d[s / P]. All pools of a domain share a GA index. Unfused pools are
  // domains of one; domains are ordered by their first pool.
  std::vector<std::vector<std::int32_t>> domains;
  double pool_imbalance = 0;  // R - 1 over pools, ignoring the domains
};

// The window indices of domain `d` in its slot order (what make_plan takes
// as a pool of |d|*P sequences: a fused domain has its own worker numbering
// r = s*CP + c over its slots s).
std::vector<std::int32_t> domain_slots(const WindowPlacement& placement, std::size_t d);

// max_d (sum of loads of d / |d|) / mean load - 1 from exact integer loads;
// equals imbalance_of_loads(loads) when every domain is a single pool.
double domain_imbalance(std::span<const std::int64_t> loads, const std::vector<std::vector<std::int32_t>>& domains);

// Places one window. workloads[i] = F_i of sequence i of the window
// (D = workloads.size()). Errors: P < 1, D = 0, D not divisible by P,
// a negative workload, an all-zero window, a load sum that overflows int64,
// D beyond 2^31 - 1.
[[nodiscard]] Result<WindowPlacement> place_window(std::span<const std::int64_t> workloads,
                                                   const PlacementOptions& options);

// A lower bound on R over every placement into pools of exactly P (>= 1).
// It is at least max(1, (F_max + sum of the P-1 smallest F) / mean load), and
// also uses the pigeonhole bound: some pool holds j+1 of the j*K+1 heaviest
// sequences, for every j < P. Returns 1 for invalid inputs (no bound known).
double imbalance_lower_bound(std::span<const std::int64_t> workloads, std::int64_t pool_size);
// The same bound as R - 1, computed like WindowPlacement::imbalance, so a
// placement that reaches the bound compares equal to it bit for bit.
double lower_bound_imbalance(std::span<const std::int64_t> workloads, std::int64_t pool_size);

// Paper eq. 4: E[R] ~ 1 + CV / sqrt(P) * sqrt(2 ln K), K = number of pools.
// Returns R (not R - 1). K = 1 gives 1.
double lln_prediction(double cv, std::int64_t pool_size, std::int64_t num_pools);

// R - 1 of given pool loads (exact numerator; 0 when all loads are 0).
double imbalance_of_loads(std::span<const std::int64_t> loads);

// Layout of one window over DP replicas and GA indices (contract section 3):
// DP/P pools per GA index, GA = D/DP indices; pool k runs at GA index
// k div (DP/P) on replicas (k mod (DP/P))*P + slot.
struct StepLayout {
  std::int64_t dp = 0;
  std::int64_t pool_size = 0;
  std::int64_t ga_steps = 0;       // D / DP
  std::int64_t pools_per_ga = 0;   // DP / P
  // S': order[g*DP + r] = window index of the sequence that replica r
  // processes at GA index g.
  std::vector<std::int32_t> order;
  std::vector<std::int64_t> pool_ga;           // per pool, its GA index
  std::vector<std::int64_t> pool_first_replica;  // per pool, the replica of slot 0
};

// Errors: dp < 1, P not dividing dp, dp not dividing D.
[[nodiscard]] Result<StepLayout> layout_window(const WindowPlacement& placement, std::int64_t dp);

// F_i of each packed sequence (paper eq. 1), with the index of the offending
// sequence in the error message when a length is invalid or F overflows.
[[nodiscard]] Result<std::vector<std::int64_t>> sequence_workloads(std::span<const PackedSequence> sequences);

}  // namespace libra
