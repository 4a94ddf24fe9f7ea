// python/src/program_index.cpp: a rank program's index arrays for
// libra.torch (program_index.hpp), built once per micro-batch and worker in
// C++ without the GIL: every exchange's gather / local / scatter rows, every
// pass's apply rows, every chunk's merged varlen calls and its kernel
// descriptor table, all in one int64 array the runtime copies to the device
// at once and takes views of.
#include "program_index.hpp"

#include <algorithm>
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

struct Builder {
  std::vector<I64>& data;

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
    std::vector<std::vector<I64>> sidx, didx;
    for (const libra::Move& m : moves) {
      const int cls = libra::wire_class(m.field);
      const int src = pass ? kJoined : static_cast<int>(m.src);
      std::size_t g = 0;
      while (g < out.size() && !(out[g].field == static_cast<int>(m.field) && out[g].src == src &&
                                 out[g].dst == static_cast<int>(m.dst) && out[g].add == m.add)) {
        ++g;
      }
      if (g == out.size()) {
        out.push_back({static_cast<int>(m.field), src, static_cast<int>(m.dst), cls, m.add});
        sidx.emplace_back();
        didx.emplace_back();
      }
      I64 shift = 0;
      if (pass) {
        const auto c = static_cast<std::size_t>(cls);
        shift = m.src == libra::Loc::kWire ? base[static_cast<std::size_t>(m.chunk)][c] : total[c];
      }
      for (I64 i = 0; i < m.rows; ++i) {
        for (I64 j = 0; j < m.run; ++j) {
          sidx[g].push_back(shift + m.src_offset + i * m.src_stride + j);
          didx[g].push_back(m.dst_offset + i * m.dst_stride + j);
        }
      }
    }
    for (std::size_t g = 0; g < out.size(); ++g) {
      out[g].n = static_cast<I64>(sidx[g].size());
      out[g].s_off = append(sidx[g]);
      out[g].d_off = append(didx[g]);
    }
    return out;
  }

  I64 append(const std::vector<I64>& v) {
    const auto at = static_cast<I64>(data.size());
    data.insert(data.end(), v.begin(), v.end());
    return at;
  }

  // int32 values packed two to an int64 word (the runtime views them as int32).
  I64 append_i32(const std::vector<I64>& v) {
    const auto at = static_cast<I64>(data.size());
    data.resize(data.size() + (v.size() + 1) / 2, 0);
    auto* p = reinterpret_cast<std::int32_t*>(data.data() + at);
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i] > std::numeric_limits<std::int32_t>::max()) {
        throw std::overflow_error("index arrays: a varlen call's cu_seqlens pass 2^31 - 1 (" + std::to_string(v[i]) + ")");
      }
      p[i] = static_cast<std::int32_t>(v[i]);
    }
    return at;
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
    std::vector<I64> qv, kv, cu_q{0}, cu_k{0};
    for (const libra::KernelCall& c : calls) {
      if (c.q_home != qh || c.kv_home != kh || c.q.run != hq || c.kv.run != hkv) continue;
      for (const libra::CallFragment& f : s.call_fragments(c)) {
        if (f.e <= f.a) continue;
        const I64 nq = f.e - f.a, nk = f.e;
        for (I64 i = 0; i < nq; ++i)
          for (I64 h = 0; h < hq; ++h) qv.push_back(c.q.offset + (f.q_row + i) * c.q.stride + h);
        for (I64 j = 0; j < nk; ++j)
          for (I64 g = 0; g < hkv; ++g) kv.push_back(c.kv.offset + (f.kv_row + j) * c.kv.stride + g);
        cu_q.push_back(cu_q.back() + nq);
        cu_k.push_back(cu_k.back() + nk);
        r.max_q = std::max(r.max_q, nq);
        r.max_k = std::max(r.max_k, nk);
      }
    }
    r.seqs = static_cast<I64>(cu_q.size()) - 1;
    r.total_q = cu_q.back();
    r.total_k = cu_k.back();
    r.q_off = append(qv);
    r.kv_off = append(kv);
    r.lse_off = static_cast<I64>(data.size());
    for (I64 h = 0; h < hq; ++h)
      for (I64 t = 0; t < r.total_q; ++t) data.push_back(qv[static_cast<std::size_t>(t * hq + h)]);
    r.cu_q_off = append_i32(cu_q);
    r.cu_k_off = append_i32(cu_k);
    return r;
  }

  // descriptors.py's chunk_descriptors: one row per non-empty fragment, grouped by PAIRS.
  DescRec descriptors(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls) {
    DescRec r;
    r.table_off = static_cast<I64>(data.size());
    std::array<I64, 5> bounds{};
    for (int pair = 0; pair < 4; ++pair) {
      const bool qh = pair >= 2, kh = pair % 2 == 1;
      for (const libra::KernelCall& c : calls) {
        if (c.q_home != qh || c.kv_home != kh) continue;
        for (const libra::CallFragment& f : s.call_fragments(c)) {
          if (f.e <= f.a) continue;
          data.insert(data.end(), {c.q.offset, c.q.stride, c.kv.offset, c.kv.stride, f.q_row, f.kv_row, f.a, f.e,
                                   c.q.run, c.kv.run});
          ++r.rows;
        }
      }
      bounds[static_cast<std::size_t>(pair) + 1] = r.rows;
    }
    r.bounds_off = static_cast<I64>(data.size());
    data.insert(data.end(), bounds.begin(), bounds.end());
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

std::shared_ptr<IndexArrays> build(const ProgramHandle& h) {
  const double t0 = thread_seconds();
  auto ix = std::make_shared<IndexArrays>();
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
                        g.d_off, g.n);
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
  py::array_t<I64> data({static_cast<py::ssize_t>(ix->data.size())}, {static_cast<py::ssize_t>(8)},
                        const_cast<I64*>(ix->data.data()), owner);
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
