// libra/comm.hpp: the communicator the executors talk through.
//
// Defines `libra::Communicator`: one non-blocking all-to-all-v (post, then
// wait), barrier, allgather of one 64-bit value, split and abort. That is all
// the executors need: every (phase, pipeline chunk) of a schedule
// (libra/schedule.hpp) is one all-to-all-v, posted and waited on. It has no
// tags and no polling, so NCCL grouped send/recv and torch.distributed's
// all_to_all_single implement it directly. Implementations, each one class
// (its table of virtual functions) in its own file of src/exec:
//   - in-process (`run_in_process`, comm_inprocess.cpp): W ranks are W
//     threads of one process, so executor tests run without mpirun and the
//     same test bodies run over every communicator;
//   - loopback (`make_loopback_communicator`, comm_loopback.cpp): one rank
//     alone, for measuring its compute;
//   - MPI (libra/comm_mpi.hpp, comm_mpi.cpp; when built with LIBRA_WITH_MPI):
//     point-to-point messages on a duplicate of any MPI communicator.
//
//   std::vector<libra::Status> s = libra::run_in_process(4, [](libra::Communicator& c) {
//     std::vector<std::byte> out(4 * 8), in(4 * 8);   // 8 bytes to and from every rank
//     std::vector<std::int64_t> n(4, 8), at = {0, 8, 16, 24};
//     LIBRA_ASSIGN_OR_RETURN(libra::PendingExchange p, c.post({out, n, at, in, n, at}));
//     return c.wait(p);
//   });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/status.hpp"

