// python/src/report.cpp: the report of an executor run (src/exec/harness.hpp, "the report of a run"): the
// statistics over ranks, the check's verdict and the JSON document `libra exec --json` prints, computed by the
// same C++ functions from results given as plain Python values (libra.report wraps it).
//
//   _libra.exec_report(run, timings, pools, check=True, tolerance=None)
//     run:     dict: mode, seq_len, cp, chunks, heads_q, heads_kv, head_dim, dtype, source, ranks,
//              pool_ranks, pool_size; optional window (None: full causal), chunk_split, chunk_widths,
//              length_scale, threads, relay, trace
//     timings: dict forward_wall, forward_compute, backward_wall, backward_compute, forward_own,
//              backward_own: each a list of per-rank values or a dict {"max", "mean"}
//     pools:   list of dicts: pool, samples, tokens_per_slot; tiles, imbalance, comm_bytes (a planned pool),
//              relayed_pairs; errors {"O": [max_abs, max_ref], "LSE", "dQ", "dK", "dV"} and reference
//              ("naive" or "kernel") when checked
//   -> dict: json (the text), timings ({"max", "mean"} each), wall_overhead, check (None or the verdict)
#include "binding.hpp"

#include <optional>

#include "exec/harness.hpp"
#include "libra/dtype.hpp"

namespace libra_py {

namespace {

// dict[key] cast to T, or `fallback` when absent (required when there is none); a wrong type is a ValueError
// naming the place and the key.
template <class T>
T get(const py::dict& d, const char* key, const std::string& where, std::optional<T> fallback = std::nullopt) {
  if (!d.contains(key)) {
    if (fallback) return *fallback;
    bad(where + ": missing key '" + key + "'");
  }
  py::handle v = d[key];
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (PyBool_Check(v.ptr())) bad(where + "['" + key + "']: is a bool, not an integer");
  }
  try {
    return v.cast<T>();
  } catch (const py::cast_error&) {
    bad(where + "['" + key + "'] " + std::string(py::repr(v)) + ": has the wrong type");
  }
}

libra::MaxMean timing(const py::dict& timings, const char* key) {
  const std::string where = std::string("timings['") + key + "']";
  if (!timings.contains(key)) bad("timings: missing key '" + std::string(key) + "'");
  py::handle v = timings[key];
  if (py::isinstance<py::dict>(v)) {
    const auto d = py::reinterpret_borrow<py::dict>(v);
    return {get<double>(d, "max", where), get<double>(d, "mean", where)};
  }
  std::vector<double> per_rank;
  try {
    per_rank = v.cast<std::vector<double>>();
  } catch (const py::cast_error&) {
    bad(where + ": must be a list of per-rank values or a dict with 'max' and 'mean'");
  }
  if (per_rank.empty()) bad(where + ": no ranks");
  return libra::max_mean_of(per_rank);
}

libra::RunDescription run_description(const py::dict& run) {
  const std::string w = "run";
  libra::RunDescription d;
  libra::PlanConfig& c = d.config;
  d.mode = get<std::string>(run, "mode", w);
  c.seq_len = get<I64>(run, "seq_len", w);
  c.cp = get<int>(run, "cp", w);
  c.chunks = get<int>(run, "chunks", w);
  c.shape.heads_q = get<int>(run, "heads_q", w);
  c.shape.heads_kv = get<int>(run, "heads_kv", w);
  c.shape.head_dim = get<int>(run, "head_dim", w);
  c.shape.dtype = unwrap(libra::parse_dtype(get<std::string>(run, "dtype", w)));
  const py::object window = run.contains("window") ? py::object(run["window"]) : py::none();
  c.shape.window = window.is_none() ? libra::kFullCausal : get<I64>(run, "window", w);
  c.chunk_split = unwrap(libra::parse_chunk_split(get<std::string>(run, "chunk_split", w, std::string("equal"))));
  d.chunk_widths = get<std::vector<std::int32_t>>(run, "chunk_widths", w, std::vector<std::int32_t>());
  d.source = get<std::string>(run, "source", w);
  d.length_scale = get<double>(run, "length_scale", w, 1.0);
  d.threads = get<int>(run, "threads", w, 1);
  d.relay = get<bool>(run, "relay", w, false);
  d.trace = get<std::string>(run, "trace", w, std::string());
  return d;
}

libra::ReferenceKind reference_kind(const std::string& name, const std::string& where) {
  if (name == "naive" || name == libra::reference_name(libra::ReferenceKind::kNaive)) return libra::ReferenceKind::kNaive;
  if (name == "kernel" || name == libra::reference_name(libra::ReferenceKind::kKernel)) {
    return libra::ReferenceKind::kKernel;
  }
  bad(where + "['reference'] '" + name + "': must be 'naive' or 'kernel'");
}

libra::PoolResult pool_result(const py::dict& p, const std::string& w, bool check) {
  libra::PoolResult r;
  r.pool = get<I64>(p, "pool", w);
  r.samples = get<I64>(p, "samples", w);
  r.tokens_per_slot = get<std::vector<I64>>(p, "tokens_per_slot", w);
  r.planned = p.contains("tiles");
  if (r.planned) {
    r.tiles = get<I64>(p, "tiles", w);
    r.imbalance = get<double>(p, "imbalance", w);
    r.comm_bytes = get<I64>(p, "comm_bytes", w);
    r.relayed_pairs = get<I64>(p, "relayed_pairs", w, I64{0});
  }
  if (!check) return r;
  r.reference = reference_kind(get<std::string>(p, "reference", w, std::string("naive")), w);
  const auto errors = get<py::dict>(p, "errors", w);
  for (int i = 0; i < libra::kCheckedTensors; ++i) {
    const auto e = get<std::pair<double, double>>(errors, libra::kCheckedTensorNames[i], w + "['errors']");
    r.errors[static_cast<std::size_t>(i)] = {e.first, e.second};
  }
  return r;
}

py::dict max_mean_dict(const libra::MaxMean& m) { return py::dict(py::arg("max") = m.max, py::arg("mean") = m.mean); }

py::dict verdict_dict(const libra::CheckVerdict& v) {
  py::dict tensors;
  for (int i = 0; i < libra::kCheckedTensors; ++i) {
    const auto k = static_cast<std::size_t>(i);
    tensors[libra::kCheckedTensorNames[i]] =
        py::dict(py::arg("max_abs") = v.total[k].max_abs, py::arg("max_ref") = v.total[k].max_ref,
                 py::arg("relative") = v.total[k].rel(), py::arg("tolerance") = v.tolerance[k],
                 py::arg("ok") = v.within(v.total, i));
  }
  const py::object first = v.ok ? py::object(py::none()) : py::str(libra::kCheckedTensorNames[v.first_failed]);
  return py::dict(py::arg("ok") = v.ok, py::arg("first_failed") = first, py::arg("tensors") = tensors);
}

}  // namespace

