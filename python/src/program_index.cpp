// python/src/program_index.cpp: a rank program's index arrays for
// libra.torch (program_index.hpp), built once per micro-batch and worker in
// C++ without the GIL: every exchange's gather / local / scatter rows, every
// pass's apply rows, every chunk's merged varlen calls and its kernel
// descriptor table, all in one int32 array (the descriptor tables int64,
// two words a value) the runtime copies to the device at once and takes
// views of.
#include "program_index.hpp"

#include <algorithm>
#include <cstring>
#include <ctime>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>

namespace libra_py {

namespace {

// An apply group's joined source (every chunk's class messages, then the field's compute buffer):
// past every Loc, so it never reads as one (kStage is 3).
constexpr int kJoined = 4;

double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Head-vector positions are int32 (every torch index op takes them; half the memory of int64);
// a position past 2^31 - 1 is refused.
using I32 = std::int32_t;

I32 narrow(I64 v) {
  if (v < 0 || v > std::numeric_limits<I32>::max()) {
    throw std::overflow_error("index arrays: head-vector position " + std::to_string(v) + " is not in [0, 2^31)");
  }
  return static_cast<I32>(v);
}

struct Builder {
  std::vector<I32>& data;

  // n entries at the end of data; returns their offset (data may move: write through data after).
  I64 grow(I64 n) {
    const auto at = static_cast<I64>(data.size());
    data.resize(data.size() + static_cast<std::size_t>(n));
    return at;
  }

  // Moves expanded per head vector, grouped by (field, src, dst, add) in move order (so the adds into
  // one row keep the program's order). `pass` set: an apply list, whose wire sources are positions in
  // every chunk's class messages joined in chunk order and followed by the field's compute buffer.
  std::vector<GroupRec> groups(const libra::PassProgram* pass, const std::vector<libra::Move>& moves) {
    std::vector<std::array<I64, libra::kNumWireClasses>> base;
    std::array<I64, libra::kNumWireClasses> total{};
    if (pass) {
      for (const libra::ExchangeProgram& x : pass->out) {
        base.push_back(total);
        for (std::size_t c = 0; c < libra::kNumWireClasses; ++c)
          for (I64 n : x.recv_vectors[c]) total[c] += n;
      }
    }
    std::vector<GroupRec> out;
    std::vector<std::size_t> of(moves.size());
    for (std::size_t i = 0; i < moves.size(); ++i) {  // first pass: each move's group, each group's size
      const libra::Move& m = moves[i];
      const int src = pass ? kJoined : static_cast<int>(m.src);
      std::size_t g = 0;
      while (g < out.size() && !(out[g].field == static_cast<int>(m.field) && out[g].src == src &&
                                 out[g].dst == static_cast<int>(m.dst) && out[g].add == m.add)) {
        ++g;
      }
      if (g == out.size()) out.push_back({static_cast<int>(m.field), src, static_cast<int>(m.dst), libra::wire_class(m.field), m.add});
      of[i] = g;
      out[g].n += m.rows * m.run;
    }
    std::vector<I64> fill(out.size());
    for (std::size_t g = 0; g < out.size(); ++g) {
      out[g].s_off = grow(out[g].n);
      out[g].d_off = grow(out[g].n);
    }
    for (std::size_t i = 0; i < moves.size(); ++i) {
      const libra::Move& m = moves[i];
      GroupRec& g = out[of[i]];
      I64 shift = 0;
      if (pass) {
        const auto c = static_cast<std::size_t>(g.cls);
        shift = m.src == libra::Loc::kWire ? base[static_cast<std::size_t>(m.chunk)][c] : total[c];
      }
      I32* s = data.data() + g.s_off + fill[of[i]];
      I32* d = data.data() + g.d_off + fill[of[i]];
      for (I64 r = 0; r < m.rows; ++r) {
        const I64 s0 = shift + m.src_offset + r * m.src_stride, d0 = m.dst_offset + r * m.dst_stride;
        narrow(s0 + m.run);
        narrow(d0 + m.run);
        for (I64 j = 0; j < m.run; ++j) {
          *s++ = static_cast<I32>(s0 + j);
          *d++ = static_cast<I32>(d0 + j);
        }
      }
      fill[of[i]] += m.rows * m.run;
    }
    for (GroupRec& g : out) {
      auto iota = [&](I64 off) {
        const I32* p = data.data() + off;
        for (I64 i = 0; i < g.n; ++i)
          if (p[i] != i) return false;
        return true;
      };
      g.identity = (iota(g.s_off) ? 1 : 0) | (iota(g.d_off) ? 2 : 0);
    }
    return out;
  }

