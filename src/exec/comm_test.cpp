#include "libra/comm.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "exec/exec_test_bodies.hpp"

namespace libra {
namespace {

void expect_all_ok(const std::vector<Status>& st) {
  for (std::size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].message();
}

// A two-rank exchange in which rank 0 sends `n0` bytes to rank 1, which
// expects `n1`.
Status one_way(Communicator& c, std::int64_t n0, std::int64_t n1) {
  std::vector<std::byte> send(8), recv(8);
  std::vector<std::int64_t> sc(2, 0), rc(2, 0), zero(2, 0);
  if (c.rank() == 0) sc[1] = n0;
  if (c.rank() == 1) rc[0] = n1;
  return exchange(c, {send, sc, zero, recv, rc, zero});
}

TEST(InProcessCommunicator, PassesTheSharedCommunicatorBody) {
  for (int w : {1, 2, 3, 4, 8}) expect_all_ok(run_in_process(w, exec_test::comm_basics));
}

TEST(LoopbackCommunicator, MovesOnlyTheBytesToSelf) {
  auto c = make_loopback_communicator(1, 3);
  std::vector<std::byte> send = {std::byte{1}, std::byte{2}, std::byte{3}}, recv(3, std::byte{9});
  std::vector<std::int64_t> sc = {1, 1, 1}, sd = {0, 1, 2};
  ASSERT_TRUE(exchange(*c, {send, sc, sd, recv, sc, sd}).ok());
  EXPECT_EQ(recv, (std::vector<std::byte>{std::byte{9}, std::byte{2}, std::byte{9}}));
  auto all = c->allgather(5);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<std::uint64_t>{5, 5, 5}));
}

TEST(InProcessCommunicator, ReportsAReceiveOfTheWrongSize) {
  auto st = run_in_process(2, [](Communicator& c) { return one_way(c, 8, 4); });
  EXPECT_TRUE(st[0].ok());
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("rank 0 sent 8 bytes, expected 4"), std::string::npos) << st[1].message();
}

// A peer whose thread ended will post nothing more: the wait fails at once
// (it used to wait out the whole timeout), naming the peer.
TEST(InProcessCommunicator, AWaitOnAPeerThatEndedFailsAtOnce) {
  auto st = run_in_process(
      2,
      [](Communicator& c) -> Status {
        if (c.rank() == 1) return Status();  // never posts
        return one_way(c, 0, 0);
      },
      600000);
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("exchange 0: rank 1 stopped before posting it"), std::string::npos) << st[0].message();
}

// A live peer that sends nothing (stopped, not ended) is named once the
// timeout passes.
TEST(InProcessCommunicator, AWaitWithASilentPeerTimesOutNamingIt) {
  std::atomic<bool> done{false};
  auto st = run_in_process(
      2,
      [&](Communicator& c) -> Status {
        if (c.rank() == 1) {
          while (!done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return Status();
        }
        Status s = one_way(c, 0, 0);
        done.store(true);
        return s;
      },
      200);
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("no data from rank 1 for exchange 0 within the timeout of 200 ms"), std::string::npos)
      << st[0].message();
}

TEST(InProcessCommunicator, RejectsBlocksOutsideTheBuffers) {
  auto st = run_in_process(2, [](Communicator& c) -> Status {
    std::vector<std::byte> buf(4);
    std::vector<std::int64_t> n = {2, 4}, d = {0, 2}, z = {0, 0};
    return c.post({buf, n, d, buf, z, z}).status();
  });
  for (const Status& s : st) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("send block of peer 1 (4 bytes at 2) outside its buffer of 4"), std::string::npos)
        << s.message();
  }
  auto peers = run_in_process(2, [](Communicator& c) -> Status {
    std::vector<std::byte> buf(4);
    std::vector<std::int64_t> n = {0, 0, 0};
    return c.post({buf, n, n, buf, n, n}).status();
  });
  EXPECT_NE(peers[0].message().find("send counts for 3 peers in a world of 2"), std::string::npos) << peers[0].message();
}

