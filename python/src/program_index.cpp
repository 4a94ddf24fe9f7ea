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
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>

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
  IndexArrays& ix;
  I64 home_q = 0, home_kv = 0;  // the home buffers' vectors: where a joined buffer's compute vectors start
  std::vector<Run> runs;        // in rows order; data's columns at the end (finish)

  // Group sides already cut, by their runs' (count, base, len, stride): a group side whose runs equal
  // an earlier one's takes that side's cut and rows instead of its own (K's and V's groups move the
  // same positions, O's and LSE's too; at 1M two sides in three repeat one). Merged calls' rows are
  // not cut: they follow every group's, and the runtime views them by offset.
  std::unordered_map<std::string, std::pair<I64, I64>> seen;  // runs -> (cut, its first entry)

  // A group's side, the runs from index `from` on (its rows from entry `at`) complete: (its cut,
  // its first entry), an earlier identical side's (the runs just added dropped) or a new cut's;
  // (-1, at) where it has no entries.
  std::pair<I64, I64> group_side(std::size_t from, I64 at) {
    if (ix.rows == at) return {-1, at};
    std::string key;
    key.reserve((runs.size() - from) * 4 * sizeof(I32));
    for (std::size_t i = from; i < runs.size(); ++i) {
      const std::array<I32, 4> r{runs[i].count, runs[i].base, runs[i].len, runs[i].stride};
      key.append(reinterpret_cast<const char*>(r.data()), sizeof(r));
    }
    auto [it, fresh] = seen.try_emplace(std::move(key), static_cast<I64>(ix.cuts.size()), at);
    if (fresh) {
      ix.cuts.push_back(at);
    } else {
      runs.resize(from);
      ix.rows = at;
    }
    return it->second;
  }

  // n entries at the end of data; returns their offset (data may move: write through data after).
  I64 grow(I64 n) {
    const auto at = static_cast<I64>(ix.data.size());
    ix.data.resize(ix.data.size() + static_cast<std::size_t>(n));
    return at;
  }

  // A run of `rows` rows of `len` consecutive positions from base, rows `stride` apart, at the end of the
  // rows; returns its first entry. Every position it expands to is checked to fit int32.
  I64 run(I64 base, I64 rows, I64 len, I64 stride) {
    const I64 first = ix.rows;
    if (rows > 0 && len > 0) {
      narrow(base);
      narrow(base + (rows - 1) * stride + len - 1);
      narrow(first + rows * len);
      runs.push_back({static_cast<I32>(first), static_cast<I32>(rows * len), static_cast<I32>(base),
                         static_cast<I32>(len), static_cast<I32>(stride)});
      ix.rows += rows * len;
    }
    return first;
  }

  // Whether the runs from index `from` on expand to 0 .. n-1 (what lets the runtime take a slice).
  bool iota(std::size_t from) const {
    I64 at = 0;
    for (std::size_t i = from; i < runs.size(); ++i) {
      const Run& r = runs[i];
      if (r.base != at || (r.count > r.len && r.stride != r.len)) return false;
      at += r.count;
    }
    return true;
  }

  // Moves grouped by (field, src, dst, add) in move order (so the adds into one row keep the program's
  // order), each side one run per move. `pass` set: an apply list, whose wire sources are positions in
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
    std::vector<std::vector<std::size_t>> members;
    for (std::size_t i = 0; i < moves.size(); ++i) {  // each move's group, each group's size
      const libra::Move& m = moves[i];
      const int src = pass ? kJoined : static_cast<int>(m.src);
      std::size_t g = 0;
      while (g < out.size() && !(out[g].field == static_cast<int>(m.field) && out[g].src == src &&
                                 out[g].dst == static_cast<int>(m.dst) && out[g].add == m.add)) {
        ++g;
      }
      if (g == out.size()) {
        out.push_back({static_cast<int>(m.field), src, static_cast<int>(m.dst), libra::wire_class(m.field), m.add});
        members.emplace_back();
      }
      members[g].push_back(i);
      out[g].n += m.rows * m.run;
    }
    for (std::size_t g = 0; g < out.size(); ++g) {
      GroupRec& r = out[g];
      std::size_t from = runs.size();
      I64 at = ix.rows;
      for (std::size_t i : members[g]) {
        const libra::Move& m = moves[i];
        I64 shift = 0;
        if (pass) {
          const auto c = static_cast<std::size_t>(r.cls);
          shift = m.src == libra::Loc::kWire ? base[static_cast<std::size_t>(m.chunk)][c] : total[c];
        }
        run(shift + m.src_offset, m.rows, m.run, m.src_stride);
      }
      const bool s_iota = iota(from);
      std::tie(r.s_cut, r.s_off) = group_side(from, at);
      from = runs.size();
      at = ix.rows;
      for (std::size_t i : members[g]) {
        const libra::Move& m = moves[i];
        run(m.dst_offset, m.rows, m.run, m.dst_stride);
      }
      const bool d_iota = iota(from);
      std::tie(r.d_cut, r.d_off) = group_side(from, at);
      r.identity = (s_iota ? 1 : 0) | (d_iota ? 2 : 0);
    }
    return out;
  }

  // Each distinct per-peer count vector's index in ix.counts (found here, without the GIL: the
  // layout's Python lists are then made once each, with no comparison of vectors under the GIL).
  std::map<std::vector<I64>, std::size_t> count_at;

  std::size_t counts(const std::vector<I64>& v) {
    auto [it, fresh] = count_at.try_emplace(v, ix.counts.size());
    if (fresh) ix.counts.push_back(v);
    return it->second;
  }

  ExchangeRec exchange(const libra::ExchangeProgram& x) {
    ExchangeRec r;
    for (std::size_t c = 0; c < libra::kNumWireClasses; ++c) {
      r.send[c] = counts(x.send_vectors[c]);
      r.recv[c] = counts(x.recv_vectors[c]);
    }
    r.gather = groups(nullptr, x.gather);
    r.local = groups(nullptr, x.local);
    r.scatter = groups(nullptr, x.scatter);
    return r;
  }

  // The calls of one chunk merged per (q_home, kv_home, q heads, kv heads), in descriptors.py's PAIRS
  // order, then by widths in order of first appearance; empty fragments (a >= e) are left out.
  // Positions are in joined buffers (a field's home vectors, then its compute vectors: function.py),
  // every pair's q rows before every pair's kv rows, so that consecutive pairs of the same widths
  // are also one call (`joined`: their rows are contiguous, their cu_seqlens concatenated).
  void varlen(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls, std::vector<PairRec>& pairs,
              std::vector<PairRec>& joined) {
    for (int pair = 0; pair < 4; ++pair) {
      const bool qh = pair >= 2, kh = pair % 2 == 1;
      std::vector<std::pair<I64, I64>> widths;
      for (const libra::KernelCall& c : calls) {
        if (c.q_home != qh || c.kv_home != kh) continue;
        const std::pair<I64, I64> w{c.q.run, c.kv.run};
        if (std::find(widths.begin(), widths.end(), w) == widths.end()) widths.push_back(w);
      }
      for (const auto& [hq, hkv] : widths) pairs.push_back(PairRec{qh, kh, hq, hkv});
    }
    std::vector<std::vector<I32>> cq(pairs.size()), ck(pairs.size());
    for (int side = 0; side < 2; ++side) {
      for (std::size_t i = 0; i < pairs.size(); ++i) {
        if (side == 0) {
          rows_of(s, calls, pairs[i], cq[i], ck[i]);
        } else {
          kv_rows_of(s, calls, pairs[i]);
        }
      }
    }
    for (std::size_t i = 0; i < pairs.size(); ++i) put_cu(pairs[i], cq[i], ck[i]);
    for (std::size_t i = 0; i < pairs.size();) {  // runs of consecutive pairs with the same widths
      std::size_t j = i;
      PairRec r{true, true, pairs[i].hq, pairs[i].hkv};
      r.q_off = pairs[i].q_off;
      r.kv_off = pairs[i].kv_off;
      std::vector<I32> jq{0}, jk{0};
      for (; j < pairs.size() && pairs[j].hq == r.hq && pairs[j].hkv == r.hkv; ++j) {
        for (std::size_t x = 1; x < cq[j].size(); ++x) {
          jq.push_back(narrow(r.total_q + cq[j][x]));
          jk.push_back(narrow(r.total_k + ck[j][x]));
        }
        r.seqs += pairs[j].seqs;
        r.total_q += pairs[j].total_q;
        r.total_k += pairs[j].total_k;
        r.max_q = std::max(r.max_q, pairs[j].max_q);
        r.max_k = std::max(r.max_k, pairs[j].max_k);
      }
      put_cu(r, jq, jk);
      joined.push_back(r);
      i = j;
    }
  }

  void put_cu(PairRec& r, const std::vector<I32>& cq, const std::vector<I32>& ck) {
    r.cu_q_off = grow(static_cast<I64>(cq.size()));
    r.cu_k_off = grow(static_cast<I64>(ck.size()));
    std::copy(cq.begin(), cq.end(), ix.data.begin() + r.cu_q_off);
    std::copy(ck.begin(), ck.end(), ix.data.begin() + r.cu_k_off);
  }

  bool mine(const libra::KernelCall& c, const PairRec& r) const {
    return c.q_home == r.q_home && c.kv_home == r.kv_home && c.q.run == r.hq && c.kv.run == r.hkv;
  }

  // r's q rows (joined positions), sizes and cu_seqlens.
  void rows_of(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls, PairRec& r, std::vector<I32>& cq,
               std::vector<I32>& ck) {
    const I64 shift = r.q_home ? 0 : home_q;
    cq = {0};
    ck = {0};
    r.q_off = ix.rows;
    for (const libra::KernelCall& c : calls) {
      if (!mine(c, r)) continue;
      for (const libra::CallFragment& f : s.call_fragments(c)) {
        if (f.e <= f.a) continue;
        run(shift + c.q.offset + f.q_row * c.q.stride, f.e - f.a, r.hq, c.q.stride);
        ++r.seqs;
        r.total_q += f.e - f.a;
        r.total_k += f.e;
        r.max_q = std::max(r.max_q, f.e - f.a);
        r.max_k = std::max(r.max_k, f.e);
        cq.push_back(narrow(r.total_q));
        ck.push_back(narrow(r.total_k));
      }
    }
  }

  // r's kv rows (joined positions).
  void kv_rows_of(const libra::RankSchedule& s, std::span<const libra::KernelCall> calls, PairRec& r) {
    const I64 shift = r.kv_home ? 0 : home_kv;
    r.kv_off = ix.rows;
    for (const libra::KernelCall& c : calls) {
      if (!mine(c, r)) continue;
      for (const libra::CallFragment& f : s.call_fragments(c)) {
        if (f.e > f.a) run(shift + c.kv.offset + f.kv_row * c.kv.stride, f.e, r.hkv, c.kv.stride);
      }
    }
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
    if (ix.data.size() % 2) ix.data.push_back(0);
    DescRec r;
    r.rows = bounds[4];
    r.table_off = grow(2 * static_cast<I64>(rows.size()));
    std::memcpy(ix.data.data() + r.table_off, rows.data(), rows.size() * sizeof(I64));
    r.bounds_off = r.table_off + 20 * r.rows;
    return r;
  }

  // The runs as five columns after the small array (what the device's expansion reads).
  void finish() {
    ix.small = static_cast<I64>(ix.data.size());
    ix.runs = static_cast<I64>(runs.size());
    ix.data.resize(ix.data.size() + 5 * runs.size());
    std::int32_t* col = ix.data.data() + ix.small;
    const std::size_t n = runs.size();
    for (std::size_t i = 0; i < n; ++i) {
      col[i] = runs[i].first;
      col[n + i] = runs[i].count;
      col[2 * n + i] = runs[i].base;
      col[3 * n + i] = runs[i].len;
      col[4 * n + i] = runs[i].stride;
    }
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
  Builder b{*ix, h.schedule.home_vectors(libra::Field::kQ), h.schedule.home_vectors(libra::Field::kK), {}, {}, {}};
  const libra::RankSchedule& s = h.schedule;
  for (int p = 0; p < 2; ++p) {
    const libra::PassProgram& pp = h.program.pass(static_cast<libra::Pass>(p));
    const std::vector<libra::ExchangeProgram>* kinds[3] = {&pp.in, &pp.out, &pp.stage};
    for (int k = 0; k < 3; ++k)
      for (const libra::ExchangeProgram& x : *kinds[k]) ix->exchanges[p][k].push_back(b.exchange(x));
    ix->apply[p] = b.groups(&pp, pp.apply);
  }
  // Every merged call's rows after every group's, as one last piece of the cuts (no record takes it:
  // a Pair views its rows by offset), so that the split makes one view per group side only.
  const I64 calls_from = ix->rows;
  for (int p = 0; p < 2; ++p) {
    for (int m = 0; m < s.chunks; ++m) {
      auto calls = s.calls(static_cast<libra::Pass>(p), m);
      // Forward and backward run the same calls (same tiles, same buffers): one set of rows serves both.
      if (p == 1) ix->shared.push_back(same_calls(s, calls, s.calls(libra::Pass::kForward, m)));
      if (p == 1 && ix->shared.back()) {
        ix->varlen[p].push_back(ix->varlen[0][static_cast<std::size_t>(m)]);
        ix->joined[p].push_back(ix->joined[0][static_cast<std::size_t>(m)]);
        ix->descriptors[p].push_back(ix->descriptors[0][static_cast<std::size_t>(m)]);
        continue;
      }
      b.varlen(s, calls, ix->varlen[p].emplace_back(), ix->joined[p].emplace_back());
      ix->descriptors[p].push_back(b.descriptors(s, calls));
    }
  }
  if (ix->rows > calls_from) ix->cuts.push_back(calls_from);
  b.finish();
  ix->build_seconds = thread_seconds() - t0;
  return ix;
}

