// python/src/module.cpp: `libra._libra`, the torch-free Python binding of
// libra's corpus readers, sequence placement, planner, plan files,
// simulator and CPU attention kernel.
//
// Every libra Error becomes a Python exception carrying the same one-line
// message (ValueError for bad input and mismatches, OSError for I/O,
// RuntimeError for a libra bug). Planning, simulation, plan files and kernel
// calls release the GIL, so a background planning thread and the training
// thread run at once. The Python package (python/libra) wraps this module;
// users import `libra`, not `_libra`.
//
//   import libra
//   plan = libra.make_plan([[3, 5], [8]], seq_len=8, cp=2, block_size=2, head_shards=2,
//                          heads_q=4, heads_kv=2, head_dim=16)
//   plan.fingerprint, plan.tiles["worker"], plan.byte_matrix
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "libra/corpus.hpp"
#include "libra/kernel.hpp"
#include "libra/packing.hpp"
#include "libra/placement.hpp"
#include "libra/plan.hpp"
#include "libra/program.hpp"
#include "libra/sampler.hpp"
#include "libra/schedule.hpp"
#include "libra/simulator.hpp"
#include "libra/status.hpp"
#include "libra/workload.hpp"

namespace py = pybind11;
using I64 = std::int64_t;

namespace {

// The core's messages name CLI flags (`--pool-size 2: must divide --gbs 3`); from Python they name
// the Python arguments (`pool_size 2: must divide gbs 3`). Translated here, once, for every call.
std::string python_names(const std::string& m) {
  std::string out;
  out.reserve(m.size());
  for (std::size_t i = 0; i < m.size();) {
    // A flag starts the message or follows a space, bracket or quote; `--` inside a path stays.
    const bool at_word = i == 0 || (m[i - 1] != '\0' && std::strchr(" ([`'\"", m[i - 1]) != nullptr);
    if (at_word && m.compare(i, 2, "--") == 0 && i + 2 < m.size() && std::islower(static_cast<unsigned char>(m[i + 2]))) {
      std::size_t j = i + 2;
      while (j < m.size() && (std::islower(static_cast<unsigned char>(m[j])) || std::isdigit(static_cast<unsigned char>(m[j])) || m[j] == '-')) ++j;
      std::string name = m.substr(i + 2, j - i - 2);
      if (name == "block") name = "block_size";  // `libra plan --block` is make_plan's block_size
      std::replace(name.begin(), name.end(), '-', '_');
      out += name;
      i = j;
    } else {
      out += m[i++];
    }
  }
  return out;
}

[[noreturn]] void raise(const libra::Error& e) {
  PyObject* type = PyExc_ValueError;
  if (e.code() == libra::ErrorCode::kIo) type = PyExc_OSError;
  if (e.code() == libra::ErrorCode::kInternal) type = PyExc_RuntimeError;
  PyErr_SetString(type, python_names(e.message()).c_str());
  throw py::error_already_set();
}

template <class T>
T unwrap(libra::Result<T>&& r) {
  if (!r.ok()) raise(r.error());
  return std::move(r).value();
}

void check(const libra::Status& s) {
  if (!s.ok()) raise(s.error());
}

[[noreturn]] void bad(const std::string& message) { throw py::value_error(message); }

// A read-only int64 array that owns a copy of `values`, shaped rows x cols
// (cols = 0: one dimension).
py::array_t<I64> int_array(std::vector<I64> values, I64 cols = 0) {
  auto* owned = new std::vector<I64>(std::move(values));
  py::capsule free_it(owned, [](void* p) { delete static_cast<std::vector<I64>*>(p); });
  std::vector<py::ssize_t> shape, strides;
  const auto n = static_cast<py::ssize_t>(owned->size());
  if (cols > 0) {
    shape = {n / cols, static_cast<py::ssize_t>(cols)};
    strides = {static_cast<py::ssize_t>(cols * 8), 8};
  } else {
    shape = {n};
    strides = {8};
  }
  py::array_t<I64> a(shape, strides, owned->data(), free_it);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// A table: a dict of read-only int64 columns of equal length.
using Columns = std::vector<std::pair<const char*, std::vector<I64>>>;
py::dict table(Columns cols) {
  py::dict d;
  for (auto& [name, values] : cols) d[name] = int_array(std::move(values));
  return d;
}

std::vector<libra::PackedSequence> to_sequences(const py::handle& obj, const char* what) {
  std::vector<libra::PackedSequence> out;
  try {
    out = obj.cast<std::vector<libra::PackedSequence>>();
  } catch (const py::cast_error&) {
    bad(std::string(what) + ": must be a list of packed sequences (lists of positive integer sample lengths)");
  }
  // pybind11 reads True as 1: a bool among the lengths is a caller's bug, not a sample of one token.
  std::size_t i = 0;
  for (py::handle seq : obj) {
    std::size_t j = 0;
    for (py::handle x : seq) {
      if (PyBool_Check(x.ptr())) {
        bad(std::string(what) + "[" + std::to_string(i) + "][" + std::to_string(j) + "] " +
            std::string(py::str(x)) + ": is a bool, not a sample length");
      }
      ++j;
    }
    ++i;
  }
  return out;
}

py::dict distribution(const libra::Distribution& d) {
  py::dict o;
  o["count"] = d.count;
  o["mean"] = d.mean;
  o["median"] = d.median;
  o["p90"] = d.p90;
  o["p99"] = d.p99;
  o["max"] = d.max;
  o["cv"] = d.cv;
  return o;
}

libra::PlacementMode placement_mode(const std::string& mode) { return unwrap(libra::parse_placement_mode(mode)); }

py::dict window_dict(const libra::WindowPlacement& w) {
  py::dict o;
  py::list pools;
  for (const auto& p : w.pools) pools.append(py::cast(p));
  o["pools"] = pools;
  o["loads"] = int_array(w.loads);
  o["imbalance"] = w.imbalance;
  // vrsp-elastic: pool indices fused into one TAP domain (unfused pools are domains of one).
  py::list domains;
  for (const auto& d : w.domains) domains.append(py::cast(d));
  o["domains"] = domains;
  o["pool_imbalance"] = w.pool_imbalance;
  return o;
}

libra::PlacementOptions placement_options(I64 pool_size, const std::string& mode, std::uint64_t seed, I64 dp,
                                          I64 elastic_k, double elastic_threshold, const std::string& elastic_rule) {
  libra::PlacementOptions o{.pool_size = pool_size, .mode = placement_mode(mode), .seed = seed, .dp = dp};
  o.elastic = {.max_pools = elastic_k, .threshold = elastic_threshold,
               .rule = unwrap(libra::parse_elastic_rule(elastic_rule))};
  return o;
}

// ---- plans

const char* kTileColumns[] = {"id",    "slot",  "block", "shard",  "piece",          "begin",       "end",
                              "heads_begin", "heads_end", "kv_heads_begin", "kv_heads_end", "flops",
                              "home", "worker", "fragment_begin", "fragment_end"};

py::dict tiles_table(const libra::Plan& plan) {
  Columns c;
  for (const char* n : kTileColumns) c.emplace_back(n, std::vector<I64>{});
  for (const libra::Tile& t : plan.tiles()) {
    const I64 v[] = {t.id,         t.slot,     t.block,          t.shard,        t.piece, t.begin,
                     t.end,        t.heads.begin, t.heads.end,   t.kv_heads.begin, t.kv_heads.end,
                     t.flops,      t.home,     t.worker,         t.fragment_begin, t.fragment_end};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

py::dict fragments_table(const libra::Plan& plan) {
  Columns c = {{"tile", {}}, {"slot", {}}, {"sample", {}}, {"group", {}}, {"sample_start", {}},
               {"sample_length", {}}, {"a", {}}, {"e", {}}, {"key_begin", {}}};
  for (const libra::Fragment& f : plan.fragments()) {
    const I64 v[] = {f.tile, f.slot, f.sample, f.group, f.sample_start, f.sample_length, f.a, f.e, f.key_begin};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

py::dict groups_table(const libra::Plan& plan) {
  Columns c = {{"slot", {}}, {"sample", {}}, {"key", {}}, {"kv_heads_begin", {}}, {"kv_heads_end", {}},
               {"begin", {}}, {"end", {}}};
  for (const libra::KvGroup& g : plan.groups()) {
    const I64 v[] = {g.slot, g.sample, g.key, g.kv_heads.begin, g.kv_heads.end, g.begin, g.end};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

py::dict transfers_table(std::span<const libra::Transfer> xs) {
  Columns c = {{"kind", {}}, {"src", {}}, {"dst", {}}, {"slot", {}}, {"begin", {}}, {"end", {}},
               {"heads_begin", {}}, {"heads_end", {}}, {"tile", {}}, {"group", {}}, {"bytes", {}}};
  for (const libra::Transfer& x : xs) {
    const I64 v[] = {static_cast<I64>(x.kind), x.src, x.dst, x.slot, x.begin, x.end, x.heads.begin,
                     x.heads.end, x.tile, x.group, x.bytes};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

std::string dtype_of(const libra::PlanConfig& c) { return libra::dtype_name(c.shape.dtype); }

py::dict config_dict(const libra::Plan& plan) {
  const libra::PlanConfig& c = plan.config();
  py::dict o;
  o["seq_len"] = c.seq_len;
  o["cp"] = c.cp;
  o["block_size"] = c.block_size;
  o["head_shards"] = c.head_shards;
  o["heads_q"] = c.shape.heads_q;
  o["heads_kv"] = c.shape.heads_kv;
  o["head_dim"] = c.shape.head_dim;
  o["dtype"] = dtype_of(c);
  o["window"] = c.shape.window == libra::kFullCausal ? py::object(py::none()) : py::object(py::int_(c.shape.window));
  o["tau"] = c.tau;
  o["chunks"] = c.chunks;
  o["mode"] = std::string(libra::plan_mode_name(c.mode));
  o["dedup_per_kv_head"] = c.dedup_per_kv_head;
  o["home_layout"] = std::string(libra::home_layout_name(c.home_layout));
  return o;
}

// Worker r's home rows as a data pipeline sees them (HomeMap): the packed
// row of each home row, its sample (-1 on padding) and position in it
// (padding counts on from 0 at the first padding row, as one more sample),
// and flash-attn cu_seqlens over the token rows: a segment per run of one
// sample's consecutive packed rows.
py::dict home_layout_dict(const libra::Plan& plan, int r) {
  const libra::PlanConfig& c = plan.config();
  const libra::HomeMap map = c.home_map();
  const libra::PackedSequence& seq = plan.pool()[static_cast<std::size_t>(r / c.cp)];
  std::vector<I64> starts;
  I64 tokens = 0;
  for (I64 l : seq) {
    starts.push_back(tokens);
    tokens += l;
  }
  const I64 rows = map.rows();
  std::vector<I64> packed(static_cast<std::size_t>(rows)), sample(packed.size()), position(packed.size()), cu = {0};
  I64 home_tokens = 0;
  for (I64 i = 0; i < rows; ++i) {
    const I64 x = map.packed_row(r % c.cp, i);
    packed[static_cast<std::size_t>(i)] = x;
    if (x >= tokens) {
      sample[static_cast<std::size_t>(i)] = -1;
      position[static_cast<std::size_t>(i)] = x - tokens;
      continue;
    }
    const auto j = static_cast<I64>(std::upper_bound(starts.begin(), starts.end(), x) - starts.begin()) - 1;
    sample[static_cast<std::size_t>(i)] = j;
    position[static_cast<std::size_t>(i)] = x - starts[static_cast<std::size_t>(j)];
    // Padding is a suffix of every home, so token rows are [0, home_tokens).
    if (i > 0 && (sample[static_cast<std::size_t>(i - 1)] != j || packed[static_cast<std::size_t>(i - 1)] != x - 1)) {
      cu.push_back(i);
    }
    home_tokens = i + 1;
  }
  if (home_tokens > 0) cu.push_back(home_tokens);
  py::dict o;
  o["home_layout"] = std::string(libra::home_layout_name(c.home_layout));
  o["home_rows"] = rows;
  o["home_tokens"] = home_tokens;
  o["packed_rows"] = int_array(std::move(packed));
  o["sample"] = int_array(std::move(sample));
  o["position_ids"] = int_array(std::move(position));
  o["cu_seqlens"] = int_array(std::move(cu));
  return o;
}

void check_worker(const libra::Plan& p, int r, const char* what) {
  if (r < 0 || r >= p.num_workers()) {
    bad(std::string(what) + " " + std::to_string(r) + ": must be in [0, " + std::to_string(p.num_workers()) + ")");
  }
}

void check_chunk(const libra::Plan& p, int m) {
  if (m < 0 || m >= p.config().chunks) {
    bad("chunk " + std::to_string(m) + ": must be in [0, " + std::to_string(p.config().chunks) + ")");
  }
}

libra::Plan plan_from_bytes(const py::bytes& b, const std::string& source) {
  std::string bytes = b;
  libra::Result<libra::Plan> r = [&] {
    py::gil_scoped_release release;
    return libra::plan_from_binary(bytes, source);
  }();
  return unwrap(std::move(r));
}

// ---- kernel views: (data_ptr, dtype, rows, heads, head_dim, row_stride)

using View = std::tuple<std::uintptr_t, std::string, I64, I64, I64, I64>;

libra::kernel::DType kernel_dtype(const std::string& name) {
  if (name == "fp32") return libra::kernel::DType::kF32;
  if (name == "bf16") return libra::kernel::DType::kBF16;
  bad("kernel dtype " + name + ": must be fp32 or bf16");
}

// The kernel reads softmax_scale 0 as "1 / sqrt(head_dim)"; here None says that, and a real 0 (legal
// math: uniform attention) is refused rather than silently replaced (libra.torch.attention honours 0
// without calling the kernel with it).
float kernel_scale(std::optional<float> s) {
  if (!s) return 0.0f;
  if (*s == 0.0f || !std::isfinite(*s)) {
    bad("kernel softmax_scale " + std::string(py::str(py::float_(*s))) +
        ": must be finite and nonzero (None for 1/sqrt(head_dim))");
  }
  return *s;
}

libra::kernel::Tensor view(const View& v) {
  const auto& [ptr, dtype, rows, heads, head_dim, stride] = v;
  return {reinterpret_cast<void*>(ptr), kernel_dtype(dtype), rows, heads, head_dim, stride};
}

std::vector<libra::kernel::Fragment> kernel_fragments(const py::array_t<I64, py::array::c_style>& a) {
  if (a.ndim() != 2 || a.shape(1) != 5) bad("kernel fragments: must be an int64 array of shape [n, 5]");
  std::vector<libra::kernel::Fragment> out(static_cast<std::size_t>(a.shape(0)));
  auto r = a.unchecked<2>();
  for (py::ssize_t i = 0; i < a.shape(0); ++i) out[static_cast<std::size_t>(i)] = {r(i, 0), r(i, 1), r(i, 2), r(i, 3), r(i, 4)};
  return out;
}


// ---- rank programs (libra/program.hpp) for libra.torch: the schedule's
// sizes and kernel calls, and its flat program as numpy arrays.

// A schedule's sizes and kernel calls (what libra.torch's compute step reads).
py::dict schedule_dict(const libra::RankSchedule& s, const std::vector<int>& order) {
  py::dict o;
  o["order"] = py::cast(order);
  o["worker"] = s.worker;
  o["workers"] = s.workers;
  o["chunks"] = s.chunks;
  o["heads_q"] = s.heads_q;
  o["heads_kv"] = s.heads_kv;
  o["head_dim"] = s.head_dim;
  o["dtype"] = std::string(libra::dtype_name(s.dtype));
  o["window"] = s.window == libra::kFullCausal ? py::object(py::none()) : py::object(py::int_(s.window));
  o["home_row0"] = s.home_row0;
  o["home_rows"] = s.home_rows;
  o["home_tokens"] = s.home_tokens;
  o["compute_q_vectors"] = s.compute_q_vectors;
  o["compute_kv_vectors"] = s.compute_kv_vectors;
  o["fingerprint"] = s.fingerprint;
  py::list passes;
  for (int p = 0; p < 2; ++p) {
    py::list chunks;
    for (int m = 0; m < s.chunks; ++m) {
      py::list calls;
      for (const libra::KernelCall& c : s.calls(static_cast<libra::Pass>(p), m)) {
        std::vector<I64> f;
        for (const libra::CallFragment& x : s.call_fragments(c)) f.insert(f.end(), {x.q_row, x.kv_row, x.sample_len, x.a, x.e});
        calls.append(py::make_tuple(py::make_tuple(c.q.offset, c.q.rows, c.q.run, c.q.stride),
                                    py::make_tuple(c.kv.offset, c.kv.rows, c.kv.run, c.kv.stride),
                                    int_array(std::move(f), 5), c.q_home, c.kv_home));
      }
      chunks.append(calls);
    }
    passes.append(chunks);
  }
  o["calls"] = passes;
  o["apply_order"] = py::cast(s.apply_order);
  return o;
}

struct ProgramHandle {
  libra::RankSchedule schedule;
  libra::RankProgram program;
};

// Moves as an int64 [n, 13] array: field, src, dst, add, peer, chunk, rows,
// run, src_offset, src_stride, dst_offset, dst_stride, wire_byte.
py::array_t<I64> moves_array(const std::vector<libra::Move>& moves) {
  std::vector<I64> v;
  v.reserve(moves.size() * 13);
  for (const libra::Move& m : moves) {
    v.insert(v.end(), {static_cast<I64>(m.field), static_cast<I64>(m.src), static_cast<I64>(m.dst), m.add ? 1 : 0,
                       m.peer, m.chunk, m.rows, m.run, m.src_offset, m.src_stride, m.dst_offset, m.dst_stride,
                       m.wire_byte});
  }
  return int_array(std::move(v), 13);
}

// Moves expanded per head vector for torch's index_select / index_copy_ /
// index_add_, grouped by (field, src, dst, add) in move order (so the adds
// into one row keep the program's order). Wire positions are class-message
// vectors; for an apply list (`apply`), every chunk's class messages are
// concatenated in chunk order and followed by the field's compute buffer, so
// the receipts and the outputs kept form one source (src 3) and one
// index_add_ per field keeps the program's order. Returns [(field name, src,
// dst, add, class, src index, dst index)].
struct Group {
  int field = 0, src = 0, dst = 0, cls = 0;
  bool add = false;
  std::vector<I64> sidx, didx;
};

std::vector<Group> expand_moves(const ProgramHandle& h, const libra::PassProgram* pass, const std::vector<libra::Move>& moves) {
  // apply: first vector of chunk m's class-c message in the concatenation, and the compute buffer's start.
  std::vector<std::array<I64, libra::kNumWireClasses>> base;
  std::array<I64, libra::kNumWireClasses> total{};
  if (pass) {
    for (const libra::ExchangeProgram& x : pass->out) {
      base.push_back(total);
      for (std::size_t c = 0; c < libra::kNumWireClasses; ++c) {
        for (I64 n : x.recv_vectors[c]) total[c] += n;
      }
    }
  }
  std::vector<Group> out;
  std::map<std::tuple<int, int, int, bool>, std::size_t> at;
  for (const libra::Move& m : moves) {
    const int cls = libra::wire_class(m.field);
    const int src = pass ? 3 : static_cast<int>(m.src);
    auto key = std::make_tuple(static_cast<int>(m.field), src, static_cast<int>(m.dst), m.add);
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, out.size()).first;
      out.push_back({static_cast<int>(m.field), src, static_cast<int>(m.dst), cls, m.add, {}, {}});
    }
    Group& g = out[it->second];
    I64 shift = 0;
    if (pass) {
      shift = m.src == libra::Loc::kWire ? base[static_cast<std::size_t>(m.chunk)][static_cast<std::size_t>(cls)]
                                         : total[static_cast<std::size_t>(cls)];
    }
    for (I64 i = 0; i < m.rows; ++i) {
      for (I64 j = 0; j < m.run; ++j) {
        g.sidx.push_back(shift + m.src_offset + i * m.src_stride + j);
        g.didx.push_back(m.dst_offset + i * m.dst_stride + j);
      }
    }
  }
  (void)h;
  return out;
}

py::list groups_list(std::vector<Group>&& groups) {
  py::list l;
  for (Group& g : groups) {
    l.append(py::make_tuple(libra::field_name(static_cast<libra::Field>(g.field)), g.src, g.dst, g.add, g.cls,
                            int_array(std::move(g.sidx)), int_array(std::move(g.didx))));
  }
  return l;
}

py::dict exchange_dict(const ProgramHandle& h, const libra::ExchangeProgram& x) {
  std::vector<Group> gather, local, scatter;
  {
    py::gil_scoped_release release;
    gather = expand_moves(h, nullptr, x.gather);
    local = expand_moves(h, nullptr, x.local);
    scatter = expand_moves(h, nullptr, x.scatter);
  }
  py::dict d;
  d["send_vectors"] = py::cast(x.send_vectors);
  d["recv_vectors"] = py::cast(x.recv_vectors);
  d["gather"] = groups_list(std::move(gather));
  d["local"] = groups_list(std::move(local));
  d["scatter"] = groups_list(std::move(scatter));
  return d;
}

const libra::PassProgram& pass_of(const ProgramHandle& h, int pass) {
  if (pass != 0 && pass != 1) bad("rank program: pass " + std::to_string(pass) + ": must be 0 (forward) or 1 (backward)");
  return h.program.pass(static_cast<libra::Pass>(pass));
}

const libra::ExchangeProgram& exchange_of(const ProgramHandle& h, const libra::PassProgram& pp, const std::string& kind,
                                          int chunk) {
  if (kind != "in" && kind != "out") bad("rank program: exchange " + kind + ": must be in or out");
  if (chunk < 0 || chunk >= h.program.chunks) {
    bad("rank program: chunk " + std::to_string(chunk) + ": must be in [0, " + std::to_string(h.program.chunks) + ")");
  }
  return (kind == "in" ? pp.in : pp.out)[static_cast<std::size_t>(chunk)];
}

std::vector<int> check_order(const libra::Plan& plan, std::optional<std::vector<int>> order) {
  std::vector<int> peers;
  if (order) {
    peers = *order;
    std::vector<int> sorted = peers;
    std::sort(sorted.begin(), sorted.end());
    bool ok = sorted.size() == static_cast<std::size_t>(plan.num_workers());
    for (std::size_t i = 0; ok && i < sorted.size(); ++i) ok = sorted[i] == static_cast<int>(i);
    if (!ok) bad("rank schedule order: must be a permutation of the plan's " + std::to_string(plan.num_workers()) + " workers");
  } else {
    for (int i = 0; i < plan.num_workers(); ++i) peers.push_back(i);
  }
  return peers;
}

}  // namespace

PYBIND11_MODULE(_libra, m) {
  m.doc() = "libra core binding (torch-free); use the `libra` package";
  m.attr("FULL_CAUSAL") = libra::kFullCausal;

  // ---- corpus
  m.def(
      "load_packed_sequences",
      [](const std::string& source, std::optional<I64> seq_len) {
        libra::Result<std::vector<libra::PackedSequence>> r = [&] {
          py::gil_scoped_release release;
          return libra::load_packed_sequences(source, seq_len);
        }();
        return unwrap(std::move(r));
      },
      py::arg("source"), py::arg("seq_len") = py::none());
  m.def(
      "corpus_stats",
      [](const std::string& source) {
        libra::Result<libra::CorpusStats> r = [&]() -> libra::Result<libra::CorpusStats> {
          py::gil_scoped_release release;
          auto c = libra::load_corpus(source);
          if (!c.ok()) return c.error();
          return libra::corpus_stats(*c);
        }();
        libra::CorpusStats s = unwrap(std::move(r));
        py::dict o;
        o["kind"] = s.kind == libra::CorpusKind::kRaw ? "raw" : "packed";
        o["samples"] = s.samples;
        o["total_tokens"] = s.total_tokens;
        o["lengths"] = distribution(s.lengths);
        o["workloads"] = s.workloads ? py::object(distribution(*s.workloads)) : py::object(py::none());
        o["tokens_per_sequence"] =
            s.tokens_per_sequence ? py::object(distribution(*s.tokens_per_sequence)) : py::object(py::none());
        return o;
      },
      py::arg("source"));
  m.def(
      "load_lengths",
      [](const std::string& source) {
        libra::Corpus c = unwrap(libra::load_corpus(source));
        if (c.kind != libra::CorpusKind::kRaw) bad(source + ": holds packed sequences, not raw sample lengths");
        return c.raw_lengths;
      },
      py::arg("source"));
  m.def(
      "pack",
      [](const std::vector<I64>& lengths, I64 seq_len, const std::string& overlong, const std::string& packer) {
        libra::PackOptions o;
        o.seq_len = seq_len;
        o.overlong = unwrap(libra::parse_overlong_policy(overlong));
        o.packer = unwrap(libra::parse_packer_kind(packer));
        libra::PackResult r = unwrap(libra::pack(lengths, o));
        py::dict d;
        d["sequences"] = py::cast(r.sequences);
        d["input_samples"] = r.input_samples;
        d["input_tokens"] = r.input_tokens;
        d["output_tokens"] = r.output_tokens;
        d["overlong_samples"] = r.overlong_samples;
        d["dropped_tokens"] = r.dropped_tokens;
        return d;
      },
      py::arg("lengths"), py::arg("seq_len"), py::arg("overlong") = "split", py::arg("packer") = "sequential");
  m.def("builtin_corpora", [] {
    py::list out;
    for (const std::string& n : libra::builtin_corpus_names()) {
      libra::BuiltinSpec s = unwrap(libra::builtin_corpus_spec(n));
      py::dict d;
      d["name"] = s.name;
      d["source"] = "builtin:" + s.name;
      d["default_seq_len"] = s.default_seq_len;
      d["samples"] = s.samples;
      d["default_seed"] = s.default_seed;
      d["paper_median"] = s.paper_median;
      d["paper_p99"] = s.paper_p99;
      out.append(d);
    }
    return out;
  });

  // ---- placement
  m.def(
      "sequence_workloads",
      [](const py::object& seqs) {
        return int_array(unwrap(libra::sequence_workloads(to_sequences(seqs, "sequences"))));
      },
      py::arg("sequences"));
  m.def(
      "place_window",
      [](const py::object& seqs, I64 pool_size, const std::string& mode, std::uint64_t seed, I64 dp, I64 elastic_k,
         double elastic_threshold, const std::string& elastic_rule) {
        std::vector<I64> f = unwrap(libra::sequence_workloads(to_sequences(seqs, "sequences")));
        libra::PlacementOptions o =
            placement_options(pool_size, mode, seed, dp, elastic_k, elastic_threshold, elastic_rule);
        libra::WindowPlacement w = unwrap(libra::place_window(f, o));
        py::dict d = window_dict(w);
        d["workloads"] = int_array(f);
        d["lower_bound"] = libra::lower_bound_imbalance(f, pool_size);
        return d;
      },
      py::arg("sequences"), py::arg("pool_size"), py::arg("mode") = "vrsp", py::arg("seed") = 0,
      py::arg("dp") = 0, py::arg("elastic_k") = 2, py::arg("elastic_threshold") = 0.05,
      py::arg("elastic_rule") = "buddy");

  py::class_<libra::PlacementSampler>(m, "PlacementSampler")
      .def(py::init([](const py::object& seqs, I64 gbs, I64 dp, I64 pool_size, const std::string& mode,
                       std::uint64_t seed, I64 elastic_k, double elastic_threshold, const std::string& elastic_rule) {
             libra::SamplerOptions o{.gbs = gbs, .dp = dp,
                                     .placement = placement_options(pool_size, mode, seed, dp, elastic_k,
                                                                    elastic_threshold, elastic_rule)};
             return unwrap(libra::PlacementSampler::create(to_sequences(seqs, "sequences"), o));
           }),
           py::arg("sequences"), py::arg("gbs"), py::arg("dp"), py::arg("pool_size"), py::arg("mode") = "vrsp",
           py::arg("seed") = 0, py::arg("elastic_k") = 2, py::arg("elastic_threshold") = 0.05,
           py::arg("elastic_rule") = "buddy")
      .def_property_readonly("num_steps", &libra::PlacementSampler::num_steps)
      .def_property_readonly("dropped_tail", &libra::PlacementSampler::dropped_tail)
      .def_property_readonly("gbs", [](const libra::PlacementSampler& s) { return s.options().gbs; })
      .def_property_readonly("dp", [](const libra::PlacementSampler& s) { return s.options().dp; })
      .def_property_readonly("pool_size", [](const libra::PlacementSampler& s) { return s.options().placement.pool_size; })
      .def_property_readonly("num_sequences", [](const libra::PlacementSampler& s) { return s.sequences().size(); })
      .def_property_readonly("workloads", [](const libra::PlacementSampler& s) { return int_array(s.workloads()); })
      .def(
          "sequence",
          [](const libra::PlacementSampler& s, I64 i) {
            if (i < 0 || i >= static_cast<I64>(s.sequences().size())) {
              bad("sequence " + std::to_string(i) + ": must be in [0, " + std::to_string(s.sequences().size()) + ")");
            }
            return s.sequence(i);
          },
          py::arg("index"))
      .def(
          "at",
          [](const libra::PlacementSampler& s, I64 step) {
            libra::SamplerStep st = unwrap(s.at(step));
            py::dict d = window_dict(st.placement);
            d["step"] = st.step;
            d["order"] = int_array(st.order);
            d["ga_steps"] = st.layout.ga_steps;
            d["pools_per_ga"] = st.layout.pools_per_ga;
            d["pool_ga"] = int_array(st.layout.pool_ga);
            d["pool_first_replica"] = int_array(st.layout.pool_first_replica);
            return d;
          },
          py::arg("step"));

  // ---- plans
  py::class_<libra::Plan>(m, "Plan")
      .def_property_readonly("fingerprint", &libra::Plan::fingerprint)
      .def_property_readonly("config", &config_dict)
      .def_property_readonly("pool_size", &libra::Plan::pool_size)
      .def_property_readonly("num_workers", &libra::Plan::num_workers)
      .def_property_readonly("head_width", &libra::Plan::head_width)
      .def_property_readonly("pool",
                             [](const libra::Plan& p) {
                               return std::vector<libra::PackedSequence>(p.pool().begin(), p.pool().end());
                             })
      .def_property_readonly("tiles", &tiles_table)
      .def_property_readonly("fragments", &fragments_table)
      .def_property_readonly("groups", &groups_table)
      .def_property_readonly("worker_flops",
                             [](const libra::Plan& p) {
                               return int_array({p.worker_flops().begin(), p.worker_flops().end()});
                             })
      .def_property_readonly("imbalance", &libra::Plan::imbalance)
      .def_property_readonly("comm_bytes", &libra::Plan::comm_bytes)
      // Per worker, the bytes its tiles read in place and what it sends and
      // receives inside its node and across nodes (config topology).
      .def_property_readonly("tier_bytes",
                             [](const libra::Plan& p) {
                               py::dict d;
                               auto col = [&](const char* name, auto field) {
                                 std::vector<I64> v;
                                 for (const libra::TierBytes& t : p.tier_bytes()) v.push_back(t.*field);
                                 d[name] = int_array(std::move(v));
                               };
                               col("kept", &libra::TierBytes::kept);
                               col("send_intra_node", &libra::TierBytes::send_intra_node);
                               col("send_cross_node", &libra::TierBytes::send_cross_node);
                               col("send_cross_supernode", &libra::TierBytes::send_cross_supernode);
                               col("recv_intra_node", &libra::TierBytes::recv_intra_node);
                               col("recv_cross_node", &libra::TierBytes::recv_cross_node);
                               col("recv_cross_supernode", &libra::TierBytes::recv_cross_supernode);
                               return d;
                             })
      .def_property_readonly("busiest_receiver", &libra::Plan::busiest_receiver)
      .def_property_readonly("max_recv_cross_node", &libra::Plan::max_recv_cross_node)
      .def_property_readonly("byte_matrix",
                             [](const libra::Plan& p) {
                               return int_array({p.byte_matrix().begin(), p.byte_matrix().end()}, p.num_workers());
                             })
      .def(
          "worker_tiles",
          [](const libra::Plan& p, int r) {
            check_worker(p, r, "worker");
            auto s = p.worker_tiles(r);
            return int_array({s.begin(), s.end()});
          },
          py::arg("worker"))
      .def(
          "worker_groups",
          [](const libra::Plan& p, int r) {
            check_worker(p, r, "worker");
            auto s = p.worker_groups(r);
            return int_array({s.begin(), s.end()});
          },
          py::arg("worker"))
      .def(
          "transfers",
          [](const libra::Plan& p, int src, int dst) {
            check_worker(p, src, "src");
            check_worker(p, dst, "dst");
            return transfers_table(p.transfers(src, dst));
          },
          py::arg("src"), py::arg("dst"))
      .def("all_transfers", [](const libra::Plan& p) { return transfers_table(p.all_transfers()); })
      .def(
          "chunk_transfers",
          [](const libra::Plan& p, int chunk, int src, int dst) {
            check_chunk(p, chunk);
            check_worker(p, src, "src");
            check_worker(p, dst, "dst");
            return transfers_table(p.chunk_transfers(chunk, src, dst));
          },
          py::arg("chunk"), py::arg("src"), py::arg("dst"))
      .def(
          "chunk_heads",
          [](const libra::Plan& p, int tile, int chunk) {
            check_chunk(p, chunk);
            if (tile < 0 || tile >= static_cast<int>(p.tiles().size())) {
              bad("tile " + std::to_string(tile) + ": must be in [0, " + std::to_string(p.tiles().size()) + ")");
            }
            libra::HeadRange h = p.chunk_heads(p.tiles()[static_cast<std::size_t>(tile)], chunk);
            return std::pair<int, int>(h.begin, h.end);
          },
          py::arg("tile"), py::arg("chunk"))
      .def(
          "save",
          [](const libra::Plan& p, const std::string& path) {
            libra::Status s = [&] {
              py::gil_scoped_release release;
              return libra::save_plan(p, path);
            }();
            check(s);
          },
          py::arg("path"))
      .def("to_json", [](const libra::Plan& p) { return libra::plan_to_json(p); })
      .def("to_bytes", [](const libra::Plan& p) { return py::bytes(libra::plan_to_binary(p)); })
      .def("__eq__", [](const libra::Plan& a, const libra::Plan& b) {
        return a.fingerprint() == b.fingerprint() && libra::plan_to_binary(a) == libra::plan_to_binary(b);
      })
      .def("__hash__", [](const libra::Plan& p) { return static_cast<py::ssize_t>(p.fingerprint() >> 1); })
      .def("__repr__",
           [](const libra::Plan& p) {
             return "<libra.Plan " + std::string(libra::plan_mode_name(p.config().mode)) + " P=" +
                    std::to_string(p.pool_size()) + " cp=" + std::to_string(p.config().cp) + " tiles=" +
                    std::to_string(p.tiles().size()) + " fingerprint=" + std::to_string(p.fingerprint()) + ">";
           })
      .def(py::pickle([](const libra::Plan& p) { return py::make_tuple(py::bytes(libra::plan_to_binary(p))); },
                      [](const py::tuple& t) {
                        if (t.size() != 1) bad("pickled libra.Plan: expected one bytes field");
                        return plan_from_bytes(t[0].cast<py::bytes>(), "pickled plan");
                      }));

  m.def(
      "make_plan",
      [](const py::object& pool, I64 seq_len, int cp, I64 block_size, int head_shards, int heads_q, int heads_kv,
         int head_dim, const std::string& dtype, std::optional<I64> window, double tau, int chunks,
         const std::string& mode, bool dedup_per_kv_head, const std::string& home_layout) {
        std::vector<libra::PackedSequence> seqs = to_sequences(pool, "pool");
        libra::PlanConfig c;
        c.seq_len = seq_len;
        c.cp = cp;
        c.block_size = block_size;
        c.head_shards = head_shards;
        c.shape.heads_q = heads_q;
        c.shape.heads_kv = heads_kv;
        c.shape.head_dim = head_dim;
        if (auto t = libra::parse_dtype(dtype); t.ok()) c.shape.dtype = *t;
        else bad("dtype " + dtype + ": must be bf16, fp16 or fp32");
        if (window) {
          if (*window < 1) bad("window " + std::to_string(*window) + ": must be >= 1 (None for plain causal)");
          c.shape.window = *window;
        }
        c.tau = tau;
        c.chunks = chunks;
        c.mode = unwrap(libra::parse_plan_mode(mode));
        c.dedup_per_kv_head = dedup_per_kv_head;
        if (auto l = libra::parse_home_layout(home_layout); l.ok()) c.home_layout = *l;
        else bad("home_layout " + home_layout + ": must be contiguous or zigzag");
        libra::Result<libra::Plan> r = [&] {
          py::gil_scoped_release release;
          return libra::make_plan(seqs, c);
        }();
        return unwrap(std::move(r));
      },
      py::arg("pool"), py::kw_only(), py::arg("seq_len"), py::arg("cp"), py::arg("block_size"),
      py::arg("head_shards"), py::arg("heads_q"), py::arg("heads_kv"), py::arg("head_dim"),
      py::arg("dtype") = "bf16", py::arg("window") = py::none(), py::arg("tau") = 0.03, py::arg("chunks") = 1,
      py::arg("mode") = "tap", py::arg("dedup_per_kv_head") = false, py::arg("home_layout") = "contiguous");
  m.def(
      "home_layout",
      [](const libra::Plan& plan, int worker) {
        check_worker(plan, worker, "worker");
        return home_layout_dict(plan, worker);
      },
      py::arg("plan"), py::arg("worker"));
  m.def(
      "load_plan",
      [](const std::string& path) {
        libra::Result<libra::Plan> r = [&] {
          py::gil_scoped_release release;
          return libra::load_plan(path);
        }();
        return unwrap(std::move(r));
      },
      py::arg("path"));
  m.def("plan_from_bytes", &plan_from_bytes, py::arg("data"), py::arg("source") = "plan bytes");
  m.def(
      "plan_from_json",
      [](const std::string& text, const std::string& source) { return unwrap(libra::plan_from_json(text, source)); },
      py::arg("text"), py::arg("source") = "plan json");

  // ---- simulator: the config as JSON text (the keys of `libra simulate --config`), the result as
  // `libra simulate --json` prints it; the Python wrapper converts both.
  m.def(
      "simulate_json",
      [](const std::string& config_json) {
        libra::Result<std::string> r = [&]() -> libra::Result<std::string> {
          py::gil_scoped_release release;
          libra::SimConfig cfg;
          libra::Status s = libra::apply_sim_config_json(config_json, "simulate config", cfg);
          if (!s.ok()) return s.error();
          auto sim = libra::simulate(cfg);
          if (!sim.ok()) return sim.error();
          return libra::sim_json(*sim);
        }();
        return unwrap(std::move(r));
      },
      py::arg("config_json"));

  // ---- CPU attention kernel on caller-owned memory (torch tensors' data_ptr()).
  // Views are (data_ptr, dtype, rows, heads, head_dim, row_stride); fragments
  // an int64 [n, 5] array of (q_row, kv_row, sample_len, a, e). The caller
  // keeps the memory alive; libra.torch does.
  m.def(
      "kernel_forward",
      [](const View& q, const View& k, const View& v, const View& o, const View& lse,
         const py::array_t<I64, py::array::c_style>& fragments, I64 window, std::optional<float> scale, int threads) {
        std::vector<libra::kernel::Fragment> frags = kernel_fragments(fragments);
        libra::kernel::ForwardArgs a{view(q), view(k), view(v), view(o), view(lse), frags};
        a.window = window;
        a.softmax_scale = kernel_scale(scale);
        a.threads = threads;
        libra::Status s = [&] {
          py::gil_scoped_release release;
          return libra::kernel::attention_forward(a);
        }();
        check(s);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("fragments"),
      py::arg("window") = libra::kFullCausal, py::arg("softmax_scale") = py::none(), py::arg("threads") = 1);
  m.def(
      "kernel_backward",
      [](const View& q, const View& k, const View& v, const View& o, const View& d_o, const View& lse,
         const View& dq, const View& dk, const View& dv, const py::array_t<I64, py::array::c_style>& fragments,
         I64 window, std::optional<float> scale, int threads) {
        std::vector<libra::kernel::Fragment> frags = kernel_fragments(fragments);
        libra::kernel::BackwardArgs a{view(q), view(k), view(v), view(o), view(d_o), view(lse),
                                      view(dq), view(dk), view(dv), frags};
        a.window = window;
        a.softmax_scale = kernel_scale(scale);
        a.threads = threads;
        libra::Status s = [&] {
          py::gil_scoped_release release;
          return libra::kernel::attention_backward(a);
        }();
        check(s);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("d_o"), py::arg("lse"), py::arg("dq"),
      py::arg("dk"), py::arg("dv"), py::arg("fragments"), py::arg("window") = libra::kFullCausal,
      py::arg("softmax_scale") = py::none(), py::arg("threads") = 1);
  m.def("simd_target", &libra::kernel::simd_target);

  // libra/program.hpp: this worker's flat exchange program, on a group whose rank g holds worker order[g].
  py::class_<ProgramHandle>(m, "RankProgram")
      .def_property_readonly("info",
                             [](const ProgramHandle& h) { return schedule_dict(h.schedule, h.program.order); })
      // The raw moves of one list: kind "apply", or "<in|out> <gather|local|scatter>" of a chunk.
      .def("moves",
           [](const ProgramHandle& h, int pass, const std::string& kind, int chunk) {
             const libra::PassProgram& pp = pass_of(h, pass);
             if (kind == "apply") return moves_array(pp.apply);
             const auto sp = kind.find(' ');
             const std::string dir = kind.substr(0, sp), list = sp == std::string::npos ? "" : kind.substr(sp + 1);
             const libra::ExchangeProgram& x = exchange_of(h, pp, dir, chunk);
             if (list == "gather") return moves_array(x.gather);
             if (list == "local") return moves_array(x.local);
             if (list == "scatter") return moves_array(x.scatter);
             bad("rank program: moves " + kind + ": must be apply or in/out gather, local or scatter");
           },
           py::arg("pass"), py::arg("kind"), py::arg("chunk") = 0)
      .def("exchange",
           [](const ProgramHandle& h, int pass, const std::string& kind, int chunk) {
             return exchange_dict(h, exchange_of(h, pass_of(h, pass), kind, chunk));
           },
           py::arg("pass"), py::arg("kind"), py::arg("chunk"))
      .def("apply", [](const ProgramHandle& h, int pass) {
        const libra::PassProgram& pp = pass_of(h, pass);
        std::vector<Group> g;
        {
          py::gil_scoped_release release;
          g = expand_moves(h, &pp, pp.apply);
        }
        return groups_list(std::move(g));
      }, py::arg("pass"));
  m.def(
      "rank_program",
      [](const libra::Plan& plan, int worker, std::optional<std::vector<int>> order) {
        check_worker(plan, worker, "worker");
        std::vector<int> peers = check_order(plan, order);
        ProgramHandle h;
        libra::Status st = [&] {
          py::gil_scoped_release release;
          libra::Result<libra::RankSchedule> sched = libra::make_rank_schedule(plan, worker);
          if (!sched.ok()) return sched.status();
          libra::Result<libra::RankProgram> prog = libra::make_rank_program(*sched, peers);
          if (!prog.ok()) return prog.status();
          h.schedule = std::move(*sched);
          h.program = std::move(*prog);
          return libra::Status();
        }();
        check(st);
        return h;
      },
      py::arg("plan"), py::arg("worker"), py::arg("order") = py::none());
}