TEST(InProcessCommunicator, PostDoesNotWaitForThePeer) {
  std::atomic<int> stage{0};
  auto st = run_in_process(2, [&](Communicator& c) -> Status {
    std::vector<std::byte> send(4, std::byte{7}), recv(4);
    std::vector<std::int64_t> sc = {0, 0}, rc = {0, 0}, z = {0, 0};
    (c.rank() == 0 ? rc[1] : sc[0]) = 4;
    if (c.rank() == 1) {
      while (stage.load() == 0) std::this_thread::yield();
      return exchange(c, {send, sc, z, recv, rc, z});
    }
    // Rank 0 posts while rank 1 has not: post returns; wait completes once
    // rank 1 posts too.
    LIBRA_ASSIGN_OR_RETURN(PendingExchange x, c.post({send, sc, z, recv, rc, z}));
    stage.store(1);
    LIBRA_TRY(c.wait(x));
    if (recv[0] != std::byte{7}) return internal_error("payload not delivered");
    return Status();
  });
  expect_all_ok(st);
}

// A wait returns only once the peer has taken this rank's send bytes: the
// sender overwrites its buffer right after its wait, before the receiver
// waits, and the receiver still gets what was sent.
TEST(InProcessCommunicator, TheSendBufferIsFreeOnceWaitReturns) {
  std::atomic<int> stage{0};
  constexpr std::int64_t kBytes = 3 << 20;  // several copy pieces
  auto st = run_in_process(2, [&](Communicator& c) -> Status {
    std::vector<std::byte> send(kBytes), recv(kBytes);
    for (std::int64_t i = 0; i < kBytes; ++i) send[static_cast<std::size_t>(i)] = static_cast<std::byte>(i % 251);
    std::vector<std::int64_t> sc = {0, 0}, rc = {0, 0}, z = {0, 0};
    (c.rank() == 0 ? sc[1] : rc[0]) = kBytes;
    LIBRA_ASSIGN_OR_RETURN(PendingExchange x, c.post({send, sc, z, recv, rc, z}));
    if (c.rank() == 0) {
      LIBRA_TRY(c.wait(x));
      std::fill(send.begin(), send.end(), std::byte{0xee});
      stage.store(1);
      return Status();
    }
    while (stage.load() == 0) std::this_thread::yield();
    LIBRA_TRY(c.wait(x));
    for (std::int64_t i = 0; i < kBytes; ++i) {
      if (recv[static_cast<std::size_t>(i)] != static_cast<std::byte>(i % 251)) {
        return internal_error(fmt::format("byte {} is {}", i, static_cast<int>(recv[static_cast<std::size_t>(i)])));
      }
    }
    return Status();
  });
  expect_all_ok(st);
}

// A rank whose wait timed out has left (its buffers freed); the peer that
// posts afterwards gets an error instead of copying into freed memory (the
// sanitizer builds would catch the write).
TEST(InProcessCommunicator, APeerPostingAfterATimeoutLearnsThatTheRankGaveUp) {
  std::atomic<int> stage{0};
  auto st = run_in_process(
      2,
      [&](Communicator& c) -> Status {
        if (c.rank() == 0) {
          auto v = std::make_unique<std::vector<std::byte>>(64);
          std::vector<std::int64_t> n = {0, 64}, z = {0, 0};
          Status s = exchange(c, {*v, z, z, *v, n, z});
          v.reset();
          stage.store(1);
          return s;
        }
        while (stage.load() == 0) std::this_thread::yield();
        std::vector<std::byte> send(64, std::byte{1}), recv(64);
        std::vector<std::int64_t> n = {64, 0}, z = {0, 0};
        return exchange(c, {send, n, z, recv, z, z});
      },
      100);
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("no data from rank 1 for exchange 0 within the timeout of 100 ms"), std::string::npos) << st[0].message();
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("exchange 0: rank 0 gave up on it"), std::string::npos) << st[1].message();
}