// The fields' names and the layout's dict keys as Python strings, made once (a group's tuple takes
// its field's name and a dict its keys, not strings of their own: a string made per insertion was a
// good part of the layout to Python) and never freed (no Python object released after the
// interpreter ends).
using FieldNames = std::array<py::str, libra::kNumFields>;

struct Keys {
  FieldNames fields;
  py::str send{"send"}, recv{"recv"}, gather{"gather"}, local{"local"}, scatter{"scatter"};
  std::array<py::str, 3> exchange_kinds{py::str("in"), py::str("out"), py::str("stage")};
  py::str apply{"apply"}, varlen{"varlen"}, joined{"joined"}, descriptors{"descriptors"};
  py::str passes{"passes"}, rows{"rows"}, data{"data"}, runs{"runs"}, cuts{"cuts"}, lengths{"lengths"};
  py::str build_seconds{"build_seconds"};
  // pair_py's keys, in its order.
  std::array<py::str, 13> pair{py::str("q_home"), py::str("kv_home"), py::str("hq"), py::str("hkv"),
                               py::str("seqs"), py::str("total_q"), py::str("total_k"), py::str("max_q"),
                               py::str("max_k"), py::str("q_off"), py::str("kv_off"), py::str("cu_q_off"),
                               py::str("cu_k_off")};

