// The MPI communicator: one exchange per all-to-all-v on a duplicate of
// the caller's communicator, as point-to-point messages. Compiled only when LIBRA_WITH_MPI is on and
// OpenMPI was found (LIBRA_HAVE_MPI); comm.cpp holds the stand-ins otherwise.
#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <vector>
#include <map>
#include <thread>

#include "libra/comm.hpp"
#include "libra/comm_mpi.hpp"
#include "libra/io.hpp"

namespace libra {

namespace {

bool g_initialised_here = false;

std::string mpi_error_text(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<std::size_t>(len));
}

// Point-to-point sends and receives, not MPI_Ialltoallv: a request per
// peer tells which peer has sent nothing when the timeout passes, and a
// silent peer is named instead of hanging the job. Every rank posts the
// same sequence of exchanges on one tag, and MPI matches messages between
// two ranks in the order they were posted, so exchange k meets exchange k.
constexpr int kTag = 0x11b4;

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (a duplicate or a split made for libra).
  MpiCommunicator(MPI_Comm comm, double timeout_s) : comm_(comm), timeout_s_(timeout_s) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as return codes so they become libra::Error values.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // Peers are named by their MPI_COMM_WORLD rank, as mpirun numbers them.
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> local(static_cast<std::size_t>(size_));
    for (int p = 0; p < size_; ++p) local[static_cast<std::size_t>(p)] = p;
    world_rank_.resize(local.size());
    MPI_Group_translate_ranks(mine, size_, local.data(), world, world_rank_.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  ~MpiCommunicator() override {
    // After a timeout the silent peer will not answer: its requests are
    // left, and the job ends (abort) right after.
    if (!broken_) {
      for (auto& [id, p] : pending_) MPI_Waitall(static_cast<int>(p.requests.size()), p.requests.data(), MPI_STATUSES_IGNORE);
    }
    MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Result<PendingExchange> post(const AllToAllV& x) override {
    if (broken_) return *broken_;
    Pending p;
    std::vector<int> sc, sd, rc, rd;
    LIBRA_TRY(to_int(x.send_counts, sc, "send counts", x.send.size()));
    LIBRA_TRY(to_int(x.send_displs, sd, "send displacements", x.send.size()));
    LIBRA_TRY(to_int(x.recv_counts, rc, "receive counts", x.recv.size()));
    LIBRA_TRY(to_int(x.recv_displs, rd, "receive displacements", x.recv.size()));
    const auto me = static_cast<std::size_t>(rank_);
    if (sc[me] != rc[me]) {
      return internal_error(fmt::format("MPI rank {}: {} bytes to itself, {} expected", rank_, sc[me], rc[me]));
    }
    if (sc[me] > 0) std::memcpy(x.recv.data() + rd[me], x.send.data() + sd[me], static_cast<std::size_t>(sc[me]));
    // Receives first (peers' sends can match at once), then sends; every
    // peer gets a message, empty or not, so every peer is heard from.
    p.requests.assign(2 * static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const auto qu = static_cast<std::size_t>(q);
      int rcode = MPI_Irecv(x.recv.data() + rd[qu], rc[qu], MPI_BYTE, q, kTag, comm_, &p.requests[qu]);
      if (rcode != MPI_SUCCESS) return fail("MPI_Irecv", rcode);
    }
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const auto qu = static_cast<std::size_t>(q);
      int rcode = MPI_Isend(x.send.data() + sd[qu], sc[qu], MPI_BYTE, q, kTag, comm_,
                            &p.requests[static_cast<std::size_t>(size_) + qu]);
      if (rcode != MPI_SUCCESS) return fail("MPI_Isend", rcode);
    }
    const std::int64_t id = next_id_++;
    pending_.emplace(id, std::move(p));
    return PendingExchange{id};
  }

  // Polls instead of blocking in MPI_Wait: OpenMPI's blocking wait spins
  // on the CPU, which on an oversubscribed machine (more ranks than cores,
  // as in CI) takes the core away from the ranks that are computing. After
  // a short spin the poll sleeps 50 us between tests; MPI_Test still drives
  // progress. A peer that sends nothing for the timeout is named.
  Status wait(PendingExchange& x) override {
    if (broken_) return *broken_;
    auto it = pending_.find(x.id);
    if (it == pending_.end()) return internal_error(fmt::format("MPI rank {}: unknown exchange {}", rank_, x.id));
    std::vector<MPI_Request>& req = it->second.requests;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int spin = 0;; ++spin) {
      int flag = 0;
      int rc = MPI_Testall(static_cast<int>(req.size()), req.data(), &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return fail("MPI_Testall", rc);
      if (flag) break;
      // Other exchanges in flight move too (non-blocking operations
      // progress only inside MPI calls).
      LIBRA_TRY(progress());
      if (spin >= 64) {
        if (std::chrono::steady_clock::now() > deadline) return timed_out(x.id, req);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    pending_.erase(it);
    x.id = -1;
    return Status();
  }

  Status progress() override {
    for (auto& [id, p] : pending_) {
      if (p.done) continue;
      int flag = 0;
      int rc = MPI_Testall(static_cast<int>(p.requests.size()), p.requests.data(), &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) return fail("MPI_Testall", rc);
      // Completed requests become MPI_REQUEST_NULL; a later test returns at once.
      if (flag) p.done = true;
    }
    return Status();
  }

  Status barrier() override { return allgather(0).status(); }

  // Through the same point-to-point exchange, so that a silent peer is named
  // here too (MPI_Allgather would block forever).
  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    return allgather_by_exchange(*this, value);
  }

  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    // Every rank is heard from (with the timeout) before the blocking split.
    LIBRA_TRY(barrier());
    MPI_Comm sub;
    int rc = MPI_Comm_split(comm_, color, key, &sub);
    if (rc != MPI_SUCCESS) return fail("MPI_Comm_split", rc);
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(sub, timeout_s_));
  }

