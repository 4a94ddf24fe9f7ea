// libra/cost_model.hpp: the latency model behind `libra simulate`.
//
// Defines how the simulator turns planner output (FLOPs per tile, the W x W
// byte matrix of an exchange plan) into seconds:
//   - compute: real FLOPs over a kernel throughput that depends on the
//     per-call query-block length and the heads per call (paper figure 5:
//     short blocks lose efficiency fast, fewer heads cost little). The
//     throughput comes from a KernelProfile: either the analytic H200-class
//     default or a measured table (data/profiles/*.json), interpolated in
//     log2(block length) and log2(heads);
//   - communication: an all-to-all-v over a byte matrix, each worker's bytes
//     over its intra-node (NVLink) or inter-node (RoCE) link depending on
//     where the peer sits (GPUs numbered node-major), plus a latency per
//     message; a collective finishes when its slowest worker does;
//   - overlap: the TAP pipeliner schedule of paper section 6.3 with M chunks;
//   - device-runtime variance: a seeded per-(window, step, GPU) factor.
// Every constant is a named field with its source in docs/simulator.md.
//
//   libra::CostModel m;                                   // H200-class defaults
//   double s = libra::compute_seconds(m.kernel, 4.0 * 128 * pairs, 8192, 4);
//   std::vector<double> t = libra::alltoall_seconds(m.net, bytes, gpus);
//   double lat = libra::pipelined_seconds({d / 4, c / 4, r / 4}, 4);
#pragma once

#include "libra/splitmix64.hpp"  // splitmix64, the hash behind noise and seeds

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/status.hpp"

namespace libra {

// One measured (or modelled) kernel throughput point.
struct ThroughputEntry {
  std::int64_t block_len = 0;  // query tokens per call
  std::int64_t heads = 0;      // query heads per call
  double fwd_gflops = 0;
  double bwd_gflops = 0;
};

// Kernel throughput against (block length, heads per call). File format
// (written by the kernel stage's profiler):
//   {"version":1,"device":"...","threads":N,"head_dim":128,"dtype":"fp32",
//    "entries":[{"block_len":L,"heads":H,"fwd_gflops":x,"bwd_gflops":y},...]}
struct KernelProfile {
  std::string device;
  std::int64_t threads = 0;
  std::int64_t head_dim = 128;
  std::string dtype = "bf16";
  std::vector<ThroughputEntry> entries;
};

// The analytic figure-5 shape used for the default GPU profile:
//   gflops(L, h) = peak * L / (L + half_block_len) * h / (h + half_heads).
// Defaults: an H200 (989 dense bf16 TFLOP/s) running FlashAttention-3 reaches
// about 60% of peak forward and 45% backward on long blocks; throughput halves
// at 512-token blocks and loses ~20% at one head per call.
struct AnalyticKernel {
  double peak_fwd_tflops = 600;
  double peak_bwd_tflops = 450;
  double half_block_len = 512;
  double half_heads = 0.25;
};

// A grid over block lengths 64 .. 2^21 and heads 1 .. 128 (powers of two).
KernelProfile analytic_profile(const AnalyticKernel& kernel, std::string device = "h200-analytic");

// Parses / loads a profile. Errors name the file and the offending entry.
[[nodiscard]] Result<KernelProfile> parse_kernel_profile(std::string_view json, const std::string& name);
[[nodiscard]] Result<KernelProfile> load_kernel_profile(const std::string& path);
std::string kernel_profile_json(const KernelProfile& profile);

// Throughput in GFLOP/s at (block_len, heads). Piecewise linear in log2 of
// both axes between table points; beyond the largest block length or head
// count it stays flat; below the smallest it falls in proportion (a call with
// half the tokens of the shortest measured one is charged the time of that
// shortest one), which keeps short blocks conservative.
double profile_gflops(const KernelProfile& profile, double block_len, double heads, bool backward);

// The same lookup with the table sorted once, for the simulator's hot loop.
class ThroughputTable {
 public:
  explicit ThroughputTable(const KernelProfile& profile);
  double gflops(double block_len, double heads, bool backward) const;
  // Seconds for `flops` real FLOPs in calls of `block_len` tokens x `heads`.
  double seconds(double flops, double block_len, double heads, bool backward = false) const;

