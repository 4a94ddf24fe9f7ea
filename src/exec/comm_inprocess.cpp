// The in-process communicator: W ranks as W threads sharing one mailbox.
// Exchanges are matched by their sequence number (every rank posts the same
// sequence); posting copies the send blocks into the mailbox, so the only
// blocking operation is a wait, which gives up after a timeout rather than
// hanging a test.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "libra/comm.hpp"

namespace libra {

namespace {

struct World {
  World(int n, int timeout) : size(n), timeout_ms(timeout) {}
  int size;
  int timeout_ms;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<std::uint64_t, int, int>, std::vector<std::byte>> mailbox;  // (exchange, src, dst)
  // Consumed message buffers, reused by later posts: executors post the
  // same sizes call after call, and fresh large allocations would fault in
  // new pages every time.
  std::multimap<std::size_t, std::vector<std::byte>> spare;  // by capacity
  std::vector<std::byte> take(std::size_t n) {
    auto it = spare.lower_bound(n);
    if (it == spare.end()) return std::vector<std::byte>(n);
    std::vector<std::byte> v = std::move(it->second);
    spare.erase(it);
    v.resize(n);
    return v;
  }
  void give(std::vector<std::byte>&& v) {
    if (v.capacity() > 0 && spare.size() < 4096) spare.emplace(v.capacity(), std::move(v));
  }
  // Sub-worlds created by split, keyed by (split sequence number, color).
  std::map<std::pair<std::uint64_t, int>, std::shared_ptr<World>> children;
};

// Checks that counts and displacements describe blocks inside the buffer.
Status check_blocks(int rank, const char* side, std::span<const std::int64_t> counts, std::span<const std::int64_t> displs,
                    std::size_t buffer, int size) {
  if (counts.size() != static_cast<std::size_t>(size) || displs.size() != static_cast<std::size_t>(size)) {
    return internal_error(fmt::format("in-process rank {}: {} counts for {} peers in a world of {}", rank, side,
                                      counts.size(), size));
  }
  for (int p = 0; p < size; ++p) {
    const std::int64_t n = counts[static_cast<std::size_t>(p)], at = displs[static_cast<std::size_t>(p)];
    if (n < 0 || at < 0 || static_cast<std::uint64_t>(at) + static_cast<std::uint64_t>(n) > buffer) {
      return internal_error(fmt::format("in-process rank {}: {} block of peer {} ({} bytes at {}) outside its buffer of {}",
                                        rank, side, p, n, at, buffer));
    }
  }
  return Status();
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<World> world, int rank) : world_(std::move(world)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_->size; }

  Result<PendingExchange> post(const AllToAllV& x) override {
    LIBRA_TRY(check_blocks(rank_, "send", x.send_counts, x.send_displs, x.send.size(), size()));
    LIBRA_TRY(check_blocks(rank_, "receive", x.recv_counts, x.recv_displs, x.recv.size(), size()));
    const std::uint64_t seq = next_seq_++;
    const auto me = static_cast<std::size_t>(rank_);
    if (x.send_counts[me] != x.recv_counts[me]) {
      return internal_error(fmt::format("in-process rank {}: exchange {}: {} bytes to itself, {} expected", rank_, seq,
                                        x.send_counts[me], x.recv_counts[me]));
    }
    // The block to self lands at once; the others go through the mailbox.
    if (x.send_counts[me] > 0) {
      std::memcpy(x.recv.data() + x.recv_displs[me], x.send.data() + x.send_displs[me], static_cast<std::size_t>(x.send_counts[me]));
    }
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      for (int p = 0; p < size(); ++p) {
        if (p == rank_) continue;
        const auto n = static_cast<std::size_t>(x.send_counts[static_cast<std::size_t>(p)]);
        std::vector<std::byte> msg = world_->take(n);
        if (n > 0) std::memcpy(msg.data(), x.send.data() + x.send_displs[static_cast<std::size_t>(p)], n);
        world_->mailbox[{seq, rank_, p}] = std::move(msg);
      }
    }
    world_->cv.notify_all();
    Pending pending{seq, x.recv, {x.recv_counts.begin(), x.recv_counts.end()}, {x.recv_displs.begin(), x.recv_displs.end()}};
    pending_.emplace(static_cast<std::int64_t>(seq), std::move(pending));
    return PendingExchange{static_cast<std::int64_t>(seq)};
  }

