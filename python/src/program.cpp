// python/src/program.cpp: rank programs (libra/program.hpp) for libra.torch: the
// schedule's sizes and kernel calls, and its flat program as numpy arrays.
#include "binding.hpp"
#include "program_index.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <tuple>

#include "libra/program.hpp"
#include "libra/relay.hpp"
#include "libra/schedule.hpp"

namespace libra_py {

namespace {

// A schedule's sizes and kernel calls (what libra.torch's compute step reads).
py::dict schedule_dict(const libra::RankSchedule& s, const std::vector<int>& order, std::uint64_t plan_fingerprint,
                       bool relay, bool with_calls = true) {
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
  o["fingerprint"] = s.fingerprint;  // the schedule's: the plan's, mixed with the relay when it relays
  o["plan_fingerprint"] = plan_fingerprint;
  o["relay"] = relay;             // what was asked (rank_program's relay=)
  o["relayed"] = s.relayed;       // whether stage exchanges run: asked, and the plan relays something
  o["stage_q_vectors"] = s.stage_q_vectors;
  o["stage_kv_vectors"] = s.stage_kv_vectors;
  if (!with_calls) return o;
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
// the receipts and the outputs kept form one source (src kJoined) and one
// index_add_ per field keeps the program's order. Returns [(field name, src,
// dst, add, class, src index, dst index)].
// An apply group's joined source: past every Loc, so it never reads as one (kStage is 3).
constexpr int kJoined = 4;

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
    const int src = pass ? kJoined : static_cast<int>(m.src);
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
  if (kind != "in" && kind != "out" && kind != "stage") bad("rank program: exchange " + kind + ": must be in, out or stage");
  if (kind == "stage" && pp.stage.empty()) {
    bad("rank program: exchange stage: the schedule is not relayed (rank_program relay=False, or the plan relays nothing)");
  }
  if (chunk < 0 || chunk >= h.program.chunks) {
    bad("rank program: chunk " + std::to_string(chunk) + ": must be in [0, " + std::to_string(h.program.chunks) + ")");
  }
  return (kind == "in" ? pp.in : kind == "out" ? pp.out : pp.stage)[static_cast<std::size_t>(chunk)];
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

void bind_program(py::module_& m) {
  // libra/program.hpp: this worker's flat exchange program, on a group whose rank g holds worker order[g].
  py::class_<ProgramHandle>(m, "RankProgram")
      .def_property_readonly("info",
                             [](const ProgramHandle& h) {
                               return schedule_dict(h.schedule, h.program.order, h.plan_fingerprint, h.relay);
                             })
      // info without "calls" (what PlanRuntime reads per micro-batch: sizes, not every fragment).
      .def_property_readonly("summary",
                             [](const ProgramHandle& h) {
                               return schedule_dict(h.schedule, h.program.order, h.plan_fingerprint, h.relay, false);
                             })
      // The worker's home rows (binding.hpp's HomeRows; cu_seqlens int32), numpy views of the handle's.
      .def_property_readonly("home", &home_py)
      // The raw moves of one list: kind "apply", or "<in|out|stage> <gather|local|scatter>" of a chunk.
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
             bad("rank program: moves " + kind + ": must be apply or in/out/stage gather, local or scatter");
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
      }, py::arg("pass"))
      // Everything libra.torch indexes with in this micro-batch (program_index.hpp), built once, with
      // the GIL released: (data, layout), data one int64 array, layout the records pointing into it.
      // kinds: the merged calls' and descriptor records to include ("varlen", "joined", "descriptors"; all
      // by default), so a runtime makes only the Python objects its backend reads.
      .def("index_arrays", [](ProgramHandle& h, std::optional<std::vector<std::string>> kinds) {
        unsigned mask = kinds ? 0U : 7U;
        for (const std::string& k : kinds.value_or(std::vector<std::string>{})) {
          if (k == "varlen") mask |= 1U;
          else if (k == "joined") mask |= 2U;
          else if (k == "descriptors") mask |= 4U;
          else bad("index_arrays: kind " + k + ": must be varlen, joined or descriptors");
        }
        // Built already (Planner's thread, build_index): taken without letting go of the GIL (each
        // release lets a waiting thread take it, and this one then waits to get it back).
        std::shared_ptr<const IndexArrays> ix = built_index(h);
        if (!ix) {
          py::gil_scoped_release release;
          ix = index_arrays(h);
        }
        return index_arrays_py(std::move(ix), mask);
      }, py::arg("kinds") = py::none())
      // Builds the index arrays without returning them (Planner's thread); the C++ build's thread CPU seconds.
      .def("build_index", [](ProgramHandle& h) {
        py::gil_scoped_release release;
        return index_arrays(h)->build_seconds;
      })
      // Lets go of the built index arrays (arrays already returned keep theirs); the next call builds anew.
      .def("drop_index", [](ProgramHandle& h) {
        // Freeing hundreds of MiB takes the kernel a while: without the GIL (when no array returned
        // earlier still holds them, this is where they go).
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(*h.index_lock);
        h.index.reset();
      });
  m.def(
      "rank_program",
      [](const libra::Plan& plan, int worker, std::optional<std::vector<int>> order, bool relay) {
        check_worker(plan, worker, "worker");
        std::vector<int> peers = check_order(plan, order);
        ProgramHandle h;
        h.plan_fingerprint = plan.fingerprint();
        h.relay = relay;
        libra::Status st = [&] {
          py::gil_scoped_release release;
          libra::Result<libra::RankSchedule> sched = libra::make_rank_schedule(plan, worker, {.relay = relay});
          if (!sched.ok()) return sched.status();
          libra::Result<libra::RankProgram> prog = libra::make_rank_program(*sched, peers);
          if (!prog.ok()) return prog.status();
          h.schedule = std::move(*sched);
          h.program = std::move(*prog);
          auto home = std::make_shared<HomeArrays>();
          home->rows = home_rows(plan, worker);
          for (I64 x : home->rows.cu) home->cu.push_back(static_cast<std::int32_t>(x));
          for (I64 x : home->rows.packed_cu) home->packed_cu.push_back(static_cast<std::int32_t>(x));
          h.home = std::move(home);
          return libra::Status();
        }();
        check(st);
        return h;
      },
      py::arg("plan"), py::arg("worker"), py::arg("order") = py::none(), py::arg("relay") = false);
  // PlanRuntime's agreement (runtime.py): whether the gathered words (int64 [ranks, 5]: the plan
  // fingerprint's halves, the worker, the plan's workers, relay) hold one plan of `size` workers, one
  // relay value and a permutation of the workers; one pass over a few hundred words, where numpy
  // took several reductions (the caller names any disagreement).
  m.def(
      "plan_words_agree",
      [](const py::array_t<I64>& words, I64 size) {
        if (words.ndim() != 2 || words.shape(1) != 5) {
          bad("plan_words_agree: words must be an int64 array [ranks, 5]");
        }
        const auto w = words.unchecked<2>();  // any strides (the agreement's words are a view)
        const I64 n = w.shape(0);
        if (n != size || n == 0 || w(0, 3) != size) return false;
        std::vector<char> seen(static_cast<std::size_t>(n), 0);
        for (I64 r = 0; r < n; ++r) {
          if (w(r, 0) != w(0, 0) || w(r, 1) != w(0, 1) || w(r, 4) != w(0, 4) || w(r, 2) < 0 || w(r, 2) >= n) {
            return false;
          }
          char& s = seen[static_cast<std::size_t>(w(r, 2))];
          if (s) return false;
          s = 1;
        }
        return true;
      },
      py::arg("words"), py::arg("size"));
  // program_index.hpp's expand_runs: a device without a kernel for it (the CPU) expands the runs here.
  m.def(
      "expand_runs",
      [](const py::array& cols, py::array& out) {
        const auto c_int32 = [](const py::array& a) {
          return a.dtype().is(py::dtype::of<std::int32_t>()) && (a.flags() & py::array::c_style);
        };
        if (!c_int32(cols) || cols.ndim() != 2 || cols.shape(0) != 5) {
          bad("expand_runs: cols must be a C-contiguous int32 array [5, runs]");
        }
        if (!c_int32(out) || out.ndim() != 1 || !out.writeable()) {
          bad("expand_runs: out must be a writable C-contiguous int32 array [rows]");
        }
        const auto* c = static_cast<const std::int32_t*>(cols.data());
        auto* o = static_cast<std::int32_t*>(out.mutable_data());
        const I64 runs = cols.shape(1), n = out.shape(0);
        std::string problem;
        {
          py::gil_scoped_release release;
          try {
            expand_runs(c, runs, o, n);
          } catch (const std::invalid_argument& e) {
            problem = e.what();
          }
        }
        if (!problem.empty()) bad(problem);
      },
      py::arg("cols"), py::arg("out"),
      "The rows of the index arrays' runs (cols: int32 [5, runs], first, count, base, len, stride) into out "
      "(int32 [rows]), without the GIL; ValueError unless the runs tile out in order.");
  // libra/relay.hpp: via[m, src, dst], the worker that sends src's chunk-m inputs for dst (src: sent directly).
  m.def(
      "plan_relays",
      [](const libra::Plan& plan) {
        libra::RelayTable r;
        {
          py::gil_scoped_release release;
          r = libra::plan_relays(plan);
        }
        std::vector<I64> via;
        via.reserve(static_cast<std::size_t>(r.chunks()) * static_cast<std::size_t>(r.workers()) *
                    static_cast<std::size_t>(r.workers()));
        for (int c = 0; c < r.chunks(); ++c)
          for (int s = 0; s < r.workers(); ++s)
            for (int d = 0; d < r.workers(); ++d) via.push_back(r.via(c, s, d));
        py::array_t<I64> a = int_array(std::move(via), r.workers());
        return a.reshape({static_cast<py::ssize_t>(r.chunks()), static_cast<py::ssize_t>(r.workers()),
                          static_cast<py::ssize_t>(r.workers())});
      },
      py::arg("plan"),
      "libra::plan_relays: int64 [chunks, workers, workers], via[m, src, dst] the worker that sends src's chunk-m "
      "inputs for dst in the main exchange (src itself unless relayed).");
}

}  // namespace libra_py
