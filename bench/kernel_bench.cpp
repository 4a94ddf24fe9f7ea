// Benchmarks of the CPU attention kernel (libra/kernel.hpp), forward and
// backward, against a straightforward implementation that materialises each
// query block's scores with OpenBLAS sgemm (what a user would otherwise
// write), in the same run.
//
// Counters: GFLOPs (causal pairs * 4d forward, * 10d backward, per query
// head; libra/workload.hpp, over wall time) and peak_frac, the fraction of
// this machine's fp32 FMA peak measured at start-up by
// libra::kernel::measure_fma_peak (register-resident vector-FMA chains of
// the run-time target on all benchmark threads at once, best of 20; printed
// in the context as fma_peak_gflops_tN). GFLOPs_cpu / peak_frac_cpu are the
// same over process CPU time per thread (and the CPU-time peak): on a
// shared, busy machine they discount the time our threads waited for a core.
//
//   build/<dir>/bench/libra_kernel_bench [--target auto|avx512|avx2|scalar]
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true   (one command line)
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fma_probe.hpp"
#include "libra/kernel.hpp"
#include "libra/workload.hpp"

namespace {

using libra::kernel::ConstTensor;
using libra::kernel::DType;
using libra::kernel::Fragment;
using libra::kernel::Tensor;
using I64 = std::int64_t;

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}
double wall_seconds() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

using libra::kernel::FmaPeak;
std::map<int, FmaPeak>& peaks() {
  static std::map<int, FmaPeak> p;
  return p;
}

// The FMA peak of `threads` threads (fma_probe.hpp), once per thread count:
// a probe that read low would understate what the kernel then reaches.
const FmaPeak& peak(int threads) {
  auto it = peaks().find(threads);
  if (it != peaks().end()) return it->second;
  const double c0 = process_cpu_seconds(), w0 = wall_seconds();
  const FmaPeak best = libra_bench::best_fma_peak(threads);
  const double share = (process_cpu_seconds() - c0) / ((wall_seconds() - w0) * threads);
  const std::string t = "_t" + std::to_string(threads);
  benchmark::AddCustomContext("fma_peak_gflops" + t, std::to_string(best.wall_gflops));
  benchmark::AddCustomContext("fma_peak_cpu_gflops" + t, std::to_string(best.cpu_gflops));
  // The share of `threads` cores this process got while measuring: below
  // ~0.95 the machine was busy and every wall-clock figure is depressed.
  benchmark::AddCustomContext("fma_peak_cpu_share" + t, std::to_string(share));
  return peaks()[threads] = best;
}

// `samples` samples of `len` tokens packed back to back, one fragment each
// covering the whole sample; fp32, d = 128 unless told otherwise.
struct Problem {
  I64 len, samples, hq, hkv, d, tokens;
  std::vector<float> q, k, v, o, lse, d_o, dq, dk, dv;
  std::vector<Fragment> frags;
  Problem(I64 len_, I64 samples_, I64 hq_, I64 hkv_, I64 d_ = 128)
      : len(len_), samples(samples_), hq(hq_), hkv(hkv_), d(d_), tokens(len_ * samples_) {
    std::mt19937_64 rng(42);
    auto fill = [&](std::vector<float>& x, I64 n) {
      x.resize(static_cast<std::size_t>(n));
      for (float& e : x) e = static_cast<float>(static_cast<double>(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
    };
    fill(q, tokens * hq * d);
    fill(k, tokens * hkv * d);
    fill(v, tokens * hkv * d);
    fill(d_o, tokens * hq * d);
    o.assign(q.size(), 0.0f);
    dq.assign(q.size(), 0.0f);
    dk.assign(k.size(), 0.0f);
    dv.assign(k.size(), 0.0f);
    lse.assign(static_cast<std::size_t>(tokens * hq), 0.0f);
    for (I64 s = 0; s < samples; ++s) frags.push_back({s * len, s * len, len, 0, len});
  }
  ConstTensor cq() const { return {q.data(), DType::kF32, tokens, hq, d, hq * d}; }
  ConstTensor ckv(const std::vector<float>& x) const { return {x.data(), DType::kF32, tokens, hkv, d, hkv * d}; }
  Tensor tq(std::vector<float>& x) { return {x.data(), DType::kF32, tokens, hq, d, hq * d}; }
  Tensor tkv(std::vector<float>& x) { return {x.data(), DType::kF32, tokens, hkv, d, hkv * d}; }
  Tensor tlse() { return {lse.data(), DType::kF32, tokens, hq, 1, hq}; }
  double pairs() const { return static_cast<double>(*libra::causal_pairs(0, len)) * static_cast<double>(samples); }
  double fwd_flops() const { return 4.0 * static_cast<double>(d) * pairs() * static_cast<double>(hq); }
  double bwd_flops() const { return 10.0 * static_cast<double>(d) * pairs() * static_cast<double>(hq); }
};

libra::kernel::ForwardArgs fwd_args(Problem& p, int threads) {
  return {p.cq(), p.ckv(p.k), p.ckv(p.v), p.tq(p.o), p.tlse(), p.frags, libra::kFullCausal, 0.0f, threads};
}

// Times one iteration by wall clock (manual time) and records the CPU share
// the process got, so a busy machine shows up in the output.
template <class Fn>
void timed(benchmark::State& state, double flops, int threads, Fn&& fn) {
  double gflops = 0, gflops_cpu = 0, share = 0, n = 0;
  for (auto _ : state) {
    const double c0 = process_cpu_seconds(), w0 = wall_seconds();
    fn();
    const double w = wall_seconds() - w0, c = process_cpu_seconds() - c0;
    state.SetIterationTime(w);
    gflops += flops / w / 1e9;
    gflops_cpu += flops / (c / threads) / 1e9;
    share += c / (w * threads);
    n += 1;
  }
  const FmaPeak& pk = peak(threads);
  state.counters["GFLOPs"] = gflops / n;
  state.counters["peak_frac"] = gflops / n / pk.wall_gflops;
  // CPU-time figures: FLOPs over the process CPU time per thread, against
  // the CPU-time peak; they discount the time the threads waited for a core.
  state.counters["GFLOPs_cpu"] = gflops_cpu / n;
  state.counters["peak_frac_cpu"] = gflops_cpu / n / pk.cpu_gflops;
  state.counters["cpu_share"] = share / n;
}

// Args: sample length, samples, h_q, h_kv, threads.
void BM_KernelForward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1), state.range(2), state.range(3));
  const int threads = static_cast<int>(state.range(4));
  (void)peak(threads);
  timed(state, p.fwd_flops(), threads, [&] {
    if (!libra::kernel::attention_forward(fwd_args(p, threads)).ok()) state.SkipWithError("forward failed");
    benchmark::DoNotOptimize(p.o.data());
  });
}