  Status wait(PendingExchange& x) override {
    auto it = pending_.find(x.id);
    if (it == pending_.end()) return internal_error(fmt::format("in-process rank {}: unknown exchange {}", rank_, x.id));
    const Pending p = std::move(it->second);
    pending_.erase(it);
    x.id = -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(world_->timeout_ms);
    std::unique_lock<std::mutex> lock(world_->mu);
    for (int src = 0; src < size(); ++src) {
      if (src == rank_) continue;
      const auto key = std::make_tuple(p.seq, src, rank_);
      auto msg = world_->mailbox.find(key);
      while (msg == world_->mailbox.end()) {
        if (world_->cv.wait_until(lock, deadline) == std::cv_status::timeout) {
          msg = world_->mailbox.find(key);
          if (msg != world_->mailbox.end()) break;
          return Error(ErrorCode::kInternal, fmt::format("in-process rank {}: no data from rank {} for exchange {} after {} ms",
                                                         rank_, src, p.seq, world_->timeout_ms));
        }
        msg = world_->mailbox.find(key);
      }
      const std::int64_t want = p.counts[static_cast<std::size_t>(src)];
      if (static_cast<std::int64_t>(msg->second.size()) != want) {
        return internal_error(fmt::format("in-process rank {}: exchange {}: rank {} sent {} bytes, expected {}", rank_,
                                          p.seq, src, msg->second.size(), want));
      }
      if (want > 0) std::memcpy(p.recv.data() + p.displs[static_cast<std::size_t>(src)], msg->second.data(), static_cast<std::size_t>(want));
      world_->give(std::move(msg->second));
      world_->mailbox.erase(msg);
    }
    return Status();
  }

  Status barrier() override { return allgather(0).status(); }

  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    const auto W = static_cast<std::size_t>(size());
    std::vector<std::uint64_t> send(W, value), out(W, 0);
    std::vector<std::int64_t> counts(W, 8), displs(W);
    for (std::size_t p = 0; p < W; ++p) displs[p] = static_cast<std::int64_t>(8 * p);
    LIBRA_TRY(exchange(*this, {std::as_bytes(std::span<const std::uint64_t>(send)), counts, displs,
                               std::as_writable_bytes(std::span<std::uint64_t>(out)), counts, displs}));
    return out;
  }

  Result<std::unique_ptr<Communicator>> split(int color, int key) override {
    const std::uint64_t seq = split_seq_++;
    const std::uint64_t mine = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(color)) << 32) |
                               static_cast<std::uint32_t>(key);
    LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, allgather(mine));
    std::vector<std::pair<std::int32_t, int>> members;  // (key, rank) of my color
    for (int r = 0; r < size(); ++r) {
      const std::uint64_t v = all[static_cast<std::size_t>(r)];
      if (static_cast<int>(static_cast<std::int32_t>(v >> 32)) == color) {
        members.emplace_back(static_cast<std::int32_t>(v & 0xffffffffu), r);
      }
    }
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    }
    std::shared_ptr<World> child;
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      auto& slot = world_->children[{seq, color}];
      if (!slot) slot = std::make_shared<World>(static_cast<int>(members.size()), world_->timeout_ms);
      child = slot;
    }
    return std::unique_ptr<Communicator>(std::make_unique<InProcessCommunicator>(child, new_rank));
  }

  [[noreturn]] void abort(const std::string& message) override {
    std::cerr << "libra: error: " << message << '\n';
    std::abort();
  }

 private:
  struct Pending {
    std::uint64_t seq;
    std::span<std::byte> recv;
    std::vector<std::int64_t> counts, displs;
  };

  std::shared_ptr<World> world_;
  int rank_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t split_seq_ = 0;
  std::map<std::int64_t, Pending> pending_;
};

}  // namespace

std::vector<Status> run_in_process(int size, const std::function<Status(Communicator&)>& body, int timeout_ms) {
  std::vector<Status> statuses(static_cast<std::size_t>(std::max(size, 0)));
  if (size <= 0) return statuses;
  auto world = std::make_shared<World>(size, timeout_ms);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      InProcessCommunicator comm(world, r);
      try {
        statuses[static_cast<std::size_t>(r)] = body(comm);
      } catch (const std::exception& e) {
        statuses[static_cast<std::size_t>(r)] = internal_error(fmt::format("rank {}: exception: {}", r, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

}  // namespace libra
