#include "libra/comm.hpp"

#include <gtest/gtest.h>

#include <atomic>

#include "exec/exec_test_bodies.hpp"

namespace libra {
namespace {

void expect_all_ok(const std::vector<Status>& st) {
  for (std::size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].message();
}

TEST(InProcessCommunicator, PassesTheSharedCommunicatorBody) {
  for (int w : {1, 2, 3, 4, 8}) expect_all_ok(run_in_process(w, exec_test::comm_basics));
}

TEST(InProcessCommunicator, ReportsAReceiveOfTheWrongSize) {
  auto st = run_in_process(2, [](Communicator& c) -> Status {
    std::vector<std::byte> buf(c.rank() == 0 ? 8 : 4);
    std::vector<Request> reqs;
    if (c.rank() == 0) {
      LIBRA_ASSIGN_OR_RETURN(Request r, c.isend(1, 3, buf));
      reqs.push_back(r);
    } else {
      LIBRA_ASSIGN_OR_RETURN(Request r, c.irecv(0, 3, buf));
      reqs.push_back(r);
    }
    return c.wait_all(reqs);
  });
  EXPECT_TRUE(st[0].ok());
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("has 8 bytes, expected 4"), std::string::npos) << st[1].message();
}

TEST(InProcessCommunicator, AReceiveWithNoSenderTimesOutInsteadOfHanging) {
  auto st = run_in_process(
      2,
      [](Communicator& c) -> Status {
        if (c.rank() == 1) return Status();
        std::vector<std::byte> buf(4);
        std::vector<Request> reqs;
        LIBRA_ASSIGN_OR_RETURN(Request r, c.irecv(1, 9, buf));
        reqs.push_back(r);
        return c.wait_all(reqs);
      },
      200);
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("no message from rank 1 with tag 9"), std::string::npos) << st[0].message();
}

TEST(InProcessCommunicator, RejectsPeersOutsideTheWorld) {
  auto st = run_in_process(2, [](Communicator& c) -> Status {
    std::vector<std::byte> buf(4);
    return c.isend(5, 0, buf).status();
  });
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("rank 5 outside [0, 2)"), std::string::npos);
}

TEST(InProcessCommunicator, TestAllCompletesOnlyOnceTheMessageArrived) {
  std::atomic<int> stage{0};
  auto st = run_in_process(2, [&](Communicator& c) -> Status {
    std::vector<std::byte> buf(4);
    std::vector<Request> reqs;
    if (c.rank() == 1) {
      while (stage.load() == 0) std::this_thread::yield();
      LIBRA_ASSIGN_OR_RETURN(Request r, c.isend(0, 1, buf));
      reqs.push_back(r);
      return c.wait_all(reqs);
    }
    LIBRA_ASSIGN_OR_RETURN(Request r, c.irecv(1, 1, buf));
    reqs.push_back(r);
    LIBRA_ASSIGN_OR_RETURN(bool done, c.test_all(reqs));
    if (done) return internal_error("test_all completed before the send");
    stage.store(1);
    return c.wait_all(reqs);
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