  [[noreturn]] void abort(const std::string& message) override {
    write_stderr_line("libra: error: " + message);
    MPI_Abort(comm_, 1);
    std::abort();
  }

 private:
  struct Pending {
    std::vector<MPI_Request> requests;  // receives by peer, then sends by peer
    bool done = false;
  };

  // The silent peer is the lowest whose receive has not completed, else
  // the lowest that has not taken this rank's send (a peer that stopped
  // after posting: its message arrived, but it takes nothing more).
  // MPI_Testall leaves every request alone unless all completed.
  Status timed_out(std::int64_t id, std::vector<MPI_Request>& req) {
    int silent = -1;
    for (int q = 0; q < 2 * size_ && silent < 0; ++q) {
      int flag = 1;
      if (q % size_ != rank_) MPI_Test(&req[static_cast<std::size_t>(q)], &flag, MPI_STATUS_IGNORE);
      if (!flag) silent = q % size_;
    }
    const int me = world_rank_[static_cast<std::size_t>(rank_)];
    const int who = silent < 0 ? -1 : world_rank_[static_cast<std::size_t>(silent)];
    broken_ = internal_error(
        silent < 0 ? fmt::format("MPI rank {}: exchange {} not delivered within the timeout of {:g} s", me, id, timeout_s_)
                   : fmt::format("MPI rank {}: no answer from rank {} for exchange {} within the timeout of {:g} s (rank {} "
                                 "stopped or is too slow)",
                                 me, who, id, timeout_s_, who));
    return *broken_;
  }

  // MPI counts and displacements are int: a block or offset past 2 GiB is
  // refused with a message instead of wrapping.
  Status to_int(std::span<const std::int64_t> v, std::vector<int>& out, const char* what, std::size_t buffer) const {
    if (v.size() != static_cast<std::size_t>(size_)) {
      return internal_error(fmt::format("MPI rank {}: {} for {} peers in a communicator of {}", rank_, what, v.size(), size_));
    }
    out.resize(v.size());
    for (std::size_t p = 0; p < v.size(); ++p) {
      if (v[p] < 0 || v[p] > INT_MAX || static_cast<std::uint64_t>(v[p]) > buffer) {
        return invalid_input(fmt::format("MPI rank {}: {} entry {} for rank {} exceeds the 2 GiB MPI count limit or the "
                                         "{}-byte buffer; use more pipeline chunks (--chunks) to shrink each exchange",
                                         rank_, what, v[p], p, buffer));
      }
      out[p] = static_cast<int>(v[p]);
    }
    return Status();
  }

  Error fail(const char* call, int rc) const {
    return internal_error(fmt::format("MPI rank {}: {} failed: {}", rank_, call, mpi_error_text(rc)));
  }

  MPI_Comm comm_;
  double timeout_s_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_rank_;
  std::int64_t next_id_ = 0;
  std::map<std::int64_t, Pending> pending_;
  std::optional<Error> broken_;  // set by a timeout: every later call fails alike
};

}  // namespace

bool mpi_built() { return true; }

Status mpi_init() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return Status();
  if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return internal_error("MPI_Init failed");
  g_initialised_here = true;
  return Status();
}

void mpi_finalize() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (g_initialised_here && !finalised) MPI_Finalize();
}

Result<std::unique_ptr<Communicator>> make_mpi_communicator(MPI_Comm comm, double timeout_s) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return internal_error("make_mpi_communicator: MPI is not initialised (call mpi_init first)");
  MPI_Comm dup;
  int rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) return internal_error("MPI_Comm_dup failed: " + mpi_error_text(rc));
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(dup, timeout_s));
}

Result<std::unique_ptr<Communicator>> mpi_world(double timeout_s) { return make_mpi_communicator(MPI_COMM_WORLD, timeout_s); }

}  // namespace libra
