// Speed of the corpus stage: generating the built-in corpora (the issue asks
// for "well under a second"), packing them, and reading a large text file.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "libra/corpus.hpp"
#include "libra/io.hpp"
#include "libra/packing.hpp"

namespace {

void BM_BuiltinGenerate(benchmark::State& state, const char* name) {
  for (auto _ : state) {
    auto c = libra::builtin_corpus(name);
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK_CAPTURE(BM_BuiltinGenerate, paper_1m, "paper-1m")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_BuiltinGenerate, paper_256k, "paper-256k")->Unit(benchmark::kMillisecond);

void BM_Pack(benchmark::State& state, libra::PackerKind kind) {
  auto c = libra::builtin_corpus("paper-1m");
  libra::PackOptions o;
  o.seq_len = c->default_seq_len;
  o.packer = kind;
  for (auto _ : state) {
    auto r = libra::pack(c->raw_lengths, o);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c->raw_lengths.size()));
}
BENCHMARK_CAPTURE(BM_Pack, sequential_paper_1m, libra::PackerKind::kSequential)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Pack, bfd_paper_1m, libra::PackerKind::kBestFitDecreasing)->Unit(benchmark::kMillisecond);

void BM_ReadTextLengths(benchmark::State& state) {
  auto c = libra::builtin_corpus("paper-1m");
  const std::string path = "/tmp/libra_corpus_bench_lengths.txt";
  if (!libra::write_file_atomic(path, libra::format_length_lines(c->raw_lengths)).ok()) {
    state.SkipWithError("cannot write the temporary file");
    return;
  }
  for (auto _ : state) {
    auto r = libra::load_corpus(path);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(c->raw_lengths.size()));
  std::remove(path.c_str());
}
BENCHMARK(BM_ReadTextLengths)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
