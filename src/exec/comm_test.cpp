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

TEST(InProcessCommunicator, AWaitWithNoPeerTimesOutInsteadOfHanging) {
  auto st = run_in_process(
      2,
      [](Communicator& c) -> Status {
        if (c.rank() == 1) return Status();  // never posts
        return one_way(c, 0, 0);
      },
      200);
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("no data from rank 1 for exchange 0"), std::string::npos) << st[0].message();
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
