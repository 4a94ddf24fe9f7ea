// python/src/exec.cpp: what libra.torch shares with the C++ engine beyond the
// program: the agreement before work (libra::agree, its transports Python
// callables) and the trace file's format (libra::trace_document).
#include "binding.hpp"

#include <map>
#include <tuple>

#include "libra/comm.hpp"
#include "libra/executor.hpp"

namespace libra_py {

void bind_exec(py::module_& m) {
  m.def(
      "agree",
      [](std::vector<I64> words, const py::bytes& problem, const py::function& gather_words,
         const py::function& gather_bytes) {
        // The callables move the values (torch all-gathers, with their deadlines); whatever they
        // raise (a silent peer's TimeoutError) propagates as it is.
        libra::AgreeTransport t{
            [&](const std::vector<I64>& mine) -> libra::Result<std::vector<std::vector<I64>>> {
              return gather_words(mine).cast<std::vector<std::vector<I64>>>();
            },
            [&](const std::string& mine) -> libra::Result<std::vector<std::string>> {
              return gather_bytes(py::bytes(mine)).cast<std::vector<std::string>>();
            }};
        libra::Result<libra::Agreement> a = libra::agree(t, std::move(words), std::string(problem));
        if (!a.ok()) raise(a.error());
        py::list problems;
        for (const std::string& p : a->problems) problems.append(py::bytes(p));
        return py::make_tuple(py::cast(a->words), problems, py::cast(a->failed));
      },
      py::arg("words"), py::arg("problem"), py::arg("gather_words"), py::arg("gather_bytes"),
      "libra::agree: (every rank's words, every rank's problem bytes (empty: none), the failed ranks); "
      "gather_words(list[int]) -> list[list[int]] and gather_bytes(bytes) -> list[bytes] by rank.");
  m.def(
      "trace_json",
      [](const std::vector<std::tuple<int, std::string, int, double, double>>& events) {
        std::map<int, libra::TraceRecorder> by_rank;
        for (const auto& [rank, name, lane, begin, end] : events) {
          if (lane < 0 || lane > 2) {
            raise(libra::invalid_input("trace event '" + name + "': lane " + std::to_string(lane) +
                                       ": must be 0 (compute), 1 (transfer) or 2 (wait)"));
          }
          by_rank[rank].record(name, static_cast<libra::TraceRecorder::Lane>(lane), begin, end);
        }
        std::vector<std::string> parts;
        for (const auto& [rank, rec] : by_rank) parts.push_back(rec.json_events(rank));
        return libra::trace_document(parts);
      },
      py::arg("events"),
      "The trace file's text (libra::trace_document) of (rank, name, lane, begin_us, end_us) events.");
}

}  // namespace libra_py
