#include "libra/cost_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "libra/io.hpp"
#include "sim/alltoall.hpp"

namespace libra {

KernelProfile analytic_profile(const AnalyticKernel& kernel, std::string device) {
  KernelProfile p;
  p.device = std::move(device);
  p.head_dim = 128;
  p.dtype = "bf16";
  for (std::int64_t len = 64; len <= (std::int64_t{1} << 21); len *= 2) {
    for (std::int64_t h = 1; h <= 128; h *= 2) {
      const double lf = static_cast<double>(len) / (static_cast<double>(len) + kernel.half_block_len);
      const double hf = static_cast<double>(h) / (static_cast<double>(h) + kernel.half_heads);
      p.entries.push_back({len, h, kernel.peak_fwd_tflops * 1e3 * lf * hf, kernel.peak_bwd_tflops * 1e3 * lf * hf});
    }
  }
  return p;
}

Result<KernelProfile> parse_kernel_profile(std::string_view text, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_input(name + ": not a JSON object (kernel profile)");
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<std::int64_t>() != 1) {
    return invalid_input(name + ": kernel profile \"version\" must be 1");
  }
  KernelProfile p;
  if (j.contains("device") && j["device"].is_string()) p.device = j["device"].get<std::string>();
  if (j.contains("dtype") && j["dtype"].is_string()) p.dtype = j["dtype"].get<std::string>();
  if (j.contains("threads") && j["threads"].is_number_integer()) p.threads = j["threads"].get<std::int64_t>();
  if (j.contains("head_dim")) {
    if (!j["head_dim"].is_number_integer() || j["head_dim"].get<std::int64_t>() < 1) {
      return invalid_input(name + ": \"head_dim\" must be a positive integer");
    }
    p.head_dim = j["head_dim"].get<std::int64_t>();
  }
  if (!j.contains("entries") || !j["entries"].is_array() || j["entries"].empty()) {
    return invalid_input(name + ": kernel profile needs a non-empty \"entries\" array");
  }
  std::size_t i = 0;
  for (const auto& e : j["entries"]) {
    auto bad = [&](const char* rule) { return invalid_input(fmt::format("{}: entries[{}]: {}", name, i, rule)); };
    if (!e.is_object()) return bad("must be an object");
    for (const char* key : {"block_len", "heads"}) {
      if (!e.contains(key) || !e[key].is_number_integer() || e[key].get<std::int64_t>() < 1) {
        return bad("\"block_len\" and \"heads\" must be positive integers");
      }
    }
    for (const char* key : {"fwd_gflops", "bwd_gflops"}) {
      if (!e.contains(key) || !e[key].is_number() || !(e[key].get<double>() > 0) ||
          !std::isfinite(e[key].get<double>())) {
        return bad("\"fwd_gflops\" and \"bwd_gflops\" must be positive numbers");
      }
    }
    p.entries.push_back({e["block_len"].get<std::int64_t>(), e["heads"].get<std::int64_t>(),
                         e["fwd_gflops"].get<double>(), e["bwd_gflops"].get<double>()});
    ++i;
  }
  return p;
}

Result<KernelProfile> load_kernel_profile(const std::string& path) {
  LIBRA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_kernel_profile(text, path);
}

std::string kernel_profile_json(const KernelProfile& profile) {
  nlohmann::ordered_json j;
  j["version"] = 1;
  j["device"] = profile.device;
  j["threads"] = profile.threads;
  j["head_dim"] = profile.head_dim;
  j["dtype"] = profile.dtype;
  j["entries"] = nlohmann::ordered_json::array();
  for (const auto& e : profile.entries) {
    j["entries"].push_back(
        {{"block_len", e.block_len}, {"heads", e.heads}, {"fwd_gflops", e.fwd_gflops}, {"bwd_gflops", e.bwd_gflops}});
  }
  return j.dump(1) + "\n";
}

namespace {

// Linear interpolation in log2(x) over sorted xs; flat above the last point,
// proportional below the first.
double interp_log(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
  if (x <= xs.front()) return ys.front() * x / xs.front();
  if (x >= xs.back()) return ys.back();
  const std::size_t i = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
  const double t = (std::log2(x) - std::log2(xs[i - 1])) / (std::log2(xs[i]) - std::log2(xs[i - 1]));
  return ys[i - 1] + t * (ys[i] - ys[i - 1]);
}

}  // namespace

