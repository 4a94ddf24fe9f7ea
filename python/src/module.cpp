// python/src/module.cpp: `libra._libra`, the torch-free Python binding of
// libra's corpus readers, sequence placement, planner, plan files,
// simulator, CPU attention kernel and the report of an executor run.
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
//
// One file per stage (corpus.cpp, placement.cpp, plan.cpp, sim.cpp,
// kernel.cpp, program.cpp, exec.cpp, report.cpp) binds that stage; binding.hpp holds what they share.
#include "binding.hpp"

#include "libra/workload.hpp"

PYBIND11_MODULE(_libra, m) {
  m.doc() = "libra core binding (torch-free); use the `libra` package";
  m.attr("FULL_CAUSAL") = libra::kFullCausal;
  // pybind11 2.10 looks numpy's C API up in a function-local static on first use, with the GIL
  // held: two threads making their first arrays at once (an in-process pool's workers, a Planner
  // thread) deadlock on that static's guard while the lookup's import waits for the GIL. Looked up
  // here, under the import lock, it is ready before any thread needs it.
  pybind11::detail::npy_api::get();
  libra_py::bind_corpus(m);
  libra_py::bind_placement(m);
  libra_py::bind_plan(m);
  libra_py::bind_sim(m);
  libra_py::bind_kernel(m);
  libra_py::bind_program(m);
  libra_py::bind_exec(m);
  libra_py::bind_report(m);
}