void BM_KernelBackward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1), state.range(2), state.range(3));
  const int threads = static_cast<int>(state.range(4));
  (void)peak(threads);
  if (!libra::kernel::attention_forward(fwd_args(p, threads)).ok()) state.SkipWithError("forward failed");
  timed(state, p.bwd_flops(), threads, [&] {
    libra::kernel::BackwardArgs b{p.cq(),        p.ckv(p.k),   p.ckv(p.v),   p.tq(p.o),
                                  p.tq(p.d_o),   p.tlse(),     p.tq(p.dq),   p.tkv(p.dk),
                                  p.tkv(p.dv),   p.frags,      libra::kFullCausal, 0.0f, threads};
    if (!libra::kernel::attention_backward(b).ok()) state.SkipWithError("backward failed");
    benchmark::DoNotOptimize(p.dq.data());
  });
}

// ---- The straightforward BLAS implementation --------------------------------
// Per head and per block of kBlasRows queries: S = Q_blk K[0:end]^T with one
// sgemm (the full score block is materialised), mask, row softmax with
// std::exp, O_blk = P V[0:end] with a second sgemm. OpenBLAS threads inside.
constexpr I64 kBlasRows = 256;

void blas_forward(Problem& p, std::vector<float>& s) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  const I64 hg = p.hq / p.hkv, ldq = p.hq * p.d, ldk = p.hkv * p.d;
  for (const Fragment& f : p.frags) {
    for (I64 h = 0; h < p.hq; ++h) {
      const float* kh = p.k.data() + f.kv_row * ldk + (h / hg) * p.d;
      const float* vh = p.v.data() + f.kv_row * ldk + (h / hg) * p.d;
      for (I64 i0 = 0; i0 < f.e; i0 += kBlasRows) {
        const I64 m = std::min(kBlasRows, f.e - i0), n = i0 + m;  // keys [0, n)
        const float* qb = p.q.data() + (f.q_row + i0) * ldq + h * p.d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
                    static_cast<int>(p.d), scale, qb, static_cast<int>(ldq), kh, static_cast<int>(ldk), 0.0f,
                    s.data(), static_cast<int>(n));
        for (I64 r = 0; r < m; ++r) {
          float* row = s.data() + r * n;
          const I64 last = i0 + r;  // keys > last are masked
          float mx = -INFINITY;
          for (I64 j = 0; j <= last; ++j) mx = std::max(mx, row[j]);
          float sum = 0;
          for (I64 j = 0; j <= last; ++j) sum += (row[j] = std::exp(row[j] - mx));
          const float inv = 1.0f / sum;
          for (I64 j = 0; j <= last; ++j) row[j] *= inv;
          for (I64 j = last + 1; j < n; ++j) row[j] = 0.0f;
          p.lse[static_cast<std::size_t>((f.q_row + i0 + r) * p.hq + h)] = mx + std::log(sum);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(p.d),
                    static_cast<int>(n), 1.0f, s.data(), static_cast<int>(n), vh, static_cast<int>(ldk), 0.0f,
                    p.o.data() + (f.q_row + i0) * ldq + h * p.d, static_cast<int>(ldq));
      }
    }
  }
}

