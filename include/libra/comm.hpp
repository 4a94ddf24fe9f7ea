// libra/comm.hpp: the communicator the executors talk through.
//
// Defines `libra::Communicator`, one small interface over the few collective
// and point-to-point operations the distributed executors need (non-blocking
// byte sends and receives with request handles, barrier, allgather of one
// 64-bit value, split, abort), and two implementations:
//   - MPI (`mpi_world`, available when libra is built with LIBRA_WITH_MPI),
//     for runs under `mpirun`;
//   - in-process (`run_in_process`), where W ranks are W threads of one
//     process sharing a mailbox, so executor tests run without mpirun and the
//     same test bodies run over both.
//
//   std::vector<libra::Status> s = libra::run_in_process(4, [](libra::Communicator& c) {
//     std::uint64_t mine = 10 + c.rank();
//     LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, c.allgather(mine));
//     return libra::Status();
//   });
//
// Tags: callers use tags in [0, kMaxUserTag); larger tags are reserved for
// the collectives that implementations build from point-to-point messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "libra/status.hpp"

namespace libra {

inline constexpr int kMaxUserTag = 1 << 20;

// A pending non-blocking operation; completed (and invalidated) by wait_all.
struct Request {
  std::int64_t id = -1;
  bool valid() const noexcept { return id >= 0; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Non-blocking send/receive of raw bytes. The buffer must stay alive and
  // unchanged until the request completes. A receive must be posted with
  // exactly the size of the matching send (a different size is an error).
  virtual Result<Request> isend(int dest, int tag, std::span<const std::byte> data) = 0;
  virtual Result<Request> irecv(int source, int tag, std::span<std::byte> data) = 0;

  // Blocks until every valid request completes; they are invalidated.
  virtual Status wait_all(std::span<Request> requests) = 0;
  // Drives progress without blocking; true (and the requests invalidated)
  // when all have completed. Executors call it between kernel calls so that
  // transfers advance while they compute.
  virtual Result<bool> test_all(std::span<Request> requests) = 0;

  virtual Status barrier() = 0;
  // Every rank's value, indexed by rank.
  virtual Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) = 0;
  // A sub-communicator of the ranks passing the same color, ordered by key
  // (then by rank): MPI_Comm_split.
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key) = 0;
  // Ends every rank of the job after printing `message` (one line) on stderr.
  // For failures that other ranks cannot learn of in any other way.
  [[noreturn]] virtual void abort(const std::string& message) = 0;
};

// Helpers built on the interface.
// Every rank learns whether every rank succeeded. Returns `local` on a rank
// that failed, and on the other ranks an error naming the failed ranks, so
// all ranks stop together instead of some waiting forever.
[[nodiscard]] Status agree_on_status(Communicator& comm, const Status& local, const std::string& what);

// Gathers a variable-size byte string from every rank on `root` (result is
// empty on the other ranks).
[[nodiscard]] Result<std::vector<std::string>> gather_strings(Communicator& comm, int root,
                                                              const std::string& mine, int tag);

// ---- in-process ----------------------------------------------------------

// Runs `body` on `size` threads, each holding rank i of one in-process
// world, and returns each rank's status. A receive that does not find its
// message within `timeout_ms` fails with an error instead of hanging.
std::vector<Status> run_in_process(int size, const std::function<Status(Communicator&)>& body,
                                   int timeout_ms = 60000);

// ---- loopback --------------------------------------------------------------

// A stand-in world of `size` ranks in which only rank `rank` exists, for
// measuring one rank's compute alone (`libra bench exec`): sends vanish,
// receives complete at once and leave their buffers unchanged, allgather
// returns this rank's value for every rank, split returns a loopback of the
// same rank and size.
std::unique_ptr<Communicator> make_loopback_communicator(int rank, int size);

// ---- MPI -----------------------------------------------------------------

// True when libra was built with the MPI communicator.
bool mpi_built();
// Initialises MPI once per process (no-op when already initialised);
// errors when libra was built without MPI.
[[nodiscard]] Status mpi_init();
// Finalises MPI if this process initialised it through mpi_init.
void mpi_finalize();
// The world communicator (MPI_COMM_WORLD). Requires mpi_init.
[[nodiscard]] Result<std::unique_ptr<Communicator>> mpi_world();

}  // namespace libra