  ExchangeRec exchange(const libra::ExchangeProgram& x) {
    ExchangeRec r;
    r.send = x.send_vectors;
    r.recv = x.recv_vectors;
    r.gather = groups(nullptr, x.gather);
    r.local = groups(nullptr, x.local);
    r.scatter = groups(nullptr, x.scatter);
    return r;
  }

  // The calls of one chunk merged per (q_home, kv_home, q heads, kv heads), in descriptors.py's PAIRS
  // order, then by widths in order of first appearance; empty fragments (a >= e) are left out.
  std::vector<PairRec> varlen(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls) {
    std::vector<PairRec> out;
    for (int pair = 0; pair < 4; ++pair) {
      const bool qh = pair >= 2, kh = pair % 2 == 1;
      std::vector<std::pair<I64, I64>> widths;
      for (const libra::KernelCall& c : calls) {
        if (c.q_home != qh || c.kv_home != kh) continue;
        const std::pair<I64, I64> w{c.q.run, c.kv.run};
        if (std::find(widths.begin(), widths.end(), w) == widths.end()) widths.push_back(w);
      }
      for (const auto& [hq, hkv] : widths) out.push_back(merged(s, calls, qh, kh, hq, hkv));
    }
    return out;
  }

  PairRec merged(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls, bool qh, bool kh, I64 hq,
                 I64 hkv) {
    PairRec r{qh, kh, hq, hkv};
    auto mine = [&](const libra::KernelCall& c) {
      return c.q_home == qh && c.kv_home == kh && c.q.run == hq && c.kv.run == hkv;
    };
    for (const libra::KernelCall& c : calls) {  // first pass: the sizes
      if (!mine(c)) continue;
      for (const libra::CallFragment& f : s.call_fragments(c)) {
        if (f.e <= f.a) continue;
        ++r.seqs;
        r.total_q += f.e - f.a;
        r.total_k += f.e;
        r.max_q = std::max(r.max_q, f.e - f.a);
        r.max_k = std::max(r.max_k, f.e);
      }
    }
    narrow(r.total_k);
    r.q_off = grow(r.total_q * hq);
    r.kv_off = grow(r.total_k * hkv);
    r.lse_off = grow(r.total_q * hq);
    r.cu_q_off = grow(r.seqs + 1);
    r.cu_k_off = grow(r.seqs + 1);
    I32 *q = data.data() + r.q_off, *kv = data.data() + r.kv_off, *lse = data.data() + r.lse_off;
    I32 *cq = data.data() + r.cu_q_off, *ck = data.data() + r.cu_k_off;
    I64 t = 0, tk = 0;
    *cq++ = 0;
    *ck++ = 0;
    for (const libra::KernelCall& c : calls) {
      if (!mine(c)) continue;
      for (const libra::CallFragment& f : s.call_fragments(c)) {
        if (f.e <= f.a) continue;
        for (I64 i = 0; i < f.e - f.a; ++i, ++t) {
          const I64 v0 = c.q.offset + (f.q_row + i) * c.q.stride;
          narrow(v0 + hq);
          for (I64 h = 0; h < hq; ++h) {
            *q++ = static_cast<I32>(v0 + h);
            lse[h * r.total_q + t] = static_cast<I32>(v0 + h);  // head-major: flash-attn's LSE layout
          }
        }
        for (I64 j = 0; j < f.e; ++j) {
          const I64 v0 = c.kv.offset + (f.kv_row + j) * c.kv.stride;
          narrow(v0 + hkv);
          for (I64 g = 0; g < hkv; ++g) *kv++ = static_cast<I32>(v0 + g);
        }
        tk += f.e;
        *cq++ = static_cast<I32>(t);
        *ck++ = static_cast<I32>(tk);
      }
    }
    return r;
  }