ThroughputTable::ThroughputTable(const KernelProfile& profile) {
  // std::map keeps rows and points ordered, hence deterministic.
  std::map<std::int64_t, std::map<std::int64_t, const ThroughputEntry*>> grid;
  for (const auto& e : profile.entries) grid[e.heads][e.block_len] = &e;
  for (const auto& [h, pts] : grid) {
    Row row{static_cast<double>(h), {}, {}, {}};
    for (const auto& [len, e] : pts) {
      row.len.push_back(static_cast<double>(len));
      row.fwd.push_back(e->fwd_gflops);
      row.bwd.push_back(e->bwd_gflops);
    }
    rows_.push_back(std::move(row));
  }
}

double ThroughputTable::gflops(double block_len, double heads, bool backward) const {
  if (rows_.empty() || block_len <= 0 || heads <= 0) return 0;
  // interp_log over the rows' rates at block_len, which reads at most the
  // two rows around `heads`: only those are interpolated (the pricing asks
  // for every tile shape of every plan).
  auto at = [&](std::size_t r) { return interp_log(rows_[r].len, backward ? rows_[r].bwd : rows_[r].fwd, block_len); };
  if (heads <= rows_.front().heads) return at(0) * heads / rows_.front().heads;
  if (heads >= rows_.back().heads) return at(rows_.size() - 1);
  const auto i = static_cast<std::size_t>(
      std::upper_bound(rows_.begin(), rows_.end(), heads, [](double h, const Row& r) { return h < r.heads; }) -
      rows_.begin());
  const double h0 = rows_[i - 1].heads, h1 = rows_[i].heads;
  const double t = (std::log2(heads) - std::log2(h0)) / (std::log2(h1) - std::log2(h0));
  const double g0 = at(i - 1);
  return g0 + t * (at(i) - g0);
}

double ThroughputTable::seconds(double flops, double block_len, double heads, bool backward) const {
  if (flops <= 0) return 0;
  return flops / (gflops(block_len, heads, backward) * 1e9);
}

double profile_gflops(const KernelProfile& profile, double block_len, double heads, bool backward) {
  return ThroughputTable(profile).gflops(block_len, heads, backward);
}

double compute_seconds(const KernelProfile& profile, double flops, double block_len, double heads, bool backward) {
  return ThroughputTable(profile).seconds(flops, block_len, heads, backward);
}

