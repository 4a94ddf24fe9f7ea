// In-process communicator throughput: W ranks (threads) exchange a block of
// B bytes with every other rank, 64 exchanges per iteration, two in flight
// as in the executor's pipeline (post m+1, wait m). Bytes counted are those
// delivered to other ranks, so the figure is directly comparable across
// implementations that copy each byte once or more.
//
//   libra_comm_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cstdio>
#include <vector>

#include "libra/comm.hpp"

namespace {

constexpr int kExchanges = 64;

void BM_InProcessAllToAll(benchmark::State& state) {
  const int w = static_cast<int>(state.range(0));
  const std::int64_t block = state.range(1);
  const auto wu = static_cast<std::size_t>(w);
  for (auto _ : state) {
    std::vector<libra::Status> st = libra::run_in_process(w, [&](libra::Communicator& c) -> libra::Status {
      std::vector<std::int64_t> n(wu, block), d(wu);
      for (std::size_t p = 0; p < wu; ++p) d[p] = static_cast<std::int64_t>(p) * block;
      n[static_cast<std::size_t>(c.rank())] = 0;  // as the executor: self blocks are its own business
      std::vector<std::byte> send[2] = {std::vector<std::byte>(wu * static_cast<std::size_t>(block), std::byte{1}),
                                        std::vector<std::byte>(wu * static_cast<std::size_t>(block), std::byte{2})};
      std::vector<std::byte> recv[2] = {std::vector<std::byte>(send[0].size()), std::vector<std::byte>(send[0].size())};
      libra::PendingExchange x[2];
      LIBRA_ASSIGN_OR_RETURN(x[0], c.post({send[0], n, d, recv[0], n, d}));
      for (int e = 0; e < kExchanges; ++e) {
        const int now = e % 2, next = 1 - now;
        if (e + 1 < kExchanges) {
          LIBRA_ASSIGN_OR_RETURN(x[next], c.post({send[next], n, d, recv[next], n, d}));
        }
        LIBRA_TRY(c.wait(x[now]));
      }
      return libra::Status();
    });
    for (const libra::Status& s : st) {
      if (!s.ok()) {
        state.SkipWithError(s.message().c_str());
        return;
      }
    }
  }
  state.SetBytesProcessed(state.iterations() * kExchanges * w * (w - 1) * block);
}
BENCHMARK(BM_InProcessAllToAll)
    ->ArgsProduct({{2, 4, 8}, {64 << 10, 1 << 20, 4 << 20}})
    ->ArgNames({"W", "B"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
