// libra/kernel.hpp: a CPU variable-length causal attention kernel, forward
// and backward (the FlashAttention-2 algorithm: tiled, online softmax, the
// full score matrix is never materialised, fp32 accumulation).
//
// Defines tensor views over row-major [rows, heads, head_dim] buffers with an
// explicit row stride (fp32, bf16 or fp16), query fragments, and the two calls
// attention_forward / attention_backward.
//
// A call takes a batch of query fragments. Fragment f holds the sample-local
// query positions [a, e) of one sample; its queries sit in rows
// [q_row, q_row + e - a) of Q (and O, LSE, dO, dQ) and its sample's keys
// 0 .. e-1 sit in rows [kv_row, kv_row + e) of K and V (and dK, dV). The mask
// is bottom-right aligned causal with an optional window w: the query at
// sample-local position q sees keys max(0, q - w + 1) .. q.
//
// Heads: a view covers `heads` consecutive heads; a call uses all heads of
// its views. Q has h_q heads, K/V have h_kv heads, h_kv divides h_q, and
// query head i of the call uses KV head i / (h_q / h_kv). A head range is
// selected without copying with heads_slice(first, count).
//
//   using namespace libra::kernel;
//   ConstTensor q{q_ptr, DType::kBF16, /*rows=*/T, /*heads=*/32, /*head_dim=*/128, /*row_stride=*/32 * 128};
//   ConstTensor k{k_ptr, DType::kBF16, T, 8, 128, 8 * 128}, v{...};
//   Tensor o{o_ptr, DType::kBF16, T, 32, 128, 32 * 128};
//   Tensor lse{lse_ptr, DType::kF32, T, 32, 1, 32};   // fp32, head_dim 1
//   std::vector<Fragment> frags = {{/*q_row=*/0, /*kv_row=*/0, /*sample_len=*/4096, /*a=*/1024, /*e=*/2048}};
//   ForwardArgs fwd{q.heads_slice(0, 8), k.heads_slice(0, 2), v.heads_slice(0, 2),
//                   o.heads_slice(0, 8), lse.heads_slice(0, 8), frags};
//   fwd.threads = 2;
//   libra::Status s = attention_forward(fwd);
//
// Library choice: the block products and the exponentials are written with
// Highway (libhwy, portable SIMD with runtime dispatch), compiled for
// AVX-512, AVX2 and a portable fallback and chosen at run time for the CPU.
// A BLAS call per block (OpenBLAS) was the alternative; it cannot fuse the
// online softmax or the output rescale with the products, it repacks both
// operands on every call (costly at the 64-row blocks FlashAttention uses),
// and the Debian build follows OPENBLAS_CORETYPE, which may pin it to an
// older instruction set than the machine has (Haswell/AVX2 here).
// bench/kernel_bench.cpp runs a BLAS-based implementation side by side
// (measured 2-3x slower; docs/kernel.md).
//
// Threads: up to `threads` workers (fewer for small calls, see
// min_flops_per_thread) split the call's work (query blocks in the forward
// pass, key blocks in the backward pass) by a static, deterministic
// assignment, so results are bit-identical for a fixed `threads`.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "libra/dtype.hpp"
#include "libra/status.hpp"
#include "libra/tensor_view.hpp"
#include "libra/workload.hpp"

