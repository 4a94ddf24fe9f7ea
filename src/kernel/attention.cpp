// The attention kernel's driver: validation, work decomposition into blocks,
// packing of K/V (and Q/dO for the backward pass) into padded fp32 panels,
// static deterministic assignment of blocks to threads, and the dQ
// reduction. The block arithmetic itself is in attention_simd.cpp.
#include <algorithm>
#include <barrier>
#include <ctime>
#include <initializer_list>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <hwy/aligned_allocator.h>
#include "core/fault.hpp"

#include "kernel/detail.hpp"
#include "libra/kernel.hpp"

namespace libra::kernel {

namespace {

using detail::BwdTask;
using detail::FwdTask;
using detail::Group;
using detail::kBk;
using detail::kBq;
using I64 = std::int64_t;

struct Layout {
  std::vector<Group> groups;
  std::vector<std::int32_t> frag_group;  // group of each fragment (-1: empty fragment)
  I64 total_blocks = 0;
  bool groups_overlap = false;  // distinct groups share K rows: dK/dV must not be split across threads
};

Layout make_layout(std::span<const Fragment> frags) {
  Layout lay;
  lay.frag_group.assign(frags.size(), -1);
  std::map<I64, std::int32_t> by_row;  // ordered: deterministic group numbering
  for (std::size_t i = 0; i < frags.size(); ++i) {
    if (frags[i].a == frags[i].e) continue;
    by_row.emplace(frags[i].kv_row, 0);
  }
  for (auto& [row, idx] : by_row) {
    idx = static_cast<std::int32_t>(lay.groups.size());
    lay.groups.push_back(Group{row, 0, 0, 0, {}});
  }
  for (std::size_t i = 0; i < frags.size(); ++i) {
    if (frags[i].a == frags[i].e) continue;
    const std::int32_t gi = by_row.at(frags[i].kv_row);
    lay.frag_group[i] = gi;
    Group& g = lay.groups[static_cast<std::size_t>(gi)];
    g.len = std::max(g.len, frags[i].e);
    g.frags.push_back(static_cast<std::int32_t>(i));
  }
  for (std::size_t i = 0; i < lay.groups.size(); ++i) {
    Group& g = lay.groups[i];
    g.nblocks = (g.len + kBk - 1) / kBk;
    g.block_off = lay.total_blocks;
    lay.total_blocks += g.nblocks;
    if (i > 0 && lay.groups[i - 1].kv_row + lay.groups[i - 1].len > g.kv_row) lay.groups_overlap = true;
  }
  return lay;
}

// Longest-processing-time-first onto `threads` bins; ties by index, so the
// assignment (and every floating-point summation order) is reproducible.
template <class Task>
std::vector<std::vector<Task>> assign(std::vector<Task> tasks, int threads) {
  std::vector<std::size_t> order(tasks.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t x, std::size_t y) { return tasks[x].cost > tasks[y].cost; });
  std::vector<std::vector<Task>> bins(static_cast<std::size_t>(threads));
  std::vector<I64> load(static_cast<std::size_t>(threads), 0);
  for (std::size_t i : order) {
    const auto t = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    bins[t].push_back(tasks[i]);
    load[t] += tasks[i].cost;
  }
  return bins;
}

// Threads worth starting: starting one costs tens of microseconds, so a
// call gets one thread per min_flops_per_thread of block work, never more
// than asked for or than there are tasks. Depends only on the call, so a
// fixed request stays deterministic.
template <class Task>
int useful_threads(int requested, const std::vector<Task>& tasks, I64 flops_per_cost, double min_flops) {
  I64 work = 0;
  for (const Task& t : tasks) work += t.cost;
  const double flops = static_cast<double>(work) * static_cast<double>(flops_per_cost);
  const double by_work = min_flops <= 0 ? 1e9 : std::max(1.0, std::floor(flops / min_flops));
  const double n = std::min({static_cast<double>(requested), static_cast<double>(tasks.size()), by_work});
  return std::max(1, static_cast<int>(n));
}

// Runs body(thread_id, barrier) on `threads` threads (the caller is thread 0).
template <class Body>
void run_threads(int threads, Body&& body) {
  std::barrier sync(threads);
  if (threads == 1) {
    body(0, sync);
    return;
  }
  std::vector<std::jthread> pool;
  pool.reserve(static_cast<std::size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) pool.emplace_back([&body, &sync, t] { body(t, sync); });
  body(0, sync);
}

float resolve_scale(float s, I64 d) { return s == 0.0f ? 1.0f / std::sqrt(static_cast<float>(d)) : s; }

// A NaN or Inf operand as 0 in the backward's packed copies: a masked
// (zero) entry of P or dS times NaN would be NaN and reach keys or queries
// the bad row does not see. The rows that do see it are NaN through their
// log-sum-exp or delta, as in plain attention.
float finite_or_zero(float x) { return std::isfinite(x) ? x : 0.0f; }

// Packs keys [0, len) of group g.. for KV head `head` of `src`: transposed
// block tiles [block][dp][kBk] (t != nullptr) and/or rows [block*kBk][dp];
// `finite` zeroes non-finite values (backward).
void pack_kv(const ConstTensor& src, I64 head, const Group& gr, I64 jb, I64 d, I64 dp, float* t, float* r,
             bool finite = false, std::uint64_t* bad_rows = nullptr) {
  const I64 j0 = jb * kBk;
  if (t != nullptr) {
    float* tile = t + (gr.block_off + jb) * dp * kBk;
    std::fill(tile, tile + dp * kBk, 0.0f);
    for (I64 j = 0; j < kBk && j0 + j < gr.len; ++j) {
      const I64 off = detail::elem_offset(src, gr.kv_row + j0 + j, head);
      for (I64 c = 0; c < d; ++c) {
        const float x = detail::load_elem(src.data, src.dtype, off + c);
        tile[c * kBk + j] = finite ? finite_or_zero(x) : x;
      }
    }
  }
  if (r != nullptr) {
    float* rows = r + (gr.block_off + jb) * kBk * dp;
    std::fill(rows, rows + kBk * dp, 0.0f);
    std::uint64_t bad = 0;
    for (I64 j = 0; j < kBk && j0 + j < gr.len; ++j) {
      const I64 off = detail::elem_offset(src, gr.kv_row + j0 + j, head);
      for (I64 c = 0; c < d; ++c) {
        const float x = detail::load_elem(src.data, src.dtype, off + c);
        if (!std::isfinite(x)) bad |= std::uint64_t{1} << j;
        rows[j * dp + c] = finite ? finite_or_zero(x) : x;
      }
    }
    if (bad_rows != nullptr) bad_rows[gr.block_off + jb] = bad;
  }
}

struct PackItem {
  std::int32_t group;
  I64 jb;
};

std::vector<PackItem> pack_items(const Layout& lay) {
  std::vector<PackItem> items;
  for (std::size_t gi = 0; gi < lay.groups.size(); ++gi) {
    for (I64 jb = 0; jb < lay.groups[gi].nblocks; ++jb) items.push_back({static_cast<std::int32_t>(gi), jb});
  }
  return items;
}

// All scratch of a call comes from one buffer kept per calling thread and
// grown to the largest call so far: allocating and freeing ~1 MiB per call
// made glibc map and unmap pages every time (page faults and TLB shootdowns
// cost more than the arithmetic of a 128-token call).
class Arena {
 public:
  // Reserves room for the given float counts, each 64-byte aligned. Empty
  // when the allocation failed (hwy returns null rather than throwing);
  // `fail` makes it fail, for the fault-injection tests.
  std::vector<float*> carve(std::initializer_list<I64> sizes, bool fail = false) {
    std::size_t total = 0;
    for (I64 n : sizes) total += static_cast<std::size_t>(detail::round_up(std::max<I64>(n, 1), 16));
    last_bytes_ = total * sizeof(float);
    if (total > cap_ || fail) {
      buf_.reset();
      cap_ = 0;
      if (!fail) buf_ = hwy::AllocateAligned<float>(total);
      if (!buf_) return {};
      cap_ = total;
    }
    std::vector<float*> out;
    float* p = buf_.get();
    for (I64 n : sizes) {
      out.push_back(p);
      p += detail::round_up(std::max<I64>(n, 1), 16);
    }
    return out;
  }
  void release() {
    buf_.reset();
    cap_ = 0;
  }
  std::size_t last_bytes() const { return last_bytes_; }

