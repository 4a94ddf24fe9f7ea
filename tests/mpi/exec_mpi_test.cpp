// MPI test program: runs the executor test bodies shared with the in-process
// GoogleTest program (src/exec/exec_test_bodies.hpp) over MPI_COMM_WORLD.
//
//   mpirun --oversubscribe -np 4 libra_exec_mpi_test all
//   mpirun --oversubscribe -np 8 libra_exec_mpi_test pools   # two W=4 pools side by side
//
// Every rank runs every body; rank 0 prints one line per failure and the
// program exits 1 on every rank when any rank failed.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "exec/exec_test_bodies.hpp"
#include "libra/comm.hpp"
#include "libra/comm_mpi.hpp"

namespace {

using namespace libra;

int run(const std::string& what) {
  if (Status s = mpi_init(); !s.ok()) {
    std::fprintf(stderr, "libra_exec_mpi_test: %s\n", s.message().c_str());
    return 2;
  }
  auto world_or = mpi_world();
  if (!world_or.ok()) {
    std::fprintf(stderr, "libra_exec_mpi_test: %s\n", world_or.error().message().c_str());
    return 2;
  }
  Communicator& world = **world_or;
  const int w = world.size();
  int failures = 0, ran = 0;
  auto report = [&](const std::string& name, const Status& local) {
    ++ran;
    // Every rank learns whether any rank failed this body.
    Status all = agree_on_status(world, local, name);
    if (!local.ok()) std::fprintf(stderr, "FAIL rank %d: %s: %s\n", world.rank(), name.c_str(), local.message().c_str());
    if (!all.ok()) ++failures;
  };
  if (what == "all" || what == "comm") report("comm_basics", exec_test::comm_basics(world));
  if (what == "all" || what == "exec") {
    for (const exec_test::ExecCase& c : exec_test::case_matrix(w)) report(c.name(), exec_test::exec_case(world, c));
    for (const exec_test::ExecCase& c : exec_test::zigzag_cases(w)) report(c.name(), exec_test::exec_case(world, c));
    // Relayed: a stage exchange in flight beside the main one, over MPI.
    for (const exec_test::ExecCase& c : exec_test::relay_cases(w)) report(c.name(), exec_test::exec_case(world, c));
  }
  if (what == "all" || what == "mismatch") {
    exec_test::ExecCase c;
    c.pool_size = w / c.cp;
    report("mismatch", exec_test::mismatch_case(world, c));
  }
  if (what == "pools") {
    // Pools of W = 4 (P = 2, CP = 2) side by side, as `libra exec` runs a
    // job: run_check splits the world, ranks numbered inside a pool as the
    // contract numbers workers, each pool its own sequences.
    exec_test::ExecCase c;
    c.pool_seed = 100;
    c.chunks = 2;
    c.heads_q = 8;
    report(fmt::format("{} pools of W = 4", w / 4), exec_test::exec_case(world, c));
  }
  if (what == "mpi-pools") {
    // The same, with the pools made by the caller's own MPI_Comm_split and
    // handed to libra: a communicator from any MPI_Comm.
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, world.rank() / 4, world.rank(), &sub);
    {
      auto pool = make_mpi_communicator(sub);
      if (!pool.ok()) {
        report("make_mpi_communicator", pool.error());
      } else {
        exec_test::ExecCase c;
        c.pool_seed = 200 + static_cast<std::uint64_t>(world.rank() / 4);
        c.chunks = 4;
        c.heads_q = 8;
        c.mode = "tap-split";
        report(fmt::format("MPI_Comm pool {} of {}", world.rank() / 4, w / 4), exec_test::exec_case(**pool, c));
        report("comm_basics on an MPI_Comm pool", exec_test::comm_basics(**pool));
      }
    }
    MPI_Comm_free(&sub);
  }
  if (world.rank() == 0) std::printf("libra_exec_mpi_test %s: %d ranks, %d bodies, %d failed\n", what.c_str(), w, ran, failures);
  world_or->reset();
  mpi_finalize();
  return failures == 0 && ran > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return run(argc > 1 ? argv[1] : "all"); }
