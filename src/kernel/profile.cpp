// Measures the kernel's throughput profile (see ProfileOptions).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "libra/checked.hpp"
#include "libra/kernel.hpp"
#include "libra/workload.hpp"

namespace libra::kernel {

namespace {

double now(bool thread_cpu) {
  if (thread_cpu) {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median over `reps` timings of the mean seconds per call, each timing
// repeating the call until it has run for at least min_seconds.
template <class Fn>
Result<double> time_call(const ProfileOptions& o, Fn&& fn) {
  std::vector<double> per_call;
  for (int r = 0; r < o.repetitions; ++r) {
    int calls = 0;
    const double t0 = now(o.thread_cpu_clock);
    double dt = 0;
    do {
      LIBRA_TRY(fn());
      ++calls;
      dt = now(o.thread_cpu_clock) - t0;
    } while (dt < o.min_seconds || dt <= 0);
    per_call.push_back(dt / calls);
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

}  // namespace

Result<std::vector<ProfileEntry>> measure_profile(const ProfileOptions& o) {
  if (o.block_lens.empty() || o.heads.empty()) return invalid_input("profile: need at least one block length and one head count");
  for (std::int64_t l : o.block_lens) {
    if (l < 1 || l > (std::int64_t{1} << 20)) {
      return invalid_input("profile: block length " + std::to_string(l) + " must be in [1, 1048576]");
    }
  }
  for (std::int64_t h : o.heads) {
    if (h < 1 || h > 256) return invalid_input("profile: head count " + std::to_string(h) + " must be in [1, 256]");
  }
  if (o.head_dim < 1 || o.head_dim > 1024) {
    return invalid_input("profile: head_dim " + std::to_string(o.head_dim) + " must be in [1, 1024]");
  }
  if (o.threads < 1 || o.threads > 1024) {
    return invalid_input("profile: threads " + std::to_string(o.threads) + " must be in [1, 1024]");
  }
  if (o.thread_cpu_clock && o.threads != 1) {
    return invalid_input("profile: the thread CPU clock measures one thread; use threads 1 or the wall clock");
  }
  if (o.repetitions < 1 || !(o.min_seconds >= 0) || o.min_seconds > 60) {
    return invalid_input("profile: repetitions must be >= 1 and min_seconds in [0, 60]");
  }
  const std::int64_t d = o.head_dim, eb = dtype_bytes(o.dtype);
  const std::int64_t max_len = *std::max_element(o.block_lens.begin(), o.block_lens.end());
  const std::int64_t max_heads = *std::max_element(o.heads.begin(), o.heads.end());
  auto elems = checked_mul(max_len, max_heads * d);
  if (!elems || *elems * eb > (std::int64_t{1} << 32)) {
    return invalid_input("profile: block length * heads * head_dim is too large to allocate");
  }
  // One set of buffers at the largest size; calls use views of the first rows/heads.
  const auto n = static_cast<std::size_t>(*elems * eb);
  std::vector<unsigned char> q(n), k(n), v(n), out(n), d_o(n), dq(n), dk(n), dv(n);
  std::vector<float> lse(static_cast<std::size_t>(max_len * max_heads));
  std::mt19937_64 rng(7);
  for (auto* buf : {&q, &k, &v, &d_o}) {
    for (std::size_t i = 0; i < n; i += static_cast<std::size_t>(eb)) {
      const float x = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
      store_from_f32(buf->data(), o.dtype, static_cast<std::int64_t>(i) / eb, x);
    }
  }
  std::vector<ProfileEntry> entries;
  for (std::int64_t len : o.block_lens) {
    for (std::int64_t h : o.heads) {
      const std::int64_t stride = h * d;
      auto view = [&](std::vector<unsigned char>& b) { return Tensor{b.data(), o.dtype, len, h, d, stride}; };
      const Tensor tl{lse.data(), DType::kF32, len, h, 1, h};
      const std::vector<Fragment> frags = {{0, 0, len, 0, len}};
      const ForwardArgs fa{view(q), view(k), view(v), view(out), tl, frags, kFullCausal, 0.0f, o.threads};
      const BackwardArgs ba{view(q), view(k), view(v), view(out), view(d_o), tl, view(dq), view(dk), view(dv),
                            frags, kFullCausal, 0.0f, o.threads};
      LIBRA_ASSIGN_OR_RETURN(const double tf, time_call(o, [&] { return attention_forward(fa); }));
      LIBRA_ASSIGN_OR_RETURN(const double tb, time_call(o, [&] { return attention_backward(ba); }));
      LIBRA_ASSIGN_OR_RETURN(const std::int64_t pairs, causal_pairs(0, len));
      const double heads = static_cast<double>(h);
      entries.push_back({len, h, forward_flops(pairs, d) * heads / tf / 1e9, backward_flops(pairs, d) * heads / tb / 1e9});
    }
  }
  return entries;
}

}  // namespace libra::kernel