void bind_report(py::module_& m) {
  m.def(
      "exec_report",
      [](const py::dict& run, const py::dict& timings, const py::list& pools, bool check,
         std::optional<double> tolerance) {
        const libra::RunDescription d = run_description(run);
        libra::CheckReport r;
        r.ranks = get<int>(run, "ranks", "run");
        r.pool_ranks = get<int>(run, "pool_ranks", "run");
        r.pool_size = get<int>(run, "pool_size", "run");
        r.pools = static_cast<int>(pools.size());
        r.forward_wall = timing(timings, "forward_wall");
        r.forward_compute = timing(timings, "forward_compute");
        r.backward_wall = timing(timings, "backward_wall");
        r.backward_compute = timing(timings, "backward_compute");
        r.forward_own = timing(timings, "forward_own");
        r.backward_own = timing(timings, "backward_own");
        for (std::size_t i = 0; i < pools.size(); ++i) {
          const std::string w = "pools[" + std::to_string(i) + "]";
          if (!py::isinstance<py::dict>(pools[i])) bad(w + ": must be a dict");
          r.pool_results.push_back(pool_result(py::reinterpret_borrow<py::dict>(pools[i]), w, check));
        }
        if (check && r.pool_results.empty()) bad("pools: a checked run has at least one pool");
        if (tolerance && !(*tolerance > 0)) bad("tolerance " + std::to_string(*tolerance) + ": must be positive");
        std::optional<libra::CheckVerdict> v;
        if (check) {
          v = libra::check_verdict(r, tolerance ? libra::uniform_tolerance(*tolerance)
                                                : libra::tolerance_for(d.config.shape.dtype));
        }
        py::dict out;
        out["json"] = libra::run_report_json(d, r, v ? &*v : nullptr);
        out["timings"] = py::dict(py::arg("forward_wall") = max_mean_dict(r.forward_wall),
                                  py::arg("forward_compute") = max_mean_dict(r.forward_compute),
                                  py::arg("backward_wall") = max_mean_dict(r.backward_wall),
                                  py::arg("backward_compute") = max_mean_dict(r.backward_compute),
                                  py::arg("forward_own") = max_mean_dict(r.forward_own),
                                  py::arg("backward_own") = max_mean_dict(r.backward_own));
        out["wall_overhead"] =
            py::dict(py::arg("forward") = libra::wall_overhead(r.forward_wall, r.forward_compute),
                     py::arg("backward") = libra::wall_overhead(r.backward_wall, r.backward_compute));
        out["check"] = v ? py::object(verdict_dict(*v)) : py::object(py::none());
        return out;
      },
      py::arg("run"), py::arg("timings"), py::arg("pools"), py::arg("check") = true,
      py::arg("tolerance") = py::none(),
      "The report of an executor run as `libra exec` makes it (see python/src/report.cpp for the keys).");
  m.def(
      "exec_tolerance",
      [](const std::string& dtype) {
        const libra::Tolerance t = libra::tolerance_for(unwrap(libra::parse_dtype(dtype)));
        return py::dict(py::arg("O") = t.o, py::arg("LSE") = t.lse, py::arg("dQ") = t.dq, py::arg("dK") = t.dk,
                        py::arg("dV") = t.dv);
      },
      py::arg("dtype"), "The relative tolerances `libra exec --check` applies for an element type.");
  m.def(
      "own_cpu_fraction", &libra::own_cpu_fraction, py::arg("cpu"), py::arg("kernel_cpu"),
      "The executor's CPU time outside the kernel over its kernel CPU time (0 without kernel time).");
}

}  // namespace libra_py