 private:
  std::size_t last_bytes_ = 0;
  hwy::AlignedFreeUniquePtr<float[]> buf_;
  std::size_t cap_ = 0;
};

Arena& thread_arena() {
  thread_local Arena arena;
  return arena;
}

Error scratch_failed(const char* call) {
  return internal_error(std::string(call) + ": out of memory allocating " + std::to_string(thread_arena().last_bytes()) +
                        " bytes of kernel scratch");
}

// The fault-injection point inside the kernel: true when the test hook asks
// this call's scratch allocation to fail.
Result<bool> kernel_fault() {
  const ::libra::detail::FaultAction a = ::libra::detail::fault_action(::libra::detail::FaultPoint::kKernel);
  if (a == ::libra::detail::FaultAction::kAlloc) return true;
  LIBRA_TRY(::libra::detail::fault_outcome(a, ::libra::detail::FaultPoint::kKernel));
  return false;
}

}  // namespace

std::string simd_target() { return detail::best_target_name(); }

Status set_simd_target(std::string_view name) { return detail::restrict_targets(name); }

void release_thread_scratch() { thread_arena().release(); }

namespace {
double thread_cpu_now() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}
}  // namespace

FmaPeak measure_fma_peak(int threads, double seconds) {
  threads = std::clamp(threads, 1, 1024);
  // Calibrate the iteration count on one thread, then run all threads at once.
  float sink = 0;
  std::int64_t iters = 1 << 16;
  double dt = 0;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)detail::fma_loop(iters, &sink);
    dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > 0.02 || iters > (std::int64_t{1} << 40)) break;
    iters *= 4;
  }
  iters = std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(iters) * seconds / dt));
  std::vector<float> sinks(static_cast<std::size_t>(threads));
  std::vector<double> cpu(static_cast<std::size_t>(threads));
  std::int64_t flops_per_iter = 0;
  auto body = [&](int t) {
    const double c0 = thread_cpu_now();
    const std::int64_t f = detail::fma_loop(iters, &sinks[static_cast<std::size_t>(t)]);
    cpu[static_cast<std::size_t>(t)] = thread_cpu_now() - c0;
    return f;
  };
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back([&body, t] { (void)body(t); });
    flops_per_iter = body(0);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double per_thread = static_cast<double>(flops_per_iter) * static_cast<double>(iters);
  FmaPeak p;
  p.wall_gflops = per_thread * threads / wall / 1e9;
  for (double c : cpu) p.cpu_gflops += per_thread / std::max(c, 1e-9) / 1e9;
  return p;
}

