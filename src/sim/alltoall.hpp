// Internal to the sim stage: alltoall_seconds (libra/cost_model.hpp) for
// many byte matrices on one set of GPUs. Each pair's tier (and PXN relay)
// and the links' bandwidths are found once, not once per matrix; the times
// are alltoall_seconds', bit for bit (it is implemented with this class).
//
//   detail::AlltoallPricer price(net, gpus);   // gpus: the W workers' GPU ids
//   std::vector<double> t;
//   price.seconds(bytes, t);                   // bytes: W * W, [src * W + dst]
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "libra/cost_model.hpp"

namespace libra::detail {

class AlltoallPricer {
 public:
  AlltoallPricer(const Interconnect& net, std::span<const std::int64_t> gpu_of_worker);
  std::size_t workers() const { return w_; }
  // Each worker's seconds for `bytes` (W * W) into t (resized to W).
  void seconds(std::span<const std::int64_t> bytes, std::vector<double>& t);
  std::vector<double> seconds(std::span<const std::int64_t> bytes) {
    std::vector<double> t;
    seconds(bytes, t);
    return t;
  }
  // The same for a matrix that is zero off `pairs` (src * W + dst,
  // increasing): bytes[j] is pair j's.
  void seconds(std::span<const std::uint32_t> pairs, std::span<const std::int64_t> bytes, std::vector<double>& t);

 private:
  std::size_t w_ = 0;
  // Each worker's node and supernode, and with PXN the worker whose NIC
  // carries each cross-node pair [s * W + d] (empty without).
  std::vector<std::int64_t> node_, supernode_;
  std::vector<std::uint32_t> via_;
  void add(std::size_t s, std::size_t d, std::int64_t b);
  void finish(std::vector<double>& t);
  double bi_ = 0, be_ = 0, bs_ = 0, latency_us_ = 0;
  // Scratch of seconds(): [worker][tier] bytes, and messages.
  std::vector<std::array<double, 3>> sent_b_, recv_b_;
  std::vector<std::int64_t> sent_, received_;
};

}  // namespace libra::detail