namespace libra::kernel {

// Element types are libra::DType (libra/dtype.hpp): every view may be fp32,
// bf16 or fp16 (IEEE half) storage, except the LSE (fp32); the kernel widens
// to fp32 when packing and accumulates in fp32. Outputs are rounded to their
// view's type (fp16: nearest even, beyond +-65504 to +-inf, as IEEE does).
using libra::DType;
using libra::dtype_bytes;
using libra::dtype_name;
using libra::bf16_from_f32;
using libra::f32_from_bf16;
using libra::f16_from_f32;
using libra::f32_from_f16;

// Views and fragments are those of libra/tensor_view.hpp (the backend seam
// passes them through unchanged); the kernel reads host memory and ignores
// the device tag, which libra::make_cpu_backend checks.
template <class Void>
using BasicTensor = libra::BasicView<Void>;
using ConstTensor = libra::ConstView;
using Tensor = libra::View;
using Fragment = libra::QueryFragment;

struct ForwardArgs {
  ConstTensor q, k, v;   // q: [*, h_q, d]; k, v: [*, h_kv, d]
  Tensor o;              // [*, h_q, d]; rows of every fragment are written
  Tensor lse;            // fp32, [*, h_q, 1]: natural-log sum of exp of scaled scores
  std::span<const Fragment> fragments;
  std::int64_t window = kFullCausal;  // >= 1
  float softmax_scale = 0.0f;         // 0 means 1 / sqrt(head_dim)
  int threads = 1;                    // >= 1: the most threads the call may use
  // Outputs must not overlap inputs or each other.
  // A thread is started per this many FLOPs of work (starting one costs tens
  // of microseconds); 0 always uses `threads` (tests of the threaded paths).
  double min_flops_per_thread = 2e7;
};

struct BackwardArgs {
  ConstTensor q, k, v, o, d_o;  // as in the forward pass; d_o like o
  ConstTensor lse;              // fp32 [*, h_q, 1], from the forward pass
  Tensor dq;                    // like q: written (or added to, see accumulate_dq)
  Tensor dk, dv;                // like k, v: ADDED to (several fragments and calls share K/V rows)
  std::span<const Fragment> fragments;
  std::int64_t window = kFullCausal;
  float softmax_scale = 0.0f;
  int threads = 1;
  bool accumulate_dq = false;  // add to dq instead of overwriting the fragments' rows
  double min_flops_per_thread = 2e7;  // as in ForwardArgs
};

// Checks every view, stride and fragment against the rules above; the first
// broken rule is returned as an invalid-input Error. Both calls run it first
// and touch no memory when it fails.
[[nodiscard]] Status validate(const ForwardArgs& args);
[[nodiscard]] Status validate(const BackwardArgs& args);

// O = softmax(scale * Q K^T + mask) V per fragment and head, and the LSE.
[[nodiscard]] Status attention_forward(const ForwardArgs& args);

// dQ, dK, dV from dO, O and the LSE (FlashAttention-2 backward).
[[nodiscard]] Status attention_backward(const BackwardArgs& args);

// Scratch: each call carves its packed panels and accumulators out of one
// buffer kept per calling thread and grown to the largest call so far, so
// repeated calls do not allocate. This frees the calling thread's buffer.
void release_thread_scratch();

// The SIMD target chosen at run time, e.g. "AVX3" or "AVX2".
[[nodiscard]] std::string simd_target();

// Restricts the run-time target for the whole process: "auto" (the best the
// CPU supports), "avx512", "avx2" or "scalar" (the portable fallback, one lane), so the
// AVX2 code can be measured and tested on an AVX-512 machine. An unknown
// name or one the CPU lacks is an invalid-input Error and changes nothing.
// Not to be called while kernel calls run on other threads.
[[nodiscard]] Status set_simd_target(std::string_view name);

// This machine's fp32 FMA throughput in GFLOP/s on `threads` threads at
// once, for the run-time SIMD target: each thread runs independent chains of
// vector FMAs held in registers (24 on 32-register targets, 12 on AVX2: more
// than FMA latency times FMA pipes, and no spill) for about `seconds`;
// FLOPs = 2 * lanes * chains * iterations.
// Benchmarks divide by it to report the fraction of peak.
[[nodiscard]] double measure_fma_peak_gflops(int threads, double seconds = 0.25);

// The same probe, timed both ways: wall_gflops as above; cpu_gflops sums
// each thread's FLOPs over its own CPU time, so time the thread waited for
// a core on a shared machine does not count (the peak of the cores we got).
struct FmaPeak {
  double wall_gflops = 0;
  double cpu_gflops = 0;
};
[[nodiscard]] FmaPeak measure_fma_peak(int threads, double seconds = 0.25);

// Throughput profile for cost models (docs/kernel.md, data/profiles/): one
// call = one causal sample of block_len tokens (fragment [0, block_len)) on
// `heads` query heads and `heads` KV heads; GFLOP/s = causal pairs * 4d
// (forward) or * 10d (backward) * heads / median wall time.
struct ProfileEntry {
  std::int64_t block_len = 0;
  std::int64_t heads = 0;
  double fwd_gflops = 0;
  double bwd_gflops = 0;
};
struct ProfileOptions {
  std::vector<std::int64_t> block_lens = {128, 256, 512, 1024, 2048, 4096, 8192};
  std::vector<std::int64_t> heads = {1, 2, 4, 8};
  std::int64_t head_dim = 128;
  DType dtype = DType::kF32;
  int threads = 1;
  double min_seconds = 0.05;  // per timing: repeat calls until this long
  int repetitions = 3;        // timings per entry; the median is kept
  // Wall clock by default. With threads == 1 the calling thread's CPU time
  // may be used instead: on a shared, busy machine it excludes the time the
  // thread waited for a core (it still includes cache interference).
  bool thread_cpu_clock = false;
};
[[nodiscard]] Result<std::vector<ProfileEntry>> measure_profile(const ProfileOptions& options);

}  // namespace libra::kernel