double measure_fma_peak_gflops(int threads, double seconds) { return measure_fma_peak(threads, seconds).wall_gflops; }

Status attention_forward(const ForwardArgs& args) {
  LIBRA_TRY(validate(args));
  const Layout lay = make_layout(args.fragments);
  if (lay.groups.empty()) return {};
  const I64 d = args.q.head_dim, dp = detail::round_up(d, detail::kPadTo);
  const I64 hkv = args.k.heads, hg = args.q.heads / hkv, w = args.window;
  std::vector<FwdTask> tasks;
  for (std::size_t fi = 0; fi < args.fragments.size(); ++fi) {
    const Fragment& f = args.fragments[fi];
    for (I64 i0 = 0; i0 < f.e - f.a; i0 += kBq) {
      const I64 m = std::min(kBq, f.e - f.a - i0);
      const I64 blocks = (f.a + i0 + m - 1) / kBk - detail::first_key(f.a + i0, w) / kBk + 1;
      for (I64 h = 0; h < hg; ++h) {
        tasks.push_back({static_cast<std::int32_t>(fi), static_cast<std::int32_t>(h), i0, m, blocks * (m + 8)});
      }
    }
  }
  const int threads = useful_threads(args.threads, tasks, 4 * kBk * d, args.min_flops_per_thread);
  const auto bins = assign(std::move(tasks), threads);
  const auto items = pack_items(lay);
  LIBRA_ASSIGN_OR_RETURN(const bool alloc_fault, kernel_fault());
  const auto mem = thread_arena().carve(
      {lay.total_blocks * dp * kBk, lay.total_blocks * kBk * dp, threads * detail::fwd_scratch_floats(dp)}, alloc_fault);
  if (mem.empty()) return scratch_failed("attention_forward");
  float* const kt = mem[0];
  float* const vr = mem[1];
  float* const scratch = mem[2];
  detail::FwdCtx cx;
  cx.args = args;
  cx.d = d;
  cx.dp = dp;
  cx.hg = hg;
  cx.scale = resolve_scale(args.softmax_scale, d);
  cx.groups = &lay.groups;
  cx.frag_group = &lay.frag_group;
  cx.kt = kt;
  cx.v = vr;
  std::vector<std::uint64_t> v_bad(static_cast<std::size_t>(lay.total_blocks), 0);
  cx.v_bad = v_bad.data();
  run_threads(threads, [&](int t, std::barrier<>& sync) {
    float* mine = scratch + t * detail::fwd_scratch_floats(dp);
    for (I64 g = 0; g < hkv; ++g) {
      for (std::size_t i = static_cast<std::size_t>(t); i < items.size(); i += static_cast<std::size_t>(threads)) {
        const Group& gr = lay.groups[static_cast<std::size_t>(items[i].group)];
        pack_kv(args.k, g, gr, items[i].jb, d, dp, kt, nullptr);
        pack_kv(args.v, g, gr, items[i].jb, d, dp, nullptr, vr, true, v_bad.data());
      }
      sync.arrive_and_wait();
      detail::FwdCtx local = cx;
      local.g = g;
      for (const FwdTask& task : bins[static_cast<std::size_t>(t)]) detail::forward_task(local, task, mine);
      sync.arrive_and_wait();  // the packed panels are overwritten for the next KV head
    }
  });
  return {};
}

