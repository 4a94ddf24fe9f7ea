// The host's vector-FMA peak as the benchmarks print it in their context
// (fma_peak_*_tN): the best of `probes` probes of 0.05 s each of
// libra::kernel::measure_fma_peak, by wall clock and by thread CPU time.
// Contention only lowers a reading, and on a shared VM the core clock itself
// wanders (2.5-3.7 GHz measured from FMA latency within seconds), so a few
// long probes can all land in a slow phase.
//
//   const libra::kernel::FmaPeak p = libra_bench::best_fma_peak(1);  // ~1 s
#pragma once

#include <algorithm>

#include "libra/kernel.hpp"

namespace libra_bench {

inline libra::kernel::FmaPeak best_fma_peak(int threads, int probes = 20) {
  libra::kernel::FmaPeak best;
  for (int i = 0; i < probes; ++i) {
    const libra::kernel::FmaPeak r = libra::kernel::measure_fma_peak(threads, 0.05);
    best.wall_gflops = std::max(best.wall_gflops, r.wall_gflops);
    best.cpu_gflops = std::max(best.cpu_gflops, r.cpu_gflops);
  }
  return best;
}

}  // namespace libra_bench