  Keys() {
    for (int f = 0; f < libra::kNumFields; ++f) {
      fields[static_cast<std::size_t>(f)] = py::str(libra::field_name(static_cast<libra::Field>(f)));
    }
  }
};

// Call with the GIL held.
const Keys& keys() {
  static const Keys* const k = new Keys();
  return *k;
}

// (field name, src, dst, add, class, source offset, destination offset, n, identity, source cut,
// destination cut): filled in place (py::make_tuple's casts per item took twice as long).
py::tuple group_py(const GroupRec& g, const FieldNames& names) {
  const std::array<I64, 10> ints{g.src, g.dst, 0, g.cls, g.s_off, g.d_off, g.n, g.identity, g.s_cut, g.d_cut};
  py::tuple t(ints.size() + 1);
  PyObject* o = t.ptr();
  PyTuple_SET_ITEM(o, 0, names[static_cast<std::size_t>(g.field)].inc_ref().ptr());
  for (std::size_t i = 0; i < ints.size(); ++i) {
    PyObject* v = i == 2 ? PyBool_FromLong(g.add ? 1 : 0) : PyLong_FromLongLong(ints[i]);
    if (v == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(o, static_cast<py::ssize_t>(i) + 1, v);
  }
  return t;
}

py::list groups_py(const std::vector<GroupRec>& gs, const FieldNames& names) {
  py::list l(gs.size());
  for (std::size_t i = 0; i < gs.size(); ++i) l[i] = group_py(gs[i], names);
  return l;
}

// Per class the vectors sent to (received from) each peer: the layout's list of each distinct count
// vector (`lists`, made once per layout: at 1M 49 lists of 64 ints are 9), a fraction of the Python
// objects one list each takes (nothing writes them).
py::list counts_py(const std::array<std::size_t, libra::kNumWireClasses>& at, const std::vector<py::list>& lists) {
  py::list out(at.size());
  for (std::size_t c = 0; c < at.size(); ++c) out[c] = lists[at[c]];
  return out;
}

py::dict exchange_py(const ExchangeRec& x, const std::vector<py::list>& lists, const Keys& k) {
  py::dict d;
  d[k.send] = counts_py(x.send, lists);
  d[k.recv] = counts_py(x.recv, lists);
  d[k.gather] = groups_py(x.gather, k.fields);
  d[k.local] = groups_py(x.local, k.fields);
  d[k.scatter] = groups_py(x.scatter, k.fields);
  return d;
}

py::dict pair_py(const PairRec& r, const Keys& k) {
  const std::array<py::object, 13> values{py::bool_(r.q_home), py::bool_(r.kv_home), py::int_(r.hq),
                                          py::int_(r.hkv),      py::int_(r.seqs),     py::int_(r.total_q),
                                          py::int_(r.total_k),  py::int_(r.max_q),    py::int_(r.max_k),
                                          py::int_(r.q_off),    py::int_(r.kv_off),   py::int_(r.cu_q_off),
                                          py::int_(r.cu_k_off)};
  py::dict d;
  for (std::size_t i = 0; i < values.size(); ++i) d[k.pair[i]] = values[i];
  return d;
}

}  // namespace