namespace {

// The backward pass's tasks: per group and K block, the query rows that see
// it (plus a fixed cost per fragment), times the query heads of a KV head.
std::vector<BwdTask> backward_tasks(const BackwardArgs& args, const Layout& lay, I64 hg) {
  std::vector<BwdTask> tasks;
  for (std::size_t gi = 0; gi < lay.groups.size(); ++gi) {
    const Group& gr = lay.groups[gi];
    for (I64 jb = 0; jb < gr.nblocks; ++jb) {
      const I64 j0 = jb * kBk, jl = std::min(gr.len, j0 + kBk) - 1;
      I64 cost = 0;
      for (std::int32_t fi : gr.frags) {
        const Fragment& f = args.fragments[static_cast<std::size_t>(fi)];
        const I64 qlo = std::max(f.a, j0), qhi = detail::last_query(jl, args.window, f.e - 1);
        if (qhi >= qlo) cost += qhi - qlo + 1 + 8;
      }
      if (cost > 0) tasks.push_back({static_cast<std::int32_t>(gi), jb, cost * hg});
    }
  }
  return tasks;
}

// Query-side rows to pack: every fragment row, in chunks for the threads.
struct RowChunk {
  I64 row, n;
};
std::vector<RowChunk> row_chunks(std::span<const Fragment> fragments) {
  std::vector<RowChunk> chunks;
  for (const Fragment& f : fragments) {
    for (I64 i = 0; i < f.e - f.a; i += 256) chunks.push_back({f.q_row + i, std::min<I64>(256, f.e - f.a - i)});
  }
  return chunks;
}

// The backward pass's scratch, carved from the thread's arena.
struct BwdBuffers {
  float *kt, *vt, *kr;   // packed K, V panels and K rows
  float *qp, *dop;       // packed Q and dO: [hg][rows][dp]
  float *lse, *delta;    // [hg][rows]
  float* dq;             // per thread [hg][rows][dp], unscaled
  float* scratch;        // per thread bwd_scratch_floats(dp)
};

// Row `row` of query head h (local head hl of KV head group) packed: Q (0
// where not finite, its LSE then NaN), dO, and delta = rowsum(dO * O).
void pack_query_row(const BackwardArgs& args, const BwdBuffers& buf, I64 h, I64 hl, I64 row, I64 rows, I64 d, I64 dp,
                    float scale) {
  float* q = buf.qp + (hl * rows + row) * dp;
  float* o = buf.dop + (hl * rows + row) * dp;
  const I64 oq = detail::elem_offset(args.q, row, h), odo = detail::elem_offset(args.d_o, row, h);
  const I64 oo = detail::elem_offset(args.o, row, h);
  double dsum = 0;
  bool bad_q = false;
  for (I64 c = 0; c < d; ++c) {
    // Q pre-scaled as the forward packs it, so the scores here are the
    // forward's to the bit and P = exp(s - LSE) is the P that formed the
    // LSE; scale * (q . k) rounds differently, an error of ~1e-7 |s| in the
    // exponent (dV 37% off at scale 1e6, Inf from 1e10). A q that overflows
    // when scaled is the forward's NaN row.
    const float x = scale * detail::load_elem(args.q.data, args.q.dtype, oq + c);
    bad_q |= !std::isfinite(x);
    q[c] = finite_or_zero(x);
    o[c] = detail::load_elem(args.d_o.data, args.d_o.dtype, odo + c);
    dsum += static_cast<double>(o[c]) * detail::load_elem(args.o.data, args.o.dtype, oo + c);
  }
  std::fill(q + d, q + dp, 0.0f);
  std::fill(o + d, o + dp, 0.0f);
  buf.lse[hl * rows + row] = bad_q ? std::numeric_limits<float>::quiet_NaN()
                                   : static_cast<const float*>(args.lse.data)[detail::elem_offset(args.lse, row, h)];
  buf.delta[hl * rows + row] = static_cast<float>(dsum);
}

// dQ of KV head g's query heads over `chunk`: scale times the sum of every
// thread's accumulator, in thread order (deterministic), assigned or added.
void reduce_dq(const BackwardArgs& args, const BwdBuffers& buf, RowChunk chunk, I64 g, I64 hg, I64 rows, I64 d, I64 dp,
               int threads, float scale) {
  for (I64 hl = 0; hl < hg; ++hl) {
    const I64 h = g * hg + hl;
    for (I64 row = chunk.row; row < chunk.row + chunk.n; ++row) {
      const I64 off = detail::elem_offset(args.dq, row, h);
      for (I64 c = 0; c < d; ++c) {
        float s = 0.0f;
        for (int u = 0; u < threads; ++u) s += buf.dq[((u * hg + hl) * rows + row) * dp + c];
        float old = args.accumulate_dq ? detail::load_elem(args.dq.data, args.dq.dtype, off + c) : 0.0f;
        detail::store_elem(args.dq.data, args.dq.dtype, off + c, old + scale * s);
      }
    }
  }
}

}  // namespace

