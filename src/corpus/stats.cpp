// Corpus statistics: nearest-rank percentiles, mean and CV.
#include <algorithm>
#include <cmath>
#include <string>

#include "libra/checked.hpp"
#include "libra/corpus.hpp"
#include "libra/workload.hpp"

namespace libra {

Distribution distribution_of(std::span<const std::int64_t> values) {
  Distribution d;
  if (values.empty()) return d;
  std::vector<std::int64_t> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  // Nearest rank: the value at 1-based rank ceil(p * n / 100).
  auto rank = [&](std::size_t p) { return v[(p * n + 99) / 100 - 1]; };
  d.count = static_cast<std::int64_t>(n);
  d.median = static_cast<double>(rank(50));
  d.p90 = static_cast<double>(rank(90));
  d.p99 = static_cast<double>(rank(99));
  d.max = static_cast<double>(v.back());
  // Two passes in double, in sorted order, so the result is the same on every
  // IEEE machine and does not suffer from cancellation.
  double sum = 0;
  for (std::int64_t x : v) sum += static_cast<double>(x);
  d.mean = sum / static_cast<double>(n);
  double ss = 0;
  for (std::int64_t x : v) {
    const double dx = static_cast<double>(x) - d.mean;
    ss += dx * dx;
  }
  d.cv = d.mean != 0 ? std::sqrt(ss / static_cast<double>(n)) / d.mean : 0.0;
  return d;
}

Result<CorpusStats> corpus_stats(const Corpus& corpus) {
  CorpusStats s;
  s.kind = corpus.kind;
  std::vector<std::int64_t> lengths;
  std::vector<std::int64_t> tokens, workloads;
  auto add_length = [&](std::int64_t l, const std::string& where) -> Status {
    if (l <= 0) {
      return invalid_input(corpus.source + ": " + where + " has length " + std::to_string(l) +
                           "; lengths must be positive");
    }
    auto t = checked_add(s.total_tokens, l);
    if (!t) return invalid_input(corpus.source + ": total token count exceeds the 64-bit range");
    s.total_tokens = *t;
    lengths.push_back(l);
    return {};
  };
  if (corpus.kind == CorpusKind::kRaw) {
    lengths.reserve(corpus.raw_lengths.size());
    for (std::size_t i = 0; i < corpus.raw_lengths.size(); ++i) {
      LIBRA_TRY(add_length(corpus.raw_lengths[i], "sample " + std::to_string(i)));
    }
  } else {
    for (std::size_t i = 0; i < corpus.packed.size(); ++i) {
      const PackedSequence& seq = corpus.packed[i];
      if (seq.empty()) return invalid_input(corpus.source + ": packed sequence " + std::to_string(i) + " is empty");
      std::int64_t t = 0;
      for (std::int64_t l : seq) {
        LIBRA_TRY(add_length(l, "a sample of packed sequence " + std::to_string(i)));
        t += l;  // bounded by total_tokens, checked above
      }
      auto f = workload_proxy(seq);
      if (!f.ok()) {
        return invalid_input(corpus.source + ": packed sequence " + std::to_string(i) + ": " + f.error().message());
      }
      tokens.push_back(t);
      workloads.push_back(*f);
    }
  }
  if (lengths.empty()) return invalid_input(corpus.source + ": the corpus has no samples");
  s.samples = static_cast<std::int64_t>(lengths.size());
  s.lengths = distribution_of(lengths);
  if (corpus.kind == CorpusKind::kPacked) {
    s.tokens_per_sequence = distribution_of(tokens);
    s.workloads = distribution_of(workloads);
  }
  return s;
}

}  // namespace libra
