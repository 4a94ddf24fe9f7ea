// The loopback communicator: one rank of a world that exists only in name,
// for measuring that rank's compute alone (`libra bench exec`).
#include <cstring>

#include "libra/comm.hpp"
#include "libra/io.hpp"

namespace libra {

namespace {

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Only the bytes to self move; what other ranks would send never arrives.
  Result<PendingExchange> post(const AllToAllV& x) override {
    const auto me = static_cast<std::size_t>(rank_);
    if (me < x.send_counts.size() && me < x.recv_counts.size() && x.send_counts[me] == x.recv_counts[me] &&
        x.send_counts[me] > 0) {
      std::memcpy(x.recv.data() + x.recv_displs[me], x.send.data() + x.send_displs[me],
                  static_cast<std::size_t>(x.send_counts[me]));
    }
    return PendingExchange{next_id_++};
  }
  Status wait(PendingExchange& x) override {
    x.id = -1;
    return Status();
  }
  Status barrier() override { return Status(); }
  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    return std::vector<std::uint64_t>(static_cast<std::size_t>(size_), value);
  }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return std::unique_ptr<Communicator>(std::make_unique<LoopbackCommunicator>(rank_, size_));
  }
  [[noreturn]] void abort(const std::string& message) override {
    write_stderr_line("libra: error: " + message);
    std::abort();
  }

 private:
  int rank_, size_;
  std::int64_t next_id_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_loopback_communicator(int rank, int size) {
  return std::make_unique<LoopbackCommunicator>(rank, size);
}

}  // namespace libra
