// python/src/exec.cpp: what libra.torch shares with the C++ engine beyond the
// program: the agreement before work (libra::agree, its transports Python
// callables) and the trace file's format (libra::trace_document).
#include "binding.hpp"

#include <map>
#include <tuple>

#include "libra/comm.hpp"
#include "libra/executor.hpp"

namespace libra_py {

namespace {

// An int64 array [ranks, words] (any layout numpy can cast) as one vector per rank.
std::vector<std::vector<I64>> rows_of(const py::object& got) {
  auto a = py::array_t<I64, py::array::c_style | py::array::forcecast>::ensure(got);
  if (!a || a.ndim() != 2) bad("agree: gather_words must return a list of lists or an int64 array [ranks, words]");
  std::vector<std::vector<I64>> rows(static_cast<std::size_t>(a.shape(0)));
  const I64* p = a.data();
  for (auto& r : rows) {
    r.assign(p, p + a.shape(1));
    p += a.shape(1);
  }
  return rows;
}

// Equal-length rows as one int64 array [rows, words].
py::array_t<I64> array_of(const std::vector<std::vector<I64>>& rows) {
  const std::size_t n = rows.empty() ? 0 : rows[0].size();
  py::array_t<I64> a({rows.size(), n});
  I64* p = a.mutable_data();
  for (const auto& r : rows) p = std::copy(r.begin(), r.end(), p);
  return a;
}

}  // namespace

void bind_exec(py::module_& m) {
  m.def(
      "agree",
      [](std::vector<I64> words, const py::bytes& problem, const py::function& gather_words,
         const py::function& gather_bytes) {
        // The callables move the values (torch all-gathers, with their deadlines); whatever they
        // raise (a silent peer's TimeoutError) propagates as it is. gather_words may hand back the
        // gathered words as one int64 array [ranks, words] (read here without a Python object per
        // word); the words then come back as one such array too.
        bool as_array = false;
        libra::AgreeTransport t{
            [&](const std::vector<I64>& mine) -> libra::Result<std::vector<std::vector<I64>>> {
              py::object got = gather_words(mine);
              if (!py::isinstance<py::array>(got)) return got.cast<std::vector<std::vector<I64>>>();
              as_array = true;
              return rows_of(got);
            },
            [&](const std::string& mine) -> libra::Result<std::vector<std::string>> {
              return gather_bytes(py::bytes(mine)).cast<std::vector<std::string>>();
            }};
        libra::Result<libra::Agreement> a = libra::agree(t, std::move(words), std::string(problem));
        if (!a.ok()) raise(a.error());
        py::list problems;
        for (const std::string& p : a->problems) problems.append(py::bytes(p));
        py::object out = as_array ? py::object(array_of(a->words)) : py::cast(a->words);
        return py::make_tuple(out, problems, py::cast(a->failed));
      },
      py::arg("words"), py::arg("problem"), py::arg("gather_words"), py::arg("gather_bytes"),
      "libra::agree: (every rank's words, every rank's problem bytes (empty: none), the failed ranks); "
      "gather_words(list[int]) -> list[list[int]] (or an int64 array [ranks, words]: the words then come back "
      "as one too) and gather_bytes(bytes) -> list[bytes] by rank.");
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