namespace detail {

AlltoallPricer::AlltoallPricer(const Interconnect& net, std::span<const std::int64_t> gpu_of_worker)
    : w_(gpu_of_worker.size()), node_(w_), supernode_(w_), sent_b_(w_), recv_b_(w_), sent_(w_), received_(w_) {
  const std::size_t w = w_;
  const std::int64_t per_sn = net.gpus_per_node * net.nodes_per_supernode;
  for (std::size_t r = 0; r < w; ++r) {
    node_[r] = gpu_of_worker[r] / net.gpus_per_node;
    supernode_[r] = gpu_of_worker[r] / per_sn;
  }
  if (net.pxn) {
    // PXN relays: the worker on each GPU, by GPU id.
    std::vector<std::pair<std::int64_t, std::size_t>> worker_at;
    for (std::size_t r = 0; r < w; ++r) worker_at.emplace_back(gpu_of_worker[r], r);
    std::sort(worker_at.begin(), worker_at.end());
    auto relay_of = [&](std::size_t s, std::int64_t gs, std::int64_t gd) {
      const std::int64_t gpu = gs - gs % net.gpus_per_node + gd % net.gpus_per_node;
      auto it = std::lower_bound(worker_at.begin(), worker_at.end(), std::pair<std::int64_t, std::size_t>{gpu, 0});
      return it != worker_at.end() && it->first == gpu ? it->second : s;
    };
    via_.resize(w * w);
    for (std::size_t s = 0; s < w; ++s) {
      for (std::size_t d = 0; d < w; ++d) {
        via_[s * w + d] = static_cast<std::uint32_t>(
            node_[s] != node_[d] ? relay_of(s, gpu_of_worker[s], gpu_of_worker[d]) : s);
      }
    }
  }
  std::vector<std::int64_t> nodes = node_;
  std::sort(nodes.begin(), nodes.end());
  const auto spanned = static_cast<double>(std::unique(nodes.begin(), nodes.end()) - nodes.begin());
  bi_ = net.intra_node_gbps * 1e9;
  // Two nodes exchange rail to rail at the NIC's speed; every further node
  // adds incast and ECMP collisions.
  be_ = net.inter_node_gbps * 1e9 / (1.0 + net.congestion_per_node * std::max(0.0, spanned - 2));
  bs_ = net.inter_supernode_gbps * 1e9;
  latency_us_ = net.latency_us;
}

// One message of b > 0 bytes from worker s to d (s != d); [worker][tier]:
// bytes sent / received over tier 0 intra-node, 1 same supernode, 2 across
// supernodes.
inline void AlltoallPricer::add(std::size_t s, std::size_t d, std::size_t via, std::size_t tier, std::int64_t b) {
  if (via != s) {
    sent_b_[s][0] += static_cast<double>(b);
    recv_b_[via][0] += static_cast<double>(b);
  }
  sent_b_[via][tier] += static_cast<double>(b);
  recv_b_[d][tier] += static_cast<double>(b);
  ++sent_[s];
  ++received_[d];
}

inline void AlltoallPricer::add(std::size_t s, std::size_t d, std::int64_t b) {
  const std::size_t tier = node_[s] == node_[d] ? 0 : supernode_[s] == supernode_[d] ? 1 : 2;
  add(s, d, tier > 0 && !via_.empty() ? via_[s * w_ + d] : s, tier, b);
}

void AlltoallPricer::finish(std::vector<double>& t) {
  // Every t[r] is written below. The members are read through locals: a
  // store to t could alias them, so the loop would load them again.
  t.resize(w_);
  const double bi = bi_, be = be_, bs = bs_, per_message = latency_us_ * 1e-6;
  auto link = [&](const std::array<double, 3>& x) { return std::max({x[0] / bi, (x[1] + x[2]) / be, x[2] / bs}); };
  for (std::size_t r = 0; r < w_; ++r) {
    t[r] = std::max(link(sent_b_[r]), link(recv_b_[r])) +
           per_message * static_cast<double>(std::max(sent_[r], received_[r]));
  }
  std::fill(sent_b_.begin(), sent_b_.end(), std::array<double, 3>{0, 0, 0});
  std::fill(recv_b_.begin(), recv_b_.end(), std::array<double, 3>{0, 0, 0});
  std::fill(sent_.begin(), sent_.end(), 0);
  std::fill(received_.begin(), received_.end(), 0);
}

void AlltoallPricer::seconds(std::span<const std::int64_t> bytes, std::vector<double>& t) {
  const std::size_t w = w_;
  for (std::size_t s = 0; s < w; ++s) {
    const std::int64_t* row = bytes.data() + s * w;
    for (std::size_t d = 0; d < w; ++d) {
      if (row[d] != 0 && s != d) add(s, d, row[d]);
    }
  }
  finish(t);
}

AlltoallPricer::Pairs AlltoallPricer::pairs(std::span<const std::uint32_t> pairs) const {
  Pairs p;
  p.src.reserve(pairs.size());
  p.dst.reserve(pairs.size());
  p.via.reserve(pairs.size());
  p.tier.reserve(pairs.size());
  for (std::uint32_t i : pairs) {
    const std::size_t s = i / w_, d = i % w_;
    const std::size_t tier = node_[s] == node_[d] ? 0 : supernode_[s] == supernode_[d] ? 1 : 2;
    p.src.push_back(static_cast<std::uint32_t>(s));
    p.dst.push_back(static_cast<std::uint32_t>(d));
    p.via.push_back(static_cast<std::uint32_t>(tier > 0 && !via_.empty() ? via_[s * w_ + d] : s));
    p.tier.push_back(static_cast<std::uint8_t>(tier));
  }
  return p;
}

void AlltoallPricer::seconds(const Pairs& pairs, std::span<const std::int64_t> bytes, std::vector<double>& t) {
  // add() over raw pointers held in locals: through the members the
  // compiler reloads every array's address after each store.
  const std::uint32_t *src = pairs.src.data(), *dst = pairs.dst.data(), *via = pairs.via.data();
  const std::uint8_t* tier = pairs.tier.data();
  std::array<double, 3>* const sent_b = sent_b_.data();
  std::array<double, 3>* const recv_b = recv_b_.data();
  std::int64_t *const sent = sent_.data(), *const received = received_.data();
  for (std::size_t j = 0; j < bytes.size(); ++j) {
    const std::size_t s = src[j], d = dst[j];
    if (bytes[j] == 0 || s == d) continue;
    const std::size_t v = via[j], k = tier[j];
    const auto b = static_cast<double>(bytes[j]);
    if (v != s) {
      sent_b[s][0] += b;
      recv_b[v][0] += b;
    }
    sent_b[v][k] += b;
    recv_b[d][k] += b;
    ++sent[s];
    ++received[d];
  }
  finish(t);
}

}  // namespace detail

std::vector<double> alltoall_seconds(const Interconnect& net, std::span<const std::int64_t> bytes,
                                     std::span<const std::int64_t> gpu_of_worker) {
  return detail::AlltoallPricer(net, gpu_of_worker).seconds(bytes);
}

double serial_seconds(const PhaseSeconds& step) { return step.dispatch + step.compute + step.ret; }