  // descriptors.py's chunk_descriptors: one int64 row per non-empty fragment, grouped by PAIRS; the
  // table starts at an even int32 offset so that it views as int64.
  DescRec descriptors(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls) {
    std::vector<I64> rows;
    std::array<I64, 5> bounds{};
    for (int pair = 0; pair < 4; ++pair) {
      const bool qh = pair >= 2, kh = pair % 2 == 1;
      for (const libra::KernelCall& c : calls) {
        if (c.q_home != qh || c.kv_home != kh) continue;
        for (const libra::CallFragment& f : s.call_fragments(c)) {
          if (f.e <= f.a) continue;
          rows.insert(rows.end(), {c.q.offset, c.q.stride, c.kv.offset, c.kv.stride, f.q_row, f.kv_row, f.a, f.e,
                                   c.q.run, c.kv.run});
        }
      }
      bounds[static_cast<std::size_t>(pair) + 1] = static_cast<I64>(rows.size() / 10);
    }
    rows.insert(rows.end(), bounds.begin(), bounds.end());
    if (data.size() % 2) data.push_back(0);
    DescRec r;
    r.rows = bounds[4];
    r.table_off = grow(2 * static_cast<I64>(rows.size()));
    std::memcpy(data.data() + r.table_off, rows.data(), rows.size() * sizeof(I64));
    r.bounds_off = r.table_off + 20 * r.rows;
    return r;
  }
};

bool same_calls(const libra::RankSchedule& s, std::span<const libra::KernelCall> a,
                std::span<const libra::KernelCall> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const libra::KernelCall &x = a[i], &y = b[i];
    if (!(x.q == y.q && x.kv == y.kv && x.q_home == y.q_home && x.kv_home == y.kv_home)) return false;
    auto fx = s.call_fragments(x), fy = s.call_fragments(y);
    if (fx.size() != fy.size()) return false;
    for (std::size_t j = 0; j < fx.size(); ++j) {
      if (fx[j].q_row != fy[j].q_row || fx[j].kv_row != fy[j].kv_row || fx[j].a != fy[j].a || fx[j].e != fy[j].e) {
        return false;
      }
    }
  }
  return true;
}

// An upper bound on the int32 entries build() writes, so that the array is allocated once.
std::size_t capacity(const ProgramHandle& h) {
  std::size_t n = 0;
  auto moves = [&](const std::vector<libra::Move>& ms) {
    for (const libra::Move& m : ms) n += 2 * static_cast<std::size_t>(m.rows * m.run);
  };
  for (int p = 0; p < 2; ++p) {
    const libra::PassProgram& pp = h.program.pass(static_cast<libra::Pass>(p));
    for (const auto* xs : {&pp.in, &pp.out, &pp.stage}) {
      for (const libra::ExchangeProgram& x : *xs) {
        moves(x.gather);
        moves(x.local);
        moves(x.scatter);
      }
    }
    moves(pp.apply);
    for (int m = 0; m < h.schedule.chunks; ++m) {
      if (p == 1 && same_calls(h.schedule, h.schedule.calls(libra::Pass::kBackward, m),
                               h.schedule.calls(libra::Pass::kForward, m))) {
        continue;  // build() reuses forward's rows
      }
      n += 8 * (2 + 1 + 10) + 1;  // per pair: two cu_seqlens' leading 0; bounds; alignment
      for (const libra::KernelCall& c : h.schedule.calls(static_cast<libra::Pass>(p), m)) {
        for (const libra::CallFragment& f : h.schedule.call_fragments(c)) {
          if (f.e <= f.a) continue;
          n += static_cast<std::size_t>(2 * (f.e - f.a) * c.q.run + f.e * c.kv.run + 2 + 20);
        }
      }
    }
  }
  return n;
}

std::shared_ptr<IndexArrays> build(const ProgramHandle& h) {
  const double t0 = thread_seconds();
  auto ix = std::make_shared<IndexArrays>();
  ix->data.reserve(capacity(h));
  Builder b{ix->data};
  const libra::RankSchedule& s = h.schedule;
  for (int p = 0; p < 2; ++p) {
    const libra::PassProgram& pp = h.program.pass(static_cast<libra::Pass>(p));
    const std::vector<libra::ExchangeProgram>* kinds[3] = {&pp.in, &pp.out, &pp.stage};
    for (int k = 0; k < 3; ++k)
      for (const libra::ExchangeProgram& x : *kinds[k]) ix->exchanges[p][k].push_back(b.exchange(x));
    ix->apply[p] = b.groups(&pp, pp.apply);
    for (int m = 0; m < s.chunks; ++m) {
      auto calls = s.calls(static_cast<libra::Pass>(p), m);
      // Forward and backward run the same calls (same tiles, same buffers): one set of rows serves both.
      if (p == 1 && same_calls(s, calls, s.calls(libra::Pass::kForward, m))) {
        ix->varlen[p].push_back(ix->varlen[0][static_cast<std::size_t>(m)]);
        ix->descriptors[p].push_back(ix->descriptors[0][static_cast<std::size_t>(m)]);
        continue;
      }
      ix->varlen[p].push_back(b.varlen(s, calls));
      ix->descriptors[p].push_back(b.descriptors(s, calls));
    }
  }
  ix->build_seconds = thread_seconds() - t0;
  return ix;
}

py::tuple group_py(const GroupRec& g) {
  return py::make_tuple(libra::field_name(static_cast<libra::Field>(g.field)), g.src, g.dst, g.add, g.cls, g.s_off,
                        g.d_off, g.n, g.identity);
}

py::list groups_py(const std::vector<GroupRec>& gs) {
  py::list l;
  for (const GroupRec& g : gs) l.append(group_py(g));
  return l;
}

py::dict exchange_py(const ExchangeRec& x) {
  py::dict d;
  d["send"] = py::cast(x.send);
  d["recv"] = py::cast(x.recv);
  d["gather"] = groups_py(x.gather);
  d["local"] = groups_py(x.local);
  d["scatter"] = groups_py(x.scatter);
  return d;
}

py::dict pair_py(const PairRec& r) {
  py::dict d;
  d["q_home"] = r.q_home;
  d["kv_home"] = r.kv_home;
  d["hq"] = r.hq;
  d["hkv"] = r.hkv;
  d["seqs"] = r.seqs;
  d["total_q"] = r.total_q;
  d["total_k"] = r.total_k;
  d["max_q"] = r.max_q;
  d["max_k"] = r.max_k;
  d["q_off"] = r.q_off;
  d["kv_off"] = r.kv_off;
  d["lse_off"] = r.lse_off;
  d["cu_q_off"] = r.cu_q_off;
  d["cu_k_off"] = r.cu_k_off;
  return d;
}

}  // namespace