namespace libra {

// The buffers of one all-to-all-v, indexed by peer (this rank included):
// bytes send[send_displs[p], + send_counts[p]) go to peer p, and
// recv_counts[p] bytes from peer p land at recv[recv_displs[p]..]. A rank's
// recv_counts[p] must equal peer p's send_counts[rank]; implementations that
// can see both sides report a difference as an error.
struct AllToAllV {
  std::span<const std::byte> send;
  std::span<const std::int64_t> send_counts, send_displs;
  std::span<std::byte> recv;
  std::span<const std::int64_t> recv_counts, recv_displs;
};

// A posted exchange; completed (and invalidated) by wait.
struct PendingExchange {
  std::int64_t id = -1;
  bool valid() const noexcept { return id >= 0; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Posts one all-to-all-v without blocking. Every rank posts the same
  // sequence of exchanges (this is how messages are matched: no tags); the
  // buffers stay alive and the send bytes unchanged until wait returns.
  // Several exchanges may be in flight; they may be waited on in any order.
  [[nodiscard]] virtual Result<PendingExchange> post(const AllToAllV& x) = 0;
  // Blocks until the exchange completed; invalidates it.
  [[nodiscard]] virtual Status wait(PendingExchange& x) = 0;
  // Lets the library move posted exchanges while the caller computes (MPI
  // progresses non-blocking collectives only inside MPI calls). Default:
  // nothing to do.
  [[nodiscard]] virtual Status progress() { return Status(); }

  [[nodiscard]] virtual Status barrier() = 0;
  // Every rank's value, indexed by rank.
  [[nodiscard]] virtual Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) = 0;
  // A sub-communicator of the ranks passing the same color, ordered by key
  // (then by rank): MPI_Comm_split.
  [[nodiscard]] virtual Result<std::unique_ptr<Communicator>> split(int color, int key) = 0;
  // Ends every rank of the job after printing `message` (one line) on stderr
  // (MPI). For failures that other ranks cannot learn of in any other way.
  // In-process it ends the calling rank's thread only, printing nothing:
  // its peers fail in turn, and run_in_process reports the first failure.
  [[noreturn]] virtual void abort(const std::string& message) = 0;
};

// Helpers built on the interface.
// post + wait.
[[nodiscard]] Status exchange(Communicator& comm, const AllToAllV& x);
// An allgather through post/wait, for transports whose own collective
// cannot time out (a silent peer is then named by wait, not waited on).
[[nodiscard]] Result<std::vector<std::uint64_t>> allgather_by_exchange(Communicator& comm, std::uint64_t value);
// The agreement before work, whatever moves its bytes: every rank gathers
// every rank's `words` with the length of its problem (empty: none), and
// only when some rank has one, every rank's problem; all ranks then hold the
// same gathered values and decide alike. agree_on_status runs it on a
// Communicator; libra.torch runs the same function through the binding, its
// transports torch all-gathers (python/libra/torch/runtime.py). A transport
// error (a silent peer) is returned as it is.
struct AgreeTransport {
  // Every rank's words (the same count from each), by rank.
  std::function<Result<std::vector<std::vector<std::int64_t>>>(const std::vector<std::int64_t>&)> gather_words;
  // Every rank's bytes, by rank.
  std::function<Result<std::vector<std::string>>(const std::string&)> gather_bytes;
};
struct Agreement {
  std::vector<std::vector<std::int64_t>> words;  // every rank's words, by rank
  std::vector<std::string> problems;             // by rank; empty: none
  std::vector<int> failed;                       // the ranks with a problem, increasing
};
[[nodiscard]] Result<Agreement> agree(const AgreeTransport& transport, std::vector<std::int64_t> words,
                                      const std::string& problem);
// Every rank learns whether every rank succeeded, and if not, the same error
// on every rank: the lowest failed rank's message, naming the failed ranks
// unless all failed alike (e.g. "q has 10 values, expected 12 (rank(s) 2 of
// 4)"), so all ranks stop together and the job prints one line. agree() on
// `comm`.
[[nodiscard]] Status agree_on_status(Communicator& comm, const Status& local, const std::string& what);
// Gathers a variable-size byte string from every rank on `root` (result is
// empty on the other ranks). Collective.
[[nodiscard]] Result<std::vector<std::string>> gather_strings(Communicator& comm, int root, const std::string& mine);
// Ranks agree on `value` (agree() on `comm`): on a difference every rank
// returns the same error with `code`, "{what} across the N ranks: rank(s)
// 0,1,2 hold 5c0f...; rank(s) 3 hold 91aa...; {hint}" (groups in the order
// of their lowest rank).
[[nodiscard]] Status agree_on_value(Communicator& comm, std::uint64_t value, const std::string& what,
                                    const std::string& hint, ErrorCode code);
// The same for what an executor runs: a kMismatch "{what} fingerprint
// mismatch across the N ranks: ...; every rank must build or load the same {what}".
[[nodiscard]] Status agree_on_fingerprint(Communicator& comm, std::uint64_t fingerprint, const std::string& what);
// FNV-1a of `bytes`: a value every rank computes alike, to agree on.
[[nodiscard]] std::uint64_t fingerprint_of(std::string_view bytes);

// ---- in-process ----------------------------------------------------------

// Runs `body` on `size` threads, each holding rank i of one in-process
// world, and returns each rank's status. Each byte is copied once, from the
// sender's send buffer into the receiver's receive buffer, by whichever rank
// is waiting when both have posted. A wait that does not find a peer's data
// within `timeout_ms` fails with an error instead of hanging; any error from
// post or wait withdraws this rank's posted exchanges (the peers' waits on
// them fail at once).
// A rank whose thread ends (returns, or throws) posts nothing more: peers
// waiting for it fail at once. abort() ends only the calling rank's thread
// (its status carries the message). `first_failed`, if given, receives the
// rank whose failure came first and was not caused by another rank's (-1
// if none failed): the one line a job reports.
std::vector<Status> run_in_process(int size, const std::function<Status(Communicator&)>& body,
                                   int timeout_ms = 60000, int* first_failed = nullptr);

// ---- loopback --------------------------------------------------------------

// A stand-in world of `size` ranks in which only rank `rank` exists, for
// measuring one rank's compute alone (`libra bench exec`): the bytes to self
// are copied, other peers' receive buffers are left unchanged, allgather
// returns this rank's value for every rank, split returns a loopback of the
// same rank and size.
std::unique_ptr<Communicator> make_loopback_communicator(int rank, int size);

// ---- MPI -----------------------------------------------------------------
// (make_mpi_communicator(MPI_Comm) is in libra/comm_mpi.hpp.)

// True when libra was built with the MPI communicator.
bool mpi_built();
// Initialises MPI once per process (no-op when already initialised);
// errors when libra was built without MPI.
[[nodiscard]] Status mpi_init();
// Finalises MPI if this process initialised it through mpi_init.
void mpi_finalize();
// A communicator over MPI_COMM_WORLD whose waits fail after `timeout_s`
// seconds without data from a peer (libra/comm_mpi.hpp). Requires mpi_init.
[[nodiscard]] Result<std::unique_ptr<Communicator>> mpi_world(double timeout_s = 300);
// This process is one of a job mpirun (OpenMPI, or a PMI launcher) started,
// whether or not libra was built with MPI; and its rank there (-1 unknown).
bool mpi_launched();
int mpi_launcher_rank();

// ---- worlds started by a launcher ------------------------------------------

// A transport whose processes a launcher starts: how a process tells it is
// one of them, and how it joins the job's world. `libra exec` runs over the
// registered world whose launcher started it (else in-process ranks, --ranks).
// One line each in src/exec/registry.cpp: a new transport is its own files
// (a class deriving from Communicator) and that line.
struct LaunchedWorld {
  const char* name;      // "mpi"
  const char* launcher;  // named in messages: "mpirun"
  const char* start;     // how a user starts N ranks: "mpirun -np N"
  bool (*launched)();    // this process is one rank of a job the launcher started
  int (*launcher_rank)();  // its rank from the launcher's environment, -1 unknown (who prints before the world exists)
  Status (*init)();        // once per process, before world
  Result<std::unique_ptr<Communicator>> (*world)(double timeout_s);  // waits fail after timeout_s without a peer
  void (*finalize)();      // after the last communicator is gone
};
[[nodiscard]] std::span<const LaunchedWorld> launched_worlds();
// The registered world whose launcher started this process, or null.
[[nodiscard]] const LaunchedWorld* launched_world();

}  // namespace libra