Status attention_backward(const BackwardArgs& args) {
  LIBRA_TRY(validate(args));
  const Layout lay = make_layout(args.fragments);
  if (lay.groups.empty()) return {};
  const I64 d = args.q.head_dim, dp = detail::round_up(d, detail::kPadTo);
  const I64 hkv = args.k.heads, hg = args.q.heads / hkv, rows = args.q.rows;
  const float scale = resolve_scale(args.softmax_scale, d);
  std::vector<BwdTask> tasks = backward_tasks(args, lay, hg);
  // Distinct groups with overlapping K rows would race on dK/dV: one thread.
  const int threads = useful_threads(lay.groups_overlap ? 1 : args.threads, tasks, 10 * kBk * d,
                                     args.min_flops_per_thread);
  const auto bins = assign(std::move(tasks), threads);
  const auto items = pack_items(lay);
  const std::vector<RowChunk> chunks = row_chunks(args.fragments);
  const I64 blocks = lay.total_blocks;
  LIBRA_ASSIGN_OR_RETURN(const bool alloc_fault, kernel_fault());
  const auto mem = thread_arena().carve({blocks * dp * kBk, blocks * dp * kBk, blocks * kBk * dp, hg * rows * dp,
                                         hg * rows * dp, hg * rows, hg * rows, threads * hg * rows * dp,
                                         threads * detail::bwd_scratch_floats(dp)},
                                        alloc_fault);
  if (mem.empty()) return scratch_failed("attention_backward");
  const BwdBuffers buf{mem[0], mem[1], mem[2], mem[3], mem[4], mem[5], mem[6], mem[7], mem[8]};
  std::vector<std::uint64_t> k_bad(static_cast<std::size_t>(lay.total_blocks), 0);
  detail::BwdCtx cx;
  cx.args = args;
  cx.d = d;
  cx.dp = dp;
  cx.hg = hg;
  cx.rows = rows;
  cx.scale = scale;
  cx.groups = &lay.groups;
  cx.kt = buf.kt;
  cx.vt = buf.vt;
  cx.kr = buf.kr;
  cx.k_bad = k_bad.data();
  cx.qp = buf.qp;
  cx.dop = buf.dop;
  cx.lse = buf.lse;
  cx.delta = buf.delta;
  run_threads(threads, [&](int t, std::barrier<>& sync) {
    const auto tu = static_cast<std::size_t>(t), tn = static_cast<std::size_t>(threads);
    float* mine = buf.scratch + t * detail::bwd_scratch_floats(dp);
    float* my_dq = buf.dq + t * hg * rows * dp;
    for (I64 g = 0; g < hkv; ++g) {
      for (std::size_t i = tu; i < items.size(); i += tn) {
        const Group& gr = lay.groups[static_cast<std::size_t>(items[i].group)];
        pack_kv(args.k, g, gr, items[i].jb, d, dp, buf.kt, buf.kr, true, k_bad.data());
        pack_kv(args.v, g, gr, items[i].jb, d, dp, buf.vt, nullptr, true);
      }
      for (std::size_t i = tu; i < chunks.size(); i += tn) {
        for (I64 hl = 0; hl < hg; ++hl) {
          for (I64 row = chunks[i].row; row < chunks[i].row + chunks[i].n; ++row) {
            pack_query_row(args, buf, g * hg + hl, hl, row, rows, d, dp, scale);
          }
        }
      }
      for (const RowChunk& c : chunks) {
        for (I64 hl = 0; hl < hg; ++hl) std::fill_n(my_dq + (hl * rows + c.row) * dp, c.n * dp, 0.0f);
      }
      sync.arrive_and_wait();
      detail::BwdCtx local = cx;
      local.g = g;
      for (const BwdTask& task : bins[tu]) detail::backward_task(local, task, mine, my_dq);
      sync.arrive_and_wait();
      for (std::size_t i = tu; i < chunks.size(); i += tn) reduce_dq(args, buf, chunks[i], g, hg, rows, d, dp, threads, scale);
      sync.arrive_and_wait();
    }
  });
  return {};
}

}  // namespace libra::kernel