// A rank whose post or wait fails stops: its peers learn it from their own
// wait at once (no timeout: 5 s would fail the test's expectations), for
// that exchange and for the ones it had in flight.
TEST(InProcessCommunicator, AFailedPostOrWaitStopsTheRankForItsPeers) {
  // Rank 0's post of exchange 1 fails (a block leaves its buffer), either
  // after rank 1 posted both exchanges or before rank 1 posts anything.
  for (bool rank1_first : {true, false}) {
    std::atomic<int> stage{0};
    auto st = run_in_process(2, [&](Communicator& c) -> Status {
      std::vector<std::byte> send(8), recv(8);
      std::vector<std::int64_t> n = {4, 4}, d = {0, 4}, bad = {4, 8};
      if (c.rank() == 0) {
        while (rank1_first && stage.load() == 0) std::this_thread::yield();
        Status s = c.post({send, n, d, recv, n, d}).status();
        if (s.ok()) s = c.post({send, bad, d, recv, n, d}).status();
        stage.store(2);
        return s;
      }
      if (!rank1_first) {
        while (stage.load() == 0) std::this_thread::yield();
      }
      LIBRA_ASSIGN_OR_RETURN(PendingExchange x0, c.post({send, n, d, recv, n, d}));
      LIBRA_ASSIGN_OR_RETURN(PendingExchange x1, c.post({send, n, d, recv, n, d}));
      stage.store(std::max(stage.load(), 1));
      // Rank 1 first: its exchange 1 never pairs with rank 0's; else both of
      // rank 0's are withdrawn when rank 1 posts.
      LIBRA_TRY(c.wait(rank1_first ? x1 : x0));
      return c.wait(rank1_first ? x0 : x1);
    }, 5000);
    ASSERT_FALSE(st[0].ok());
    EXPECT_NE(st[0].message().find("outside its buffer"), std::string::npos) << st[0].message();
    ASSERT_FALSE(st[1].ok());
    const std::string want = fmt::format("exchange {}: rank 0 gave up on it", rank1_first ? 1 : 0);
    EXPECT_NE(st[1].message().find(want), std::string::npos) << st[1].message();
  }
  // Rank 1's wait on exchange 0 fails (it expects 2 bytes where 4 come), so
  // its exchange 1 is withdrawn before rank 0 posts it.
  std::atomic<int> stage{0};
  auto st = run_in_process(2, [&](Communicator& c) -> Status {
    std::vector<std::byte> send(8), recv(8);
    std::vector<std::int64_t> n = {4, 4}, d = {0, 4}, wrong = {2, 4};
    if (c.rank() == 1) {
      LIBRA_ASSIGN_OR_RETURN(PendingExchange x0, c.post({send, n, d, recv, wrong, d}));
      LIBRA_TRY(c.post({send, n, d, recv, n, d}).status());  // never waited
      Status s = c.wait(x0);
      stage.store(1);
      return s;
    }
    LIBRA_TRY(exchange(c, {send, n, d, recv, n, d}));
    while (stage.load() == 0) std::this_thread::yield();
    return exchange(c, {send, n, d, recv, n, d});
  });
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("exchange 0: rank 0 sent 4 bytes, expected 2"), std::string::npos) << st[1].message();
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("exchange 1: rank 1 gave up on it"), std::string::npos) << st[0].message();
}

// Many exchanges in flight, waited in reverse order on half of the ranks:
// every copy is done by some waiting rank, so nothing deadlocks.
TEST(InProcessCommunicator, ManyExchangesInFlightWaitedInAnyOrder) {
  auto st = run_in_process(4, [](Communicator& c) -> Status {
    constexpr int kN = 4;
    constexpr std::int64_t kBlock = (1 << 20) + 12;  // two copy pieces each
    const int r = c.rank(), w = c.size();
    std::vector<std::vector<std::byte>> send(kN), recv(kN);
    std::vector<std::int64_t> n(4, kBlock), d = {0, kBlock, 2 * kBlock, 3 * kBlock};
    std::vector<PendingExchange> x(kN);
    for (int e = 0; e < kN; ++e) {
      send[e].resize(4 * kBlock);
      recv[e].assign(4 * kBlock, std::byte{0});
      for (int p = 0; p < w; ++p) std::fill_n(send[e].begin() + d[p], kBlock, static_cast<std::byte>(e * 16 + r * 4 + p));
      LIBRA_ASSIGN_OR_RETURN(x[e], c.post({send[e], n, d, recv[e], n, d}));
    }
    for (int i = 0; i < kN; ++i) LIBRA_TRY(c.wait(x[r % 2 ? kN - 1 - i : i]));
    for (int e = 0; e < kN; ++e) {
      for (int p = 0; p < w; ++p) {
        const auto want = static_cast<std::byte>(e * 16 + p * 4 + r);
        for (std::int64_t i = 0; i < kBlock; ++i) {
          if (recv[e][d[p] + i] != want) return internal_error(fmt::format("rank {}: exchange {} peer {} byte {} wrong", r, e, p, i));
        }
      }
    }
    return Status();
  });
  expect_all_ok(st);
}

TEST(MpiCommunicator, ReportsWhetherItWasBuilt) {
  // Either way the world communicator is an error before mpi_init.
  if (!mpi_built()) {
    EXPECT_FALSE(mpi_init().ok());
    EXPECT_FALSE(mpi_world().ok());
  } else {
    SUCCEED() << "MPI communicator built; exercised by tests/mpi under mpirun";
  }
}

}  // namespace
}  // namespace libra
