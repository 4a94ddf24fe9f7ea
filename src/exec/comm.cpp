// The communicator helpers and the in-process communicator: W ranks as W
// threads sharing one mailbox. Sends are buffered (they copy into the
// mailbox and complete at once), so the only blocking operation is a receive,
// which gives up after a timeout rather than hanging a test.
#include "libra/comm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace libra {

Status agree_on_status(Communicator& comm, const Status& local, const std::string& what) {
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> ok, comm.allgather(local.ok() ? 1u : 0u));
  std::vector<int> failed;
  for (std::size_t r = 0; r < ok.size(); ++r) {
    if (ok[r] == 0) failed.push_back(static_cast<int>(r));
  }
  if (failed.empty()) return Status();
  if (!local.ok()) return local;
  return Error(ErrorCode::kMismatch,
               fmt::format("{}: failed on rank(s) {} (see their message)", what, fmt::join(failed, ",")));
}

Result<std::vector<std::string>> gather_strings(Communicator& comm, int root, const std::string& mine, int tag) {
  std::vector<std::string> out;
  if (comm.rank() != root) {
    std::uint64_t n = mine.size();
    std::vector<Request> reqs;
    LIBRA_ASSIGN_OR_RETURN(Request a, comm.isend(root, tag, std::as_bytes(std::span<const std::uint64_t>(&n, 1))));
    reqs.push_back(a);
    LIBRA_TRY(comm.wait_all(reqs));
    reqs.clear();
    LIBRA_ASSIGN_OR_RETURN(Request b, comm.isend(root, tag + 1, std::as_bytes(std::span<const char>(mine))));
    reqs.push_back(b);
    LIBRA_TRY(comm.wait_all(reqs));
    return out;
  }
  out.resize(static_cast<std::size_t>(comm.size()));
  out[static_cast<std::size_t>(root)] = mine;
  for (int r = 0; r < comm.size(); ++r) {
    if (r == root) continue;
    std::uint64_t n = 0;
    std::vector<Request> reqs;
    LIBRA_ASSIGN_OR_RETURN(Request a, comm.irecv(r, tag, std::as_writable_bytes(std::span<std::uint64_t>(&n, 1))));
    reqs.push_back(a);
    LIBRA_TRY(comm.wait_all(reqs));
    reqs.clear();
    std::string& s = out[static_cast<std::size_t>(r)];
    s.resize(n);
    LIBRA_ASSIGN_OR_RETURN(Request b, comm.irecv(r, tag + 1, std::as_writable_bytes(std::span<char>(s))));
    reqs.push_back(b);
    LIBRA_TRY(comm.wait_all(reqs));
  }
  return out;
}

namespace {

struct World {
  explicit World(int n, int timeout) : size(n), timeout_ms(timeout) {}
  int size;
  int timeout_ms;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mailbox;  // (src, dst, tag)
  // Sub-worlds created by split, keyed by (split sequence number, color).
  std::map<std::pair<std::uint64_t, int>, std::shared_ptr<World>> children;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<World> world, int rank) : world_(std::move(world)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return world_->size; }

