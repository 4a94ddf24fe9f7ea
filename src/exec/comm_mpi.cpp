// The MPI communicator: a thin wrapper over one MPI communicator, compiled only
// when LIBRA_WITH_MPI is on and OpenMPI was found (LIBRA_HAVE_MPI); comm.cpp
// holds the stand-ins otherwise.
#include "libra/comm.hpp"

#include <fmt/format.h>

#include <chrono>
#include <climits>
#include <thread>
#include <iostream>
#include <map>

#include <mpi.h>

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
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Errors come back as return codes so they become libra::Error values.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    for (auto& [id, req] : requests_) {
      if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
    }
    if (owned_) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Result<Request> isend(int dest, int tag, std::span<const std::byte> data) override {
    LIBRA_TRY(check_count(data.size(), dest, "send to"));
    MPI_Request req;
    int rc = MPI_Isend(data.data(), static_cast<int>(data.size()), MPI_BYTE, dest, tag, comm_, &req);
    if (rc != MPI_SUCCESS) return fail("MPI_Isend", rc);
    return remember(req);
  }

  Result<Request> irecv(int source, int tag, std::span<std::byte> data) override {
    LIBRA_TRY(check_count(data.size(), source, "receive from"));
    MPI_Request req;
    int rc = MPI_Irecv(data.data(), static_cast<int>(data.size()), MPI_BYTE, source, tag, comm_, &req);
    if (rc != MPI_SUCCESS) return fail("MPI_Irecv", rc);
    Request r = remember(req);
    expected_[r.id] = {source, tag, data.size()};
    return r;
  }

  // Polls instead of blocking in MPI_Wait: OpenMPI's blocking wait spins
  // on the CPU, which on an oversubscribed machine (more ranks than cores,
  // as in CI) takes the core away from the ranks that are computing. After
  // a short spin the poll sleeps 50 us between tests; MPI_Test still drives
  // progress.
  Status wait_all(std::span<Request> requests) override {
    for (int spin = 0;; ++spin) {
      LIBRA_ASSIGN_OR_RETURN(bool done, test_all(requests));
      if (done) return Status();
      if (spin >= 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  Result<bool> test_all(std::span<Request> requests) override {
    bool all = true;
    for (Request& r : requests) {
      if (!r.valid()) continue;
      auto it = requests_.find(r.id);
      if (it == requests_.end()) return internal_error(fmt::format("MPI rank {}: unknown request {}", rank_, r.id));
      int flag = 0;
      MPI_Status st;
      int rc = MPI_Test(&it->second, &flag, &st);
      if (rc != MPI_SUCCESS) return fail("MPI_Test", rc);
      if (!flag) {
        all = false;
        continue;
      }
      LIBRA_TRY(check_received(r.id, st));
      requests_.erase(it);
      r.id = -1;
    }
    return all;
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
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(sub, true));
  }

  [[noreturn]] void abort(const std::string& message) override {
    std::cerr << "libra: error: " << message << '\n' << std::flush;
    MPI_Abort(comm_, 2);
    std::abort();
  }

 private:
  struct Expected {
    int source;
    int tag;
    std::size_t bytes;
  };

  Request remember(MPI_Request req) {
    Request r{next_id_++};
    requests_[r.id] = req;
    return r;
  }

  Status check_count(std::size_t n, int peer, const char* what) const {
    if (peer < 0 || peer >= size_) {
      return internal_error(fmt::format("MPI rank {}: {} rank {} outside [0, {})", rank_, what, peer, size_));
    }
    if (n > static_cast<std::size_t>(INT_MAX)) {
      return invalid_input(fmt::format("MPI rank {}: a message of {} bytes to/from rank {} exceeds the 2 GiB MPI count limit",
                                       rank_, n, peer));
    }
    return Status();
  }

  Status check_received(std::int64_t id, const MPI_Status& st) {
    auto it = expected_.find(id);
    if (it == expected_.end()) return Status();
    Expected e = it->second;
    expected_.erase(it);
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (static_cast<std::size_t>(count) != e.bytes) {
      return internal_error(fmt::format("MPI rank {}: message from rank {} with tag {} has {} bytes, expected {}", rank_,
                                        e.source, e.tag, count, e.bytes));
    }
    return Status();
  }

  Error fail(const char* call, int rc) const {
    return internal_error(fmt::format("MPI rank {}: {} failed: {}", rank_, call, mpi_error_text(rc)));
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  std::int64_t next_id_ = 0;
  std::map<std::int64_t, MPI_Request> requests_;
  std::map<std::int64_t, Expected> expected_;
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

Result<std::unique_ptr<Communicator>> mpi_world() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return internal_error("mpi_world: MPI is not initialised (call mpi_init first)");
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false));
}

}  // namespace libra