namespace {

// A numpy view of v, kept alive by `owner` (a capsule holding v's owner). Writable only so that
// torch.from_numpy takes it without a warning (as index_arrays_py's): nothing in libra writes it.
template <class T>
py::array_t<T> view_of(const std::vector<T>& v, const py::capsule& owner) {
  return py::array_t<T>({static_cast<py::ssize_t>(v.size())}, {static_cast<py::ssize_t>(sizeof(T))},
                        const_cast<T*>(v.data()), owner);
}

}  // namespace

py::dict home_py(const ProgramHandle& h) {
  auto* keep = new std::shared_ptr<const HomeArrays>(h.home);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<const HomeArrays>*>(p); });
  const HomeArrays& a = *h.home;
  return fields({{"home_layout", py::str(a.rows.layout)}, {"home_rows", py::int_(a.rows.rows)},
                 {"home_tokens", py::int_(a.rows.tokens)}, {"max_seqlen", py::int_(a.rows.max_seqlen)},
                 {"packed_rows", view_of(a.rows.packed, owner)}, {"position_ids", view_of(a.rows.position, owner)},
                 {"cu_seqlens", view_of(a.cu, owner)}, {"packed_cu_seqlens", view_of(a.packed_cu, owner)}});
}

void expand_runs(const std::int32_t* cols, I64 runs, std::int32_t* out, I64 n) {
  const std::int32_t *first = cols, *count = cols + runs, *base = cols + 2 * runs, *len = cols + 3 * runs,
                     *stride = cols + 4 * runs;
  I64 at = 0;
  for (I64 i = 0; i < runs; ++i) {
    const I64 c = count[i], l = len[i], b = base[i], st = stride[i];
    const I64 last = c > 0 && l > 0 ? b + (c - 1) / l * st + (c - 1) % l : -1;
    if (first[i] != at || c <= 0 || l <= 0 || at + c > n || b < 0 || last < 0 ||
        last > std::numeric_limits<I32>::max()) {
      throw std::invalid_argument("expand_runs: run " + std::to_string(i) + " (first " + std::to_string(first[i]) +
                                  ", count " + std::to_string(c) + ", base " + std::to_string(b) + ", len " +
                                  std::to_string(l) + ", stride " + std::to_string(st) +
                                  "): the runs must tile [0, " + std::to_string(n) +
                                  ") in order, count and len > 0, positions in [0, 2^31)");
    }
    std::int32_t* o = out + at;
    for (I64 row = 0, k = 0; k < c; ++row) {  // a run's rows: len consecutive positions, stride apart
      const I64 end = std::min(c, k + l);
      const I64 start = b + row * st - k;
      for (; k < end; ++k) o[k] = static_cast<I32>(start + k);
    }
    at += c;
  }
  if (at != n) {
    throw std::invalid_argument("expand_runs: the runs cover " + std::to_string(at) + " rows, not " +
                                std::to_string(n));
  }
}

