// libra_corpus_fit: the calibration statistics of one generator setting, the
// evaluator behind bench/fit-corpora.py (docs/corpora.md, "Calibration").
//   libra_corpus_fit MEDIAN P99 L SAMPLES SEED WINDOWS GROUPINGS ALPHA CAP [ALPHA CAP ...]
// prints, per (alpha, cap): alpha cap median p99 random8 random64 vrsp8
// over the first WINDOWS windows of GBS 128 (0: all), random R-1 the mean of
// GROUPINGS seeded groupings per window, exactly as libra_sim_tests measures
// the builtins (calibration_stats).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "corpus/generator.hpp"
#include "libra/packing.hpp"
#include "libra/simulator.hpp"

int main(int argc, char** argv) {
  if (argc < 10 || (argc - 8) % 2 != 0) {
    std::fprintf(stderr, "usage: libra_corpus_fit MEDIAN P99 L SAMPLES SEED WINDOWS GROUPINGS ALPHA CAP [ALPHA CAP ...]\n");
    return 2;
  }
  const double median = std::atof(argv[1]), p99 = std::atof(argv[2]);
  const std::int64_t seq_len = std::atoll(argv[3]), samples = std::atoll(argv[4]);
  const std::uint64_t seed = std::strtoull(argv[5], nullptr, 0);
  const std::int64_t windows = std::atoll(argv[6]), groupings = std::atoll(argv[7]);
  const std::vector<std::int64_t> ps = {8, 64};
  for (int i = 8; i + 1 < argc; i += 2) {
    const double alpha = std::atof(argv[i]), cap = std::atof(argv[i + 1]);
    const libra::detail::LengthModel model(median, p99, alpha, seq_len, cap);
    auto lengths = libra::detail::generate_lengths(model, samples, seed);
    auto packed = libra::pack(lengths, {.seq_len = seq_len});
    if (!packed.ok()) {
      std::fprintf(stderr, "%s\n", packed.error().message().c_str());
      return 2;
    }
    std::span<const libra::PackedSequence> seqs = packed->sequences;
    if (windows > 0) seqs = seqs.first(std::min<std::size_t>(seqs.size(), static_cast<std::size_t>(windows * 128)));
    auto st = libra::calibration_stats(seqs, 128, ps, groupings);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().message().c_str());
      return 2;
    }
    std::sort(lengths.begin(), lengths.end());
    // Nearest-rank percentiles, as libra corpus stats reports them.
    auto rank = [&](double p) { return lengths[static_cast<std::size_t>(std::ceil(p * static_cast<double>(lengths.size()) / 100)) - 1]; };
    std::printf("%.4f %.4f %lld %lld %.4f %.4f %.5f\n", alpha, cap, static_cast<long long>(rank(50)),
                static_cast<long long>(rank(99)), st->random[0].second, st->random[1].second, st->vrsp[0].second);
    std::fflush(stdout);
  }
  return 0;
}