 private:
  struct Row {
    double heads;
    std::vector<double> len, fwd, bwd;
  };
  std::vector<Row> rows_;  // by increasing heads
};

// Seconds for `flops` real FLOPs in calls of `block_len` tokens x `heads`.
double compute_seconds(const KernelProfile& profile, double flops, double block_len, double heads,
                       bool backward = false);

// Interconnect: three tiers. GPUs are numbered node-major (node = gpu /
// gpus_per_node) and nodes supernode-major (supernode = node /
// nodes_per_supernode; a supernode is a rail group / leaf-switch domain).
// Bandwidths are per GPU and direction, in GB/s (1e9 bytes/s):
//   - intra_node_gbps: NVLink (H200 NVLink 4: 450 nominal, ~360 achieved);
//   - inter_node_gbps: the GPU's NIC (one 400 Gb/s RoCE NIC per GPU: ~45),
//     carrying all of the GPU's off-node traffic;
//   - inter_supernode_gbps: the GPU's share of its supernode's uplinks to the
//     spine (oversubscribed), carrying its cross-supernode traffic;
//   - congestion_per_node: an all-to-all spanning n >= 2 nodes gets
//     inter_node_gbps / (1 + congestion_per_node * (n - 2)) from each NIC
//     (two nodes exchange rail to rail at full speed; incast and ECMP
//     collisions on RoCE grow with every further node that talks).
// nodes_per_supernode, inter_supernode_gbps and congestion_per_node are
// fitted to the paper's figure-14 growth of communication time with P
// (docs/simulator.md, "Topology calibration"); they are not measured
// network figures.
struct Interconnect {
  std::int64_t gpus_per_node = 8;
  std::int64_t nodes_per_supernode = 4;
  double intra_node_gbps = 360;
  double inter_node_gbps = 45;
  double inter_supernode_gbps = 7.5;
  double congestion_per_node = 0.5;
  double latency_us = 10;
  // Which NIC carries a cross-node send. false: the sender's own (the
  // fitted model). true: NCCL's PXN on a rail-optimised fabric, where a send
  // to GPU j of another node first crosses NVLink to the sender's node-mate
  // on j's rail (the same local index as j) and leaves through that GPU's
  // NIC, so one GPU's off-node sends spread over its node's NICs by
  // destination. Only node-mates among the all-to-all's own workers relay
  // (NCCL relays through ranks of the communicator); a send whose rail has
  // none leaves through the sender's NIC.
  bool pxn = false;
};

// Each GPU's time to complete an all-to-all-v: bytes[src * W + dst] between
// the W workers, worker w sitting on GPU gpu_of_worker[w]. A worker's time is
// set by the busiest link its traffic crosses, each full duplex and all at
// once (NVLink and NIC in parallel):
//   t_w = max over {send, recv} of max(intra / B_intra,
//                                      (inter + cross) / B_nic(n),
//                                      cross / B_supernode)
// where B_nic(n) = B_inter / (1 + congestion_per_node max(0, n - 2)) and n is the
// number of distinct nodes among gpu_of_worker
//         + latency * max(messages sent, messages received),
// with intra = bytes to GPUs on the same node, inter = other nodes of the
// same supernode, cross = other supernodes. So a pool's all-to-all costs more
// as it spans more nodes (more bytes leave NVLink) and more supernodes (more
// bytes share the spine). The diagonal (bytes that stay) is ignored. With
// net.pxn, a relayed send's inter/cross bytes are the relay's sends and the
// sender's NVLink hop to the relay adds to both sides' intra bytes; messages
// are counted at the sender as without it.
std::vector<double> alltoall_seconds(const Interconnect& net, std::span<const std::int64_t> bytes,
                                     std::span<const std::int64_t> gpu_of_worker);

// Phase times of one step (already the slowest worker of each phase).
struct PhaseSeconds {
  double dispatch = 0;  // all-to-all of Q and KV to where tiles run
  double compute = 0;   // attention on the slowest worker
  double ret = 0;       // all-to-all of outputs back to their Q-homes
};

// Without overlap: dispatch, compute and return happen one after another.
double serial_seconds(const PhaseSeconds& step);

// The pipeliner of paper section 6.3 with M chunks; `chunk` holds the times
// of ONE chunk (1/M of compute and bytes, but the full per-message latency):
//   T = d + sum_{m=0}^{M-1} max(c, [m+1<M] d + [m>0] r) + r,
// so when compute covers transfer only the first dispatch and the last
// return are exposed: T = d + M c + r.
double pipelined_seconds(const PhaseSeconds& chunk, std::int64_t chunks);
// The same schedule with unequal chunks (chunks[m] = chunk m's times):
//   T = d_0 + sum_m max(c_m, d_{m+1} + r_{m-1}) + r_{M-1}.
double pipelined_seconds(std::span<const PhaseSeconds> chunks);

// Device-runtime variance: each GPU at each step runs at 1 + sigma * z with
// z a standard normal clipped to [-4, 4], drawn from a hash of (seed, window,
// step, gpu), so it does not depend on threads or evaluation order. The
// default sigma = 0.0132 makes the mean fastest-to-slowest spread over 256
// GPUs (fastest and slowest discarded) 7.0%, the paper's 7.01%.
struct DeviceNoise {
  double sigma = 0.0132;
  std::uint64_t seed = 1;
};
double noise_factor(const DeviceNoise& noise, std::uint64_t window, std::uint64_t step, std::uint64_t gpu);

// The model parts outside core attention for the end-to-end step.
struct ModelShape {
  std::string name = "qwen3-30b-a3b";
  std::int64_t heads_q = 32;
  std::int64_t heads_kv = 4;
  std::int64_t head_dim = 128;
  std::int64_t elem_bytes = 2;          // bf16
  std::int64_t layers = 48;
  double active_params = 3.3e9;         // per token (A3B)
  double grad_bytes_per_gpu = 7.6e9;    // 30.5B params x 2 bytes / EP 8
};

struct StepModel {
  double linear_tflops = 400;  // achieved by the MoE/linear part per GPU
};

// Linear part: 6 FLOPs per active parameter per token (2 forward, 4
// backward), spread over the `gpus` GPUs that share the tokens.
double linear_seconds(const StepModel& step, const ModelShape& model, double tokens, double gpus, bool backward);

// Ring all-reduce of the gradients over `dp` replicas on the inter-node link:
// 2 (dp-1)/dp * bytes / B_inter + 2 (dp-1) latency; 0 for dp = 1.
double allreduce_seconds(const Interconnect& net, double bytes, std::int64_t dp);

// Everything the simulator charges with.
struct CostModel {
  AnalyticKernel analytic;  // what `kernel` was generated from, unless a measured profile replaced it
  KernelProfile kernel = analytic_profile(AnalyticKernel{});
  Interconnect net;
  DeviceNoise noise;
  StepModel step;
};

// Checks the model's constants; the message names the flag, e.g.
// "--inter-node-gbps 0: bandwidth must be positive".
[[nodiscard]] Status validate_cost_model(const CostModel& model);

}  // namespace libra