std::shared_ptr<const IndexArrays> index_arrays(ProgramHandle& h) {
  std::lock_guard<std::mutex> lock(*h.index_lock);
  if (!h.index) h.index = build(h);
  return h.index;
}

std::shared_ptr<const IndexArrays> built_index(ProgramHandle& h) {
  std::unique_lock<std::mutex> lock(*h.index_lock, std::try_to_lock);
  return lock.owns_lock() ? h.index : nullptr;
}

py::tuple index_arrays_py(std::shared_ptr<const IndexArrays> ix, unsigned kinds) {
  // The arrays share ix's memory (the capsule keeps ix alive). Writable only so that torch.from_numpy
  // takes them without a warning: nothing writes them.
  auto* keep = new std::shared_ptr<const IndexArrays>(ix);
  py::capsule owner(keep, [](void* p) { delete static_cast<std::shared_ptr<const IndexArrays>*>(p); });
  auto* cols = const_cast<std::int32_t*>(ix->data.data()) + ix->small;
  py::array_t<std::int32_t> runs({static_cast<py::ssize_t>(ix->runs), static_cast<py::ssize_t>(5)},
                                 {static_cast<py::ssize_t>(4), static_cast<py::ssize_t>(4 * ix->runs)}, cols, owner);
  py::array_t<std::int32_t> data({static_cast<py::ssize_t>(ix->data.size())}, {static_cast<py::ssize_t>(4)},
                                 const_cast<std::int32_t*>(ix->data.data()), owner);
  py::dict layout;
  const Keys& key = keys();
  std::vector<py::list> lists;
  lists.reserve(ix->counts.size());
  for (const std::vector<I64>& v : ix->counts) lists.push_back(py::cast(v));
  py::list passes;
  for (int p = 0; p < 2; ++p) {
    py::dict per;
    for (int k = 0; k < 3; ++k) {
      py::list chunks;
      for (const ExchangeRec& x : ix->exchanges[p][k]) chunks.append(exchange_py(x, lists, key));
      per[key.exchange_kinds[static_cast<std::size_t>(k)]] = chunks;
    }
    per[key.apply] = groups_py(ix->apply[p], key.fields);
    // The merged calls' records a kind of backend reads (kinds' bits: varlen, joined, descriptors);
    // the others are left out (index.py asks for them if it ever reads them).
    const std::array<std::pair<const py::str*, const std::vector<std::vector<PairRec>>*>, 2> pair_kinds{
        {{&key.varlen, &ix->varlen[p]}, {&key.joined, &ix->joined[p]}}};
    for (std::size_t k = 0; k < pair_kinds.size(); ++k) {
      if (!(kinds & (1U << k))) continue;
      const auto& [name, recs] = pair_kinds[k];
      py::list chunks;
      for (std::size_t m = 0; m < recs->size(); ++m) {
        // A backward chunk with forward's calls gets forward's very records (one Pair each on the device).
        if (p == 1 && ix->shared[m]) {
          chunks.append(passes[0][*name][py::int_(m)]);
          continue;
        }
        py::list pairs;
        for (const PairRec& r : (*recs)[m]) pairs.append(pair_py(r, key));
        chunks.append(pairs);
      }
      per[*name] = chunks;
    }
    if (kinds & 4U) {
      py::list desc;
      for (const DescRec& d : ix->descriptors[p]) desc.append(py::make_tuple(d.table_off, d.rows, d.bounds_off));
      per[key.descriptors] = desc;
    }
    passes.append(per);
  }
  layout[key.passes] = passes;
  layout[key.rows] = ix->rows;
  layout[key.data] = ix->small;
  layout[key.runs] = ix->runs;
  std::vector<I64> lengths(ix->cuts.size());
  for (std::size_t i = 0; i < ix->cuts.size(); ++i) {
    lengths[i] = (i + 1 < ix->cuts.size() ? ix->cuts[i + 1] : ix->rows) - ix->cuts[i];
  }
  layout[key.cuts] = py::cast(ix->cuts);
  layout[key.lengths] = py::cast(lengths);
  layout[key.build_seconds] = ix->build_seconds;
  return py::make_tuple(runs, data, layout);
}

}  // namespace libra_py