double pipelined_seconds(const PhaseSeconds& chunk, std::int64_t chunks) {
  double t = chunk.dispatch;
  for (std::int64_t m = 0; m < chunks; ++m) {
    const double comm = (m + 1 < chunks ? chunk.dispatch : 0.0) + (m > 0 ? chunk.ret : 0.0);
    t += std::max(chunk.compute, comm);
  }
  return t + chunk.ret;
}

double pipelined_seconds(std::span<const PhaseSeconds> chunks) {
  if (chunks.empty()) return 0;
  const std::size_t m_count = chunks.size();
  double t = chunks[0].dispatch;
  for (std::size_t m = 0; m < m_count; ++m) {
    const double comm = (m + 1 < m_count ? chunks[m + 1].dispatch : 0.0) + (m > 0 ? chunks[m - 1].ret : 0.0);
    t += std::max(chunks[m].compute, comm);
  }
  return t + chunks[m_count - 1].ret;
}

double noise_factor(const DeviceNoise& noise, std::uint64_t window, std::uint64_t step, std::uint64_t gpu) {
  if (noise.sigma == 0) return 1.0;
  std::uint64_t h = splitmix64(noise.seed);
  h = splitmix64(h ^ window);
  h = splitmix64(h ^ (step * 0x100000001b3ULL));
  h = splitmix64(h ^ (gpu * 0xc2b2ae3d27d4eb4fULL));
  const std::uint64_t h2 = splitmix64(h);
  // Two uniforms in (0, 1) from the top 53 bits; Box-Muller to one normal.
  const double u1 = (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = (static_cast<double>(h2 >> 11) + 0.5) * 0x1.0p-53;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
  z = std::clamp(z, -4.0, 4.0);
  return std::max(0.05, 1.0 + noise.sigma * z);
}

double linear_seconds(const StepModel& step, const ModelShape& model, double tokens, double gpus, bool backward) {
  const double flops_per_token = (backward ? 4.0 : 2.0) * model.active_params;
  return flops_per_token * tokens / gpus / (step.linear_tflops * 1e12);
}

double allreduce_seconds(const Interconnect& net, double bytes, std::int64_t dp) {
  if (dp <= 1) return 0;
  const double n = static_cast<double>(dp);
  return 2.0 * (n - 1) / n * bytes / (net.inter_node_gbps * 1e9) + 2.0 * (n - 1) * net.latency_us * 1e-6;
}

Status validate_cost_model(const CostModel& m) {
  auto positive = [](double v) { return v > 0 && std::isfinite(v); };
  if (!positive(m.net.intra_node_gbps)) {
    return invalid_input(fmt::format("--intra-node-gbps {}: bandwidth must be positive", m.net.intra_node_gbps));
  }
  if (!positive(m.net.inter_node_gbps)) {
    return invalid_input(fmt::format("--inter-node-gbps {}: bandwidth must be positive", m.net.inter_node_gbps));
  }
  if (!(m.net.latency_us >= 0) || !std::isfinite(m.net.latency_us)) {
    return invalid_input(fmt::format("--latency-us {}: must be a non-negative number", m.net.latency_us));
  }
  if (!positive(m.net.inter_supernode_gbps)) {
    return invalid_input(
        fmt::format("--inter-supernode-gbps {}: bandwidth must be positive", m.net.inter_supernode_gbps));
  }
  if (!(m.net.congestion_per_node >= 0) || !std::isfinite(m.net.congestion_per_node)) {
    return invalid_input(
        fmt::format("--congestion-per-node {}: must be a non-negative number", m.net.congestion_per_node));
  }
  // The plans' topology holds them as int: a larger value was cut to 32
  // bits (4294967298 GPUs a node placed as 2).
  constexpr std::int64_t kMaxInt = std::numeric_limits<std::int32_t>::max();
  if (m.net.nodes_per_supernode < 1 || m.net.nodes_per_supernode > kMaxInt) {
    return invalid_input(
        fmt::format("--nodes-per-supernode {}: must be in [1, {}]", m.net.nodes_per_supernode, kMaxInt));
  }
  if (m.net.gpus_per_node < 1 || m.net.gpus_per_node > kMaxInt) {
    return invalid_input(fmt::format("--gpus-per-node {}: must be in [1, {}]", m.net.gpus_per_node, kMaxInt));
  }
  if (!(m.noise.sigma >= 0) || !(m.noise.sigma < 1)) {
    return invalid_input(fmt::format("--noise-sigma {}: must be in [0, 1)", m.noise.sigma));
  }
  if (!positive(m.step.linear_tflops)) {
    return invalid_input(fmt::format("--linear-tflops {}: must be positive", m.step.linear_tflops));
  }
  if (m.kernel.entries.empty()) return invalid_input("--kernel-profile: the profile has no entries");
  return {};
}

}  // namespace libra
