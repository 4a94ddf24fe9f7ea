// python/src/corpus.cpp: corpus readers and the packer (libra/corpus.hpp, packing.hpp).
#include "binding.hpp"

#include <optional>

#include "libra/corpus.hpp"
#include "libra/packing.hpp"

namespace libra_py {

namespace {

py::dict distribution(const libra::Distribution& d) {
  return fields({{"count", py::int_(d.count)}, {"mean", py::float_(d.mean)}, {"median", py::float_(d.median)},
                 {"p90", py::float_(d.p90)}, {"p99", py::float_(d.p99)}, {"max", py::float_(d.max)},
                 {"cv", py::float_(d.cv)}});
}

}  // namespace

void bind_corpus(py::module_& m) {
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
}

}  // namespace libra_py
