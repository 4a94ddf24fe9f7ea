// libra/comm_mpi.hpp: a libra::Communicator over any MPI communicator.
//
// Defines make_mpi_communicator, available when libra is built with MPI
// (LIBRA_WITH_MPI; mpi_built() says so) and compiled with MPI on the include
// path (link MPI::MPI_CXX; libra.hpp does not include this header). The communicator works on a
// duplicate of `comm` (MPI_Comm_dup, collective over comm), so libra's
// exchanges never match the caller's own messages; the caller keeps `comm`.
// Each all-to-all-v is one non-blocking send and receive per peer; a wait
// (and allgather, barrier, split) that hears nothing from a peer for
// `timeout_s` seconds fails with an error naming it, and the communicator
// is broken from then on (every later call fails alike).
//
//   MPI_Comm pool;
//   MPI_Comm_split(MPI_COMM_WORLD, my_pool, rank, &pool);
//   libra::Result<std::unique_ptr<libra::Communicator>> c = libra::make_mpi_communicator(pool);
//   auto ex = libra::make_plan_executor(**c, plan, {});
#pragma once

#include <mpi.h>

#include <memory>

#include "libra/comm.hpp"

namespace libra {

// Requires MPI initialised (mpi_init or the caller's MPI_Init).
[[nodiscard]] Result<std::unique_ptr<Communicator>> make_mpi_communicator(MPI_Comm comm, double timeout_s = 300);

}  // namespace libra