  Result<Request> isend(int dest, int tag, std::span<const std::byte> data) override {
    LIBRA_TRY(check_peer(dest, "send to"));
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      world_->mailbox[{rank_, dest, tag}].emplace_back(data.begin(), data.end());
    }
    world_->cv.notify_all();
    return Request{next_id_++};  // buffered: already complete
  }

  Result<Request> irecv(int source, int tag, std::span<std::byte> data) override {
    LIBRA_TRY(check_peer(source, "receive from"));
    Request r{next_id_++};
    pending_.emplace(r.id, Pending{source, tag, data});
    return r;
  }

  Status wait_all(std::span<Request> requests) override {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(world_->timeout_ms);
    std::unique_lock<std::mutex> lock(world_->mu);
    for (Request& req : requests) {
      if (!req.valid()) continue;
      auto it = pending_.find(req.id);
      if (it != pending_.end()) {
        const Pending p = it->second;
        while (true) {
          LIBRA_ASSIGN_OR_RETURN(bool done, try_match_locked(p));
          if (done) break;
          if (world_->cv.wait_until(lock, deadline) == std::cv_status::timeout) {
            LIBRA_ASSIGN_OR_RETURN(bool late, try_match_locked(p));
            if (late) break;
            return Error(ErrorCode::kInternal,
                         fmt::format("in-process rank {}: no message from rank {} with tag {} after {} ms",
                                     rank_, p.source, p.tag, world_->timeout_ms));
          }
        }
        pending_.erase(it);
      }
      req.id = -1;
    }
    return Status();
  }

  Result<bool> test_all(std::span<Request> requests) override {
    std::lock_guard<std::mutex> lock(world_->mu);
    bool all = true;
    for (Request& req : requests) {
      if (!req.valid()) continue;
      auto it = pending_.find(req.id);
      if (it != pending_.end()) {
        LIBRA_ASSIGN_OR_RETURN(bool done, try_match_locked(it->second));
        if (!done) {
          all = false;
          continue;
        }
        pending_.erase(it);
      }
      req.id = -1;
    }
    return all;
  }

  Status barrier() override { return allgather(0).status(); }

  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    const int tag = kMaxUserTag + static_cast<int>(collective_seq_++ % (1u << 20));
    std::vector<std::uint64_t> out(static_cast<std::size_t>(size()));
    out[static_cast<std::size_t>(rank_)] = value;
    std::vector<Request> reqs;
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      LIBRA_ASSIGN_OR_RETURN(Request s, isend(r, tag, std::as_bytes(std::span<const std::uint64_t>(&value, 1))));
      reqs.push_back(s);
      LIBRA_ASSIGN_OR_RETURN(
          Request q, irecv(r, tag, std::as_writable_bytes(std::span<std::uint64_t>(&out[static_cast<std::size_t>(r)], 1))));
      reqs.push_back(q);
    }
    LIBRA_TRY(wait_all(reqs));
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
    int source;
    int tag;
    std::span<std::byte> buffer;
  };

  Status check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size()) {
      return internal_error(fmt::format("in-process rank {}: {} rank {} outside [0, {})", rank_, what, peer, size()));
    }
    return Status();
  }

  // Requires world_->mu held.
  Result<bool> try_match_locked(const Pending& p) {
    auto it = world_->mailbox.find({p.source, rank_, p.tag});
    if (it == world_->mailbox.end() || it->second.empty()) return false;
    std::vector<std::byte>& msg = it->second.front();
    if (msg.size() != p.buffer.size()) {
      return internal_error(fmt::format("in-process rank {}: message from rank {} with tag {} has {} bytes, expected {}",
                                        rank_, p.source, p.tag, msg.size(), p.buffer.size()));
    }
    if (!msg.empty()) std::memcpy(p.buffer.data(), msg.data(), msg.size());
    it->second.pop_front();
    return true;
  }

  std::shared_ptr<World> world_;
  int rank_;
  std::int64_t next_id_ = 0;
  std::uint64_t collective_seq_ = 0;
  std::uint64_t split_seq_ = 0;
  std::map<std::int64_t, Pending> pending_;
};

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Result<Request> isend(int, int, std::span<const std::byte>) override { return Request{next_id_++}; }
  Result<Request> irecv(int, int, std::span<std::byte>) override { return Request{next_id_++}; }
  Status wait_all(std::span<Request> requests) override {
    for (Request& r : requests) r.id = -1;
    return Status();
  }
  Result<bool> test_all(std::span<Request> requests) override {
    for (Request& r : requests) r.id = -1;
    return true;
  }
  Status barrier() override { return Status(); }
  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    return std::vector<std::uint64_t>(static_cast<std::size_t>(size_), value);
  }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return std::unique_ptr<Communicator>(std::make_unique<LoopbackCommunicator>(rank_, size_));
  }
  [[noreturn]] void abort(const std::string& message) override {
    std::cerr << "libra: error: " << message << '\n';
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

#ifndef LIBRA_HAVE_MPI

bool mpi_built() { return false; }
Status mpi_init() { return invalid_input("MPI: libra was built without MPI (configure with -DLIBRA_WITH_MPI=ON and OpenMPI)"); }
void mpi_finalize() {}
Result<std::unique_ptr<Communicator>> mpi_world() { return mpi_init().error(); }

#endif

}  // namespace libra
