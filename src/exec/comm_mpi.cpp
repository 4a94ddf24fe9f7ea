// The MPI communicator: one MPI_Ialltoallv per exchange on a duplicate of
// the caller's communicator. Compiled only when LIBRA_WITH_MPI is on and
// OpenMPI was found (LIBRA_HAVE_MPI); comm.cpp holds the stand-ins otherwise.
#include <fmt/format.h>

#include <chrono>
#include <climits>
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

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (a duplicate or a split made for libra).
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as return codes so they become libra::Error values.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    for (auto& [id, p] : pending_) {
      if (p.request != MPI_REQUEST_NULL) MPI_Wait(&p.request, MPI_STATUS_IGNORE);
    }
    MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Result<PendingExchange> post(const AllToAllV& x) override {
    Pending p;
    LIBRA_TRY(to_int(x.send_counts, p.sc, "send counts", x.send.size()));
    LIBRA_TRY(to_int(x.send_displs, p.sd, "send displacements", x.send.size()));
    LIBRA_TRY(to_int(x.recv_counts, p.rc, "receive counts", x.recv.size()));
    LIBRA_TRY(to_int(x.recv_displs, p.rd, "receive displacements", x.recv.size()));
    // MPI reads the count arrays until completion: they live in `pending_`.
    const std::int64_t id = next_id_++;
    Pending& q = pending_.emplace(id, std::move(p)).first->second;
    int rc = MPI_Ialltoallv(x.send.data(), q.sc.data(), q.sd.data(), MPI_BYTE, x.recv.data(), q.rc.data(), q.rd.data(),
                            MPI_BYTE, comm_, &q.request);
    if (rc != MPI_SUCCESS) {
      pending_.erase(id);
      return fail("MPI_Ialltoallv", rc);
    }
    return PendingExchange{id};
  }

  // Polls instead of blocking in MPI_Wait: OpenMPI's blocking wait spins
  // on the CPU, which on an oversubscribed machine (more ranks than cores,
  // as in CI) takes the core away from the ranks that are computing. After
  // a short spin the poll sleeps 50 us between tests; MPI_Test still drives
  // progress.
  Status wait(PendingExchange& x) override {
    auto it = pending_.find(x.id);
    if (it == pending_.end()) return internal_error(fmt::format("MPI rank {}: unknown exchange {}", rank_, x.id));
    for (int spin = 0;; ++spin) {
      int flag = 0;
      int rc = MPI_Test(&it->second.request, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return fail("MPI_Test", rc);
      if (flag) break;
      // Other exchanges in flight move too (non-blocking collectives
      // progress only inside MPI calls).
      LIBRA_TRY(progress());
      if (spin >= 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    pending_.erase(it);
    x.id = -1;
    return Status();
  }

  Status progress() override {
    for (auto& [id, p] : pending_) {
      if (p.request == MPI_REQUEST_NULL || p.done) continue;
      int flag = 0;
      int rc = MPI_Test(&p.request, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return fail("MPI_Test", rc);
      // A completed request becomes MPI_REQUEST_NULL; a later test of it
      // returns at once.
      if (flag) p.done = true;
    }
    return Status();
  }

  Status barrier() override {
    int rc = MPI_Barrier(comm_);
    if (rc != MPI_SUCCESS) return fail("MPI_Barrier", rc);
    return Status();
  }

  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    std::vector<std::uint64_t> out(static_cast<std::size_t>(size_));
    int rc = MPI_Allgather(&value, 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, comm_);
    if (rc != MPI_SUCCESS) return fail("MPI_Allgather", rc);
    return out;
  }

  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    MPI_Comm sub;
    int rc = MPI_Comm_split(comm_, color, key, &sub);
    if (rc != MPI_SUCCESS) return fail("MPI_Comm_split", rc);
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(sub));
  }

  [[noreturn]] void abort(const std::string& message) override {
    write_stderr_line("libra: error: " + message);
    MPI_Abort(comm_, 2);
    std::abort();
  }

 private:
  struct Pending {
    std::vector<int> sc, sd, rc, rd;
    MPI_Request request = MPI_REQUEST_NULL;
    bool done = false;
  };

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
  int rank_ = 0;
  int size_ = 1;
  std::int64_t next_id_ = 0;
  std::map<std::int64_t, Pending> pending_;
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

Result<std::unique_ptr<Communicator>> make_mpi_communicator(MPI_Comm comm) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return internal_error("make_mpi_communicator: MPI is not initialised (call mpi_init first)");
  MPI_Comm dup;
  int rc = MPI_Comm_dup(comm, &dup);
  if (rc != MPI_SUCCESS) return internal_error("MPI_Comm_dup failed: " + mpi_error_text(rc));
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(dup));
}

Result<std::unique_ptr<Communicator>> mpi_world() { return make_mpi_communicator(MPI_COMM_WORLD); }

}  // namespace libra