std::shared_ptr<const IndexArrays> index_arrays(ProgramHandle& h) {
  std::lock_guard<std::mutex> lock(*h.index_lock);
  if (!h.index) h.index = build(h);
  return h.index;
}

py::tuple index_arrays_py(std::shared_ptr<const IndexArrays> ix) {
  // The array shares ix's memory (the capsule keeps ix alive). Writable only so that torch.from_numpy
  // takes it without a warning: nothing writes it.
  auto* keep = new std::shared_ptr<const IndexArrays>(ix);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<const IndexArrays>*>(p); });
  py::array_t<std::int32_t> data({static_cast<py::ssize_t>(ix->data.size())}, {static_cast<py::ssize_t>(4)},
                                 const_cast<std::int32_t*>(ix->data.data()), owner);
  py::dict layout;
  static const char* kinds[3] = {"in", "out", "stage"};
  py::list passes;
  for (int p = 0; p < 2; ++p) {
    py::dict per;
    for (int k = 0; k < 3; ++k) {
      py::list chunks;
      for (const ExchangeRec& x : ix->exchanges[p][k]) chunks.append(exchange_py(x));
      per[kinds[k]] = chunks;
    }
    per["apply"] = groups_py(ix->apply[p]);
    py::list varlen, desc;
    for (const auto& chunk : ix->varlen[p]) {
      py::list pairs;
      for (const PairRec& r : chunk) pairs.append(pair_py(r));
      varlen.append(pairs);
    }
    for (const DescRec& d : ix->descriptors[p]) desc.append(py::make_tuple(d.table_off, d.rows, d.bounds_off));
    per["varlen"] = varlen;
    per["descriptors"] = desc;
    passes.append(per);
  }
  layout["passes"] = passes;
  layout["build_seconds"] = ix->build_seconds;
  return py::make_tuple(data, layout);
}

}  // namespace libra_py
