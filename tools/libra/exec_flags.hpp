// The flags `libra exec` and `libra bench exec` share (a pool and its
// shape, kernel threads, relays), the pool they load and the configuration
// they make of them (cmd_exec.cpp, cmd_bench_exec.cpp).
//
//   PoolFlags pool;
//   add_pool_flags(sub, pool, /*bench=*/false);
//   Result<PlanConfig> cfg = make_config(pool, "tap");
//   double scale = 1.0;
//   Result<std::vector<PackedSequence>> all = load_scaled(pool.source, cfg->seq_len, &scale);
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "libra/plan.hpp"
#include "libra/status.hpp"
#include "plan_flags.hpp"

namespace libra::cli {

// The flags that choose a pool and its shape, shared by `exec` and `bench exec`.
struct PoolFlags {
  std::string source = "builtin:paper-1m";
  PlanFlags flags;
  int pool_size = 0;     // 0: ranks / cp (exec), 4 (bench)
  std::int64_t pool_index = 0;
  int threads = 1;
  bool relay = false;  // ExecOptions::relay
};

// Bounds that keep a typo from becoming a run that never ends.
inline constexpr int kMaxRepeat = 100000;
inline constexpr int kMaxThreads = 1024;  // the kernel's own limit

// The pool flags on `sub`; returns those a saved plan fixes (source,
// --pool-size, --pool-index). `bench`: the defaults of `bench exec`.
std::vector<const CLI::Option*> add_pool_flags(CLI::App* sub, PoolFlags& o, bool bench);

// Packed sequences of the source at --seq-len. A built-in corpus made for
// another packed length is packed at its own length and every sample length
// scaled by seq_len / default (at least 1, `scale` receives the factor), so
// its long-tail shape is kept at a CPU-sized length.
Result<std::vector<PackedSequence>> load_scaled(const std::string& source, std::int64_t seq_len, double* scale);

// --threads in [1, kMaxThreads].
Status check_threads(int threads);

// The configuration of the flags for one executor mode (tap, tap-split,
// tap-topo, ulysses: the baseline executor, ulysses-plan).
Result<PlanConfig> make_config(const PoolFlags& o, const std::string& mode);

}  // namespace libra::cli
