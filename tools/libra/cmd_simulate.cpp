// `libra simulate`: the configuration simulator (paper sections 7 and 8).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "libra/cost_model.hpp"
#include "libra/elastic_sim.hpp"
#include "libra/io.hpp"
#include "libra/simulator.hpp"

namespace libra::cli {

// cmd_simulate_elastic.cpp
int run_simulate_elastic(SimConfig cfg, bool pool_given, bool shards_given, bool blocks_given,
                         ElasticOptions elastic, const std::string& rule, bool json, const std::string& output);

namespace {

struct SimulateOptions {
  std::optional<std::string> source;
  std::optional<std::string> config;
  std::optional<std::int64_t> seq_len, gbs, dp, cp, heads_q, heads_kv, head_dim, layers, chunks, windows, threads,
      gpus_per_node;
  std::optional<std::string> model, dtype, kernel_profile;
  std::vector<std::int64_t> pool_sizes, head_shards, block_sizes, scaling_dp;
  std::optional<double> tau, intra, inter, latency, noise_sigma, linear_tflops, active_params, grad_bytes;
  std::optional<double> peak_fwd, peak_bwd, half_block, half_heads;
  std::optional<std::uint64_t> seed, noise_seed;
  bool no_end_to_end = false;
  bool json = false, csv = false, timing = false;
  std::optional<std::string> report;
  std::string output = "-";
  bool elastic = false;  // --elastic: vrsp-elastic against vrsp (cmd_simulate_elastic.cpp)
  ElasticOptions elastic_options;
  std::string elastic_rule = "buddy";
};

template <class T>
void set_if(const std::optional<T>& v, T& dst) {
  if (v) dst = *v;
}

int run_simulate(const SimulateOptions& o) {
  SimConfig cfg;
  if (o.config) {
    auto text = read_file(*o.config);
    if (!text.ok()) return fail(text.error());
    Status s = apply_sim_config_json(*text, *o.config, cfg);
    if (!s.ok()) return fail(s);
  }
  set_if(o.source, cfg.source);
  if (o.model) {
    auto m = model_preset(*o.model);
    if (!m.ok()) return fail(m.error());
    cfg.model = *m;
  }
  set_if(o.seq_len, cfg.seq_len);
  set_if(o.gbs, cfg.gbs);
  set_if(o.dp, cfg.dp);
  set_if(o.cp, cfg.cp);
  set_if(o.heads_q, cfg.model.heads_q);
  set_if(o.heads_kv, cfg.model.heads_kv);
  set_if(o.head_dim, cfg.model.head_dim);
  set_if(o.layers, cfg.model.layers);
  set_if(o.active_params, cfg.model.active_params);
  set_if(o.grad_bytes, cfg.model.grad_bytes_per_gpu);
  if (o.dtype) {
    if (*o.dtype == "bf16" || *o.dtype == "fp16") cfg.model.elem_bytes = 2;
    else if (*o.dtype == "fp32") cfg.model.elem_bytes = 4;
    else return fail(invalid_input("--dtype " + *o.dtype + ": must be bf16, fp16 or fp32"));
  }
  if (!o.pool_sizes.empty()) cfg.pool_sizes = o.pool_sizes;
  if (!o.head_shards.empty()) cfg.head_shards = o.head_shards;
  if (!o.block_sizes.empty()) cfg.block_sizes = o.block_sizes;
  if (!o.scaling_dp.empty()) cfg.scaling_dp = o.scaling_dp;
  set_if(o.chunks, cfg.chunks);
  set_if(o.tau, cfg.tau);
  set_if(o.windows, cfg.max_windows);
  set_if(o.threads, cfg.threads);
  set_if(o.seed, cfg.seed);
  set_if(o.gpus_per_node, cfg.cost.net.gpus_per_node);
  set_if(o.intra, cfg.cost.net.intra_node_gbps);
  set_if(o.inter, cfg.cost.net.inter_node_gbps);
  set_if(o.latency, cfg.cost.net.latency_us);
  set_if(o.noise_sigma, cfg.cost.noise.sigma);
  set_if(o.noise_seed, cfg.cost.noise.seed);
  set_if(o.linear_tflops, cfg.cost.step.linear_tflops);
  if (o.no_end_to_end) cfg.end_to_end = false;
  if (o.kernel_profile) {
    auto p = load_kernel_profile(*o.kernel_profile);
    if (!p.ok()) return fail(p.error());
    cfg.cost.kernel = *p;
  } else if (o.peak_fwd || o.peak_bwd || o.half_block || o.half_heads) {
    AnalyticKernel k;
    set_if(o.peak_fwd, k.peak_fwd_tflops);
    set_if(o.peak_bwd, k.peak_bwd_tflops);
    set_if(o.half_block, k.half_block_len);
    set_if(o.half_heads, k.half_heads);
    for (auto [flag, v] : {std::pair{"--peak-fwd-tflops", k.peak_fwd_tflops}, {"--peak-bwd-tflops", k.peak_bwd_tflops},
                           {"--half-block-len", k.half_block_len}, {"--half-heads", k.half_heads}}) {
      if (!(v > 0)) return fail(invalid_input(fmt::format("{} {}: must be positive", flag, v)));
    }
    cfg.cost.kernel = analytic_profile(k);
  }

  if (o.elastic) {
    if (!o.windows) cfg.max_windows = 0;  // every window unless --windows says otherwise
    return run_simulate_elastic(cfg, !o.pool_sizes.empty(), !o.head_shards.empty(), !o.block_sizes.empty(),
                                o.elastic_options, o.elastic_rule, o.json, o.output);
  }
  SimProgress progress;
  const bool bar = stderr_is_terminal();
  if (bar) {
    progress = [](std::int64_t done, std::int64_t total) {
      const int width = 40;
      const auto filled = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
      std::cerr << "\r[" << std::string(static_cast<std::size_t>(filled), '#')
                << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << done << "/" << total
                << " windows" << std::flush;
    };
  }
  auto r = simulate(cfg, progress);
  if (bar) std::cerr << "\r" << std::string(60, ' ') << "\r" << std::flush;
  if (!r.ok()) return fail(r.error());

  std::string out = o.json ? sim_json(*r) : o.csv ? sim_csv(*r) : sim_table(*r);
  if (o.report) {
    Status s = write_sim_report(*r, *o.report);
    if (!s.ok()) return fail(s);
    if (!o.json && !o.csv) out += "\nReport written to " + *o.report + "/index.md\n";
  }
  if (o.timing) {
    const auto& t = r->timing;
    std::cerr << fmt::format(
        "timing: total {:.2f} s wall; load {:.2f} s; CPU time summed over threads: placement {:.2f} s, "
        "make_plan {:.2f} s ({} plans), cost model {:.2f} s; end-to-end phase {:.2f} s wall\n",
        t.total_s, t.load_s, t.placement_s, t.plan_s, t.plans, t.cost_s, t.end_to_end_s);
    for (const auto& [kind, v] : t.by_kind) {
      std::cerr << fmt::format("  make_plan for {:<20} {:8.2f} s {:7d} plans {:8.2f} ms/plan\n", kind, v.first,
                               v.second, 1e3 * v.first / static_cast<double>(std::max<std::int64_t>(v.second, 1)));
    }
  }
  Status s = write_file_atomic(o.output, out);
  if (!s.ok()) return fail(s);
  return kExitOk;
}

const bool registered = register_command(50, [](CLI::App& app) {
  auto* sub = app.add_subcommand(
      "simulate", "Replay a corpus through the planners for candidate (P, H, B) and predict step latency");
  auto o = std::make_shared<SimulateOptions>();
  sub->add_option("source", o->source, "corpus: file or builtin:NAME (default builtin:paper-1m)");
  sub->add_option("--config", o->config, "JSON config file (keys as the flags, '_' for '-'); flags override it");
  sub->add_option("--seq-len", o->seq_len, "packed length L (default: the corpus' own)");
  sub->add_option("--gbs", o->gbs, "global batch size D (default 128)");
  sub->add_option("--dp", o->dp, "data-parallel replicas (default 16)");
  sub->add_option("--cp", o->cp, "context-parallel workers per replica (default 8)");
  sub->add_option("--model", o->model, "attention preset: qwen3-30b-a3b (default)");
  sub->add_option("--heads-q", o->heads_q, "query heads h_q");
  sub->add_option("--heads-kv", o->heads_kv, "KV heads h_kv");
  sub->add_option("--head-dim", o->head_dim, "head dimension d");
  sub->add_option("--dtype", o->dtype, "bf16 (default) or fp32");
  sub->add_option("--layers", o->layers, "transformer layers (end-to-end model, default 48)");
  sub->add_option("--active-params", o->active_params, "active parameters per token (default 3.3e9)");
  sub->add_option("--grad-bytes-per-gpu", o->grad_bytes, "gradient bytes all-reduced per GPU (default 7.6e9)");
  sub->add_option("--pool-size", o->pool_sizes, "candidate pool sizes P (default 2,4,8,16)")->delimiter(',');
  sub->add_option("--head-shards", o->head_shards, "candidate head shards H (default 4,8)")->delimiter(',');
  sub->add_option("--block-size", o->block_sizes, "candidate block sizes B (default 8192,16384,32768)")->delimiter(',');
  sub->add_option("--chunks", o->chunks, "pipeliner chunks M (default 4)");
  sub->add_option("--tau", o->tau, "TAP load slack (default 0.03)");
  sub->add_option("--windows", o->windows, "windows to simulate, 0 = all (default 20)");
  sub->add_option("--threads", o->threads, "worker threads, 0 = all cores (default)");
  sub->add_option("--seed", o->seed, "seed of the random placement baseline");
  sub->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node (default 8)");
  sub->add_option("--intra-node-gbps", o->intra, "intra-node bandwidth per GPU, GB/s (default 360)");
  sub->add_option("--inter-node-gbps", o->inter, "inter-node bandwidth per GPU, GB/s (default 45)");
  sub->add_option("--latency-us", o->latency, "per-message latency, microseconds (default 10)");
  sub->add_option("--noise-sigma", o->noise_sigma, "per-GPU runtime noise sigma, 0 = off (default 0.0132)");
  sub->add_option("--noise-seed", o->noise_seed, "seed of the device noise (default 1)");
  sub->add_option("--kernel-profile", o->kernel_profile, "measured throughput profile JSON (default: H200 analytic)");
  sub->add_option("--peak-fwd-tflops", o->peak_fwd, "analytic kernel: forward peak (default 600)");
  sub->add_option("--peak-bwd-tflops", o->peak_bwd, "analytic kernel: backward peak (default 450)");
  sub->add_option("--half-block-len", o->half_block, "analytic kernel: block length at half rate (default 512)");
  sub->add_option("--half-heads", o->half_heads, "analytic kernel: head-count constant (default 0.25)");
  sub->add_option("--linear-tflops", o->linear_tflops, "achieved TFLOP/s of the linear part (default 400)");
  sub->add_option("--scaling-dp", o->scaling_dp, "DP values of the end-to-end sweep (default 1,2,4,8,16)")
      ->delimiter(',');
  sub->add_flag("--no-end-to-end", o->no_end_to_end, "skip the DP sweep and microbatch model");
  sub->add_flag("--json", o->json, "JSON output");
  sub->add_flag("--csv", o->csv, "CSV output, one row per candidate");
  sub->add_option("--report", o->report, "write plots, data and index.md into this directory");
  sub->add_flag("--timing", o->timing, "print where the time went on stderr");
  sub->add_option("-o,--output", o->output, "output file (default stdout)");
  sub->add_flag("--elastic", o->elastic,
                "elastic pools: vrsp-elastic against vrsp for one (P, H, B) (default 8, 8, 16384), every window");
  sub->add_option("--elastic-k", o->elastic_options.max_pools, "with --elastic: at most k pools per domain (default 2)");
  sub->add_option("--elastic-threshold", o->elastic_options.threshold,
                  "with --elastic: fuse above this excess over the mean pool load (default 0.05)");
  sub->add_option("--elastic-rule", o->elastic_rule, "with --elastic: buddy (default) or lightest");
  return std::vector<Handler>{{sub, [o] { return run_simulate(*o); }}};
});

}  // namespace
}  // namespace libra::cli
