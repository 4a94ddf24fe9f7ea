// python/src/binding.hpp: what the stages of `libra._libra` share, private to
// python/src. module.cpp defines the module and calls one bind_<stage> per
// stage file (corpus.cpp, placement.cpp, plan.cpp, sim.cpp, kernel.cpp,
// program.cpp, exec.cpp, report.cpp); a new stage's bindings are a new file and one call there.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "libra/plan.hpp"
#include "libra/status.hpp"
#include "libra/workload.hpp"

namespace libra_py {

namespace py = pybind11;
using I64 = std::int64_t;

// Every libra Error becomes a Python exception carrying the same one-line
// message, CLI flag names turned into Python argument names (ValueError for
// bad input and mismatches, OSError for I/O, RuntimeError for a libra bug).
[[noreturn]] void raise(const libra::Error& e);

template <class T>
T unwrap(libra::Result<T>&& r) {
  if (!r.ok()) raise(r.error());
  return std::move(r).value();
}

void check(const libra::Status& s);

[[noreturn]] void bad(const std::string& message);

// A read-only int64 array that owns a copy of `values`, shaped rows x cols
// (cols = 0: one dimension).
py::array_t<I64> int_array(std::vector<I64> values, I64 cols = 0);

// Worker r's home rows as a data pipeline sees them (plan.cpp): the packed row of each home row,
// its sample (-1 on padding) and position in it (padding counts on from 0 as one more sample),
// flash-attn cu_seqlens over the token rows (a segment per run of one sample's consecutive packed
// rows) and its longest segment, and the slot's packed sequence's cu_seqlens.
struct HomeRows {
  std::string layout;
  I64 rows = 0, tokens = 0, max_seqlen = 0;
  std::vector<I64> packed, sample, position, cu, packed_cu;
};
HomeRows home_rows(const libra::Plan& plan, int r);

// A table: a dict of read-only int64 columns of equal length.
using Columns = std::vector<std::pair<const char*, std::vector<I64>>>;
py::dict table(Columns cols);

// A record: a dict of named values, e.g. fields({{"count", py::int_(n)}, {"mean", py::float_(m)}}).
inline py::dict fields(std::initializer_list<std::pair<const char*, py::object>> values) {
  py::dict d;
  for (const auto& [name, value] : values) d[name] = value;
  return d;
}

std::vector<libra::PackedSequence> to_sequences(const py::handle& obj, const char* what);

void check_worker(const libra::Plan& p, int r, const char* what);

void bind_corpus(py::module_& m);
void bind_placement(py::module_& m);
void bind_plan(py::module_& m);
void bind_sim(py::module_& m);
void bind_kernel(py::module_& m);
void bind_program(py::module_& m);
void bind_exec(py::module_& m);
void bind_report(py::module_& m);

}  // namespace libra_py