void blas_backward(Problem& p, std::vector<float>& s, std::vector<float>& dpm) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.d));
  const I64 hg = p.hq / p.hkv, ldq = p.hq * p.d, ldk = p.hkv * p.d;
  const int iq = static_cast<int>(ldq), ik = static_cast<int>(ldk), id = static_cast<int>(p.d);
  for (const Fragment& f : p.frags) {
    for (I64 h = 0; h < p.hq; ++h) {
      const I64 koff = f.kv_row * ldk + (h / hg) * p.d;
      for (I64 i0 = 0; i0 < f.e; i0 += kBlasRows) {
        const I64 m = std::min(kBlasRows, f.e - i0), n = i0 + m;
        const int im = static_cast<int>(m), in = static_cast<int>(n);
        const I64 qoff = (f.q_row + i0) * ldq + h * p.d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, in, id, scale, p.q.data() + qoff, iq,
                    p.k.data() + koff, ik, 0.0f, s.data(), in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, im, in, id, 1.0f, p.d_o.data() + qoff, iq,
                    p.v.data() + koff, ik, 0.0f, dpm.data(), in);
        for (I64 r = 0; r < m; ++r) {
          const I64 row = f.q_row + i0 + r, last = i0 + r;
          const float l = p.lse[static_cast<std::size_t>(row * p.hq + h)];
          float delta = 0;
          for (I64 c = 0; c < p.d; ++c) {
            delta += p.d_o[static_cast<std::size_t>(row * ldq + h * p.d + c)] *
                     p.o[static_cast<std::size_t>(row * ldq + h * p.d + c)];
          }
          float* pr = s.data() + r * n;
          float* dr = dpm.data() + r * n;
          for (I64 j = 0; j <= last; ++j) {
            pr[j] = std::exp(pr[j] - l);
            dr[j] = pr[j] * (dr[j] - delta);
          }
          for (I64 j = last + 1; j < n; ++j) pr[j] = dr[j] = 0.0f;
        }
        // dV += P^T dO ; dK += scale dS^T Q ; dQ = scale dS K
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, id, im, 1.0f, s.data(), in, p.d_o.data() + qoff, iq,
                    1.0f, p.dv.data() + koff, ik);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, id, im, scale, dpm.data(), in, p.q.data() + qoff,
                    iq, 1.0f, p.dk.data() + koff, ik);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, im, id, in, scale, dpm.data(), in,
                    p.k.data() + koff, ik, 0.0f, p.dq.data() + qoff, iq);
      }
    }
  }
}

void BM_BlasForward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1), state.range(2), state.range(3));
  const int threads = static_cast<int>(state.range(4));
  (void)peak(threads);
  openblas_set_num_threads(threads);
  std::vector<float> s(static_cast<std::size_t>(kBlasRows * p.len));
  timed(state, p.fwd_flops(), threads, [&] {
    blas_forward(p, s);
    benchmark::DoNotOptimize(p.o.data());
  });
}

void BM_BlasBackward(benchmark::State& state) {
  Problem p(state.range(0), state.range(1), state.range(2), state.range(3));
  const int threads = static_cast<int>(state.range(4));
  (void)peak(threads);
  openblas_set_num_threads(threads);
  std::vector<float> s(static_cast<std::size_t>(kBlasRows * p.len)), dpm(s.size());
  blas_forward(p, s);
  timed(state, p.bwd_flops(), threads, [&] {
    blas_backward(p, s, dpm);
    benchmark::DoNotOptimize(p.dq.data());
  });
}

// The configuration: d = 128, 8,192-token samples, causal, both
// cores; h_q = 2 query heads sharing one KV head (GQA).
void Targets(benchmark::internal::Benchmark* b) {
  b->ArgNames({"len", "samples", "hq", "hkv", "threads"});
  b->Args({8192, 1, 2, 1, 2});
  b->Args({8192, 1, 2, 1, 1});
  b->Args({2048, 4, 2, 1, 2});
  b->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(1);
}

BENCHMARK(BM_KernelForward)->Apply(Targets);
BENCHMARK(BM_BlasForward)->Apply(Targets);
BENCHMARK(BM_KernelBackward)->Apply(Targets);
BENCHMARK(BM_BlasBackward)->Apply(Targets);

}  // namespace

// --target auto|avx512|avx2|scalar restricts the kernel's (and the peak
// probe's) SIMD target; the target that ran is printed as simd_target.
int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    std::string target;
    if (a.rfind("--target=", 0) == 0) {
      target = a.substr(9);
    } else if (a == "--target" && i + 1 < argc) {
      target = argv[++i];
    } else {
      rest.push_back(argv[i]);
      continue;
    }
    const libra::Status s = libra::kernel::set_simd_target(target);
    if (!s.ok()) {
      std::fprintf(stderr, "libra_kernel_bench: --target: %s\n", s.message().c_str());
      return 2;
    }
  }
  argc = static_cast<int>(rest.size());
  argv = rest.data();
  benchmark::AddCustomContext("simd_target", libra::kernel::simd_target());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  (void)peak(1);
  (void)peak(2);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
