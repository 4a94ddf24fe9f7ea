// `libra bench kernel`: measures the attention kernel's throughput profile
// (GFLOP/s against per-call block length and heads per call, forward and
// backward) and optionally writes it as the JSON table the simulator's cost
// model loads (format: docs/kernel.md).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "plan_flags.hpp"
#include "libra/io.hpp"
#include "libra/kernel.hpp"

namespace libra::cli {
namespace {

struct KernelBenchOptions {
  int threads = 1;
  std::string profile_out;
  std::vector<std::int64_t> lengths = {128, 256, 512, 1024, 2048, 4096, 8192};
  std::vector<std::int64_t> heads = {1, 2, 4, 8};
  std::int64_t head_dim = 128;
  std::string dtype = "fp32";
  double min_seconds = 0.05;
  int repetitions = 3;
  std::string clock = "wall";
  std::string target = "auto";
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string m = line.substr(colon + 1);
        m.erase(0, m.find_first_not_of(' '));
        return m;
      }
    }
  }
  return "unknown CPU";
}

// Every flag checked by name before the FMA probe and the timings start.
Status check_flags(const KernelBenchOptions& o) {
  if (o.repetitions < 1) return invalid_input(fmt::format("--repetitions {}: must be at least 1", o.repetitions));
  if (!(o.min_seconds >= 0) || o.min_seconds > 60) {
    return invalid_input(fmt::format("--min-seconds {}: must be in [0, 60]", o.min_seconds));
  }
  if (o.head_dim < 1 || o.head_dim > 1024) return invalid_input(fmt::format("--head-dim {}: must be in [1, 1024]", o.head_dim));
  for (std::int64_t l : o.lengths) {
    if (l < 1 || l > 1048576) return invalid_input(fmt::format("--lengths {}: every length must be in [1, 1048576]", l));
  }
  for (std::int64_t h : o.heads) {
    if (h < 1 || h > 256) return invalid_input(fmt::format("--heads {}: every head count must be in [1, 256]", h));
  }
  if (o.clock == "cpu" && o.threads != 1) {
    return invalid_input(fmt::format("--clock cpu: measures the calling thread only; use --threads 1 (not {}) or --clock wall", o.threads));
  }
  return {};
}

int run_kernel_bench(const KernelBenchOptions& o) {
  if (Status s = check_flags(o); !s.ok()) return fail(s);
  kernel::ProfileOptions p;
  p.block_lens = o.lengths;
  p.heads = o.heads;
  p.head_dim = o.head_dim;
  p.threads = o.threads;
  p.min_seconds = o.min_seconds;
  p.repetitions = o.repetitions;
  auto dtype = dtype_flag(o.dtype);
  if (!dtype.ok()) return fail(dtype.error());
  p.dtype = *dtype;
  if (Status s = kernel::set_simd_target(o.target); !s.ok()) {
    return fail(invalid_input("--target " + o.target + ": " + s.message()));
  }
  if (o.clock != "wall" && o.clock != "cpu") return fail(invalid_input("--clock " + o.clock + ": must be wall or cpu"));
  p.thread_cpu_clock = o.clock == "cpu";
  if (o.threads < 1 || o.threads > 1024) {
    return fail(invalid_input("--threads " + std::to_string(o.threads) + ": must be in [1, 1024]"));
  }
  // The best of 5 short probes (contention only lowers a reading), by the
  // same clock as the timings.
  double peak = 0;
  for (int i = 0; i < 5; ++i) {
    const kernel::FmaPeak r = kernel::measure_fma_peak(o.threads, 0.05);
    peak = std::max(peak, o.clock == "cpu" ? r.cpu_gflops : r.wall_gflops);
  }
  auto entries = kernel::measure_profile(p);
  if (!entries.ok()) return fail(entries.error());
  const std::string device = cpu_model() + " (" + kernel::simd_target() + ")";
  std::cout << fmt::format("device {}, {} thread(s), head_dim {}, {}, {} clock, fp32 FMA peak {:.1f} GFLOP/s\n",
                           device, o.threads, o.head_dim, o.dtype, o.clock, peak);
  std::cout << fmt::format("{:>9} {:>5} {:>11} {:>9} {:>11} {:>9}\n", "block_len", "heads", "fwd_GFLOP/s", "fwd_peak",
                           "bwd_GFLOP/s", "bwd_peak");
  for (const auto& e : *entries) {
    std::cout << fmt::format("{:>9} {:>5} {:>11.1f} {:>9.3f} {:>11.1f} {:>9.3f}\n", e.block_len, e.heads, e.fwd_gflops,
                             e.fwd_gflops / peak, e.bwd_gflops, e.bwd_gflops / peak);
  }
  if (!o.profile_out.empty()) {
    nlohmann::ordered_json j;
    j["version"] = 1;
    j["device"] = device;
    j["threads"] = o.threads;
    j["head_dim"] = o.head_dim;
    j["dtype"] = o.dtype;
    j["fma_peak_gflops"] = peak;
    j["clock"] = o.clock == "cpu" ? "thread_cpu" : "wall";
    j["entries"] = nlohmann::ordered_json::array();
    for (const auto& e : *entries) {
      j["entries"].push_back(
          {{"block_len", e.block_len}, {"heads", e.heads}, {"fwd_gflops", e.fwd_gflops}, {"bwd_gflops", e.bwd_gflops}});
    }
    if (Status s = write_file_atomic(o.profile_out, j.dump(2) + "\n"); !s.ok()) return fail(s);
  }
  return kExitOk;
}

const bool registered = register_command(80, [](CLI::App& app) {
  CLI::App* bench = command_group(app, "bench", "Measure kernels and executors on this machine");
  auto* sub = bench->add_subcommand("kernel", "Measure the attention kernel's throughput profile");
  auto o = std::make_shared<KernelBenchOptions>();
  sub->add_option("--threads", o->threads, "Threads per kernel call (the executor uses 1)");
  sub->add_option("--profile-out", o->profile_out, "Write the profile as JSON to this file");
  sub->add_option("--lengths", o->lengths, "Per-call block lengths (tokens)")->delimiter(',');
  sub->add_option("--heads", o->heads, "Heads per call")->delimiter(',');
  sub->add_option("--head-dim", o->head_dim, "Head dimension");
  sub->add_option("--dtype", o->dtype, "fp32, bf16 or fp16 (storage; accumulation is fp32)");
  sub->add_option("--target", o->target, "SIMD target: auto, avx512, avx2 or scalar");
  sub->add_option("--min-seconds", o->min_seconds, "Minimum seconds per timing");
  sub->add_option("--repetitions", o->repetitions, "Timings per entry (median kept)");
  sub->add_option("--clock", o->clock, "wall, or cpu (the calling thread's CPU time; --threads 1 only)");
  return std::vector<Handler>{Handler{sub, [o] { return run_kernel_bench(*o); }}};
});

}  // namespace
}  // namespace libra::cli
