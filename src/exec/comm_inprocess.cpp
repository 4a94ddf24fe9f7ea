// The in-process communicator: W ranks as W threads of one process.
//
// Exchanges are matched by sequence number (every rank posts the same
// sequence). Each message byte moves once, straight from the sender's send
// buffer into the receiver's receive buffer: a post registers this rank's
// buffers in the exchange's slot and, for every peer that posted the exchange
// before, queues the copies both ways between the two. Whichever rank is
// blocked in a wait (of any exchange) does queued copies, so ranks that are
// idle move the data while busy ones compute; and since a rank waiting for a
// copy can always do it itself, no rank's progress depends on another rank's
// wait: posts never block and waits may come in any order. A wait returns
// once every block to and from this rank has been copied, which is when the
// caller may touch both buffers again. The buffers are registered only from
// post to the end of its wait: an error from post or wait (a timeout among
// them), and a communicator that ends with exchanges still posted, withdraw
// them (after any copy in flight on them finished), and a peer meeting a
// withdrawn side gets an error instead of touching memory its owner may have
// freed.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "libra/comm.hpp"
#include "libra/io.hpp"

namespace libra {

namespace {

// Big blocks are split so that several waiting ranks share their copy.
constexpr std::int64_t kPiece = std::int64_t{1} << 20;

// One rank's half of one exchange.
struct Side {
  bool posted = false;
  bool gone = false;  // withdrawn: its buffers must not be touched any more
  std::span<const std::byte> send;
  std::span<std::byte> recv;
  std::vector<std::int64_t> sc, sd, rc, rd;
  // Copies to or from this rank not finished, plus one per direction to a
  // peer that has not posted yet: zero means the exchange is done here.
  std::int64_t left = 0;
  std::string error;  // the first problem found for this rank, reported by its wait
};

struct Slot {
  explicit Slot(int n) : sides(static_cast<std::size_t>(n)) {}
  std::vector<Side> sides;  // by rank
  int finished = 0;         // sides waited or withdrawn: the slot goes when all are
};

// Bytes [offset, + bytes) of the block src sends to dst.
struct Copy {
  std::uint64_t seq;
  Side* src;
  Side* dst;
  int from, to;
  std::int64_t offset, bytes;
};

struct World {
  World(int n, int timeout) : size(n), timeout_ms(timeout), copying(static_cast<std::size_t>(n)) {}
  int size;
  int timeout_ms;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, Slot> slots;  // by exchange sequence number; nodes stay put, so Side* are stable
  std::deque<Copy> copies;              // both sides registered, waiting for a rank to do them
  std::vector<int> copying;             // by rank: copies in flight touching it
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
  ~InProcessCommunicator() override {
    std::unique_lock<std::mutex> lock(world_->mu);
    withdraw(lock);
  }

  int rank() const override { return rank_; }
  int size() const override { return world_->size; }

  Result<PendingExchange> post(const AllToAllV& x) override {
    const std::uint64_t seq = next_seq_++;
    const auto me = static_cast<std::size_t>(rank_);
    Status ok = check_blocks(rank_, "send", x.send_counts, x.send_displs, x.send.size(), size());
    if (ok.ok()) ok = check_blocks(rank_, "receive", x.recv_counts, x.recv_displs, x.recv.size(), size());
    if (ok.ok() && x.send_counts[me] != x.recv_counts[me]) {
      ok = internal_error(fmt::format("in-process rank {}: exchange {}: {} bytes to itself, {} expected", rank_, seq,
                                      x.send_counts[me], x.recv_counts[me]));
    }
    if (!ok.ok()) {
      // Posted as withdrawn, so that peers learn at once that this rank
      // stopped; the caller stops leaving the rest unwaited, so those go too.
      std::unique_lock<std::mutex> lock(world_->mu);
      Slot& slot = world_->slots.try_emplace(seq, size()).first->second;
      slot.sides[me].posted = slot.sides[me].gone = true;
      for (int p = 0; p < size(); ++p) {
        Side& peer = slot.sides[static_cast<std::size_t>(p)];
        if (p == rank_ || !peer.posted) continue;
        peer.left -= 2;  // both directions with this rank, which will never pair
        if (peer.error.empty()) peer.error = gave_up(p, seq, rank_);
      }
      world_->cv.notify_all();
      pending_.insert(seq);
      withdraw(lock);
      return ok.error();
    }
    if (x.send_counts[me] > 0) {
      std::memcpy(x.recv.data() + x.recv_displs[me], x.send.data() + x.send_displs[me], static_cast<std::size_t>(x.send_counts[me]));
    }
    Side mine;
    mine.posted = true;
    mine.send = x.send;
    mine.recv = x.recv;
    mine.sc.assign(x.send_counts.begin(), x.send_counts.end());
    mine.sd.assign(x.send_displs.begin(), x.send_displs.end());
    mine.rc.assign(x.recv_counts.begin(), x.recv_counts.end());
    mine.rd.assign(x.recv_displs.begin(), x.recv_displs.end());
    mine.left = 2 * (size() - 1);
    {
      std::lock_guard<std::mutex> lock(world_->mu);
      Slot& slot = world_->slots.try_emplace(seq, size()).first->second;
      slot.sides[me] = std::move(mine);
      for (int p = 0; p < size(); ++p) {
        if (p != rank_ && slot.sides[static_cast<std::size_t>(p)].posted) pair(slot, seq, p);
      }
    }
    world_->cv.notify_all();  // new copies to do, or a peer done through empty blocks
    pending_.insert(seq);
    return PendingExchange{static_cast<std::int64_t>(seq)};
  }

  Status wait(PendingExchange& x) override {
    const auto seq = static_cast<std::uint64_t>(x.id);
    if (x.id < 0 || pending_.erase(seq) == 0) {
      return internal_error(fmt::format("in-process rank {}: exchange {} is not posted (or already waited)", rank_, x.id));
    }
    x.id = -1;
    World& w = *world_;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(w.timeout_ms);
    std::unique_lock<std::mutex> lock(w.mu);
    Slot& slot = w.slots.at(seq);
    Side& me = slot.sides[static_cast<std::size_t>(rank_)];
    while (me.left > 0) {
      if (!w.copies.empty()) {
        copy_one(lock, me);
        continue;
      }
      if (w.cv.wait_until(lock, deadline) == std::cv_status::no_timeout || me.left == 0) continue;
      int missing = 0;
      while (missing < size() && (missing == rank_ || slot.sides[static_cast<std::size_t>(missing)].posted)) ++missing;
      if (missing == size() && w.copying[static_cast<std::size_t>(rank_)] > 0) {
        // Every peer posted: what is left are copies in flight, which end.
        w.cv.wait(lock, [&] { return me.left == 0 || !w.copies.empty() || w.copying[static_cast<std::size_t>(rank_)] == 0; });
        continue;
      }
      pending_.insert(seq);  // withdrawn with the others: the caller will not wait again
      withdraw(lock);
      if (missing == size()) {  // nothing queued or in flight, yet not done: never hang on it
        return internal_error(fmt::format("in-process rank {}: exchange {} incomplete after {} ms though every rank posted it",
                                          rank_, seq, w.timeout_ms));
      }
      return Error(ErrorCode::kInternal, fmt::format("in-process rank {}: no data from rank {} for exchange {} after {} ms",
                                                     rank_, missing, seq, w.timeout_ms));
    }
    const std::string error = std::move(me.error);
    if (++slot.finished == size()) w.slots.erase(seq);
    if (error.empty()) return Status();
    withdraw(lock);  // a caller that failed stops, leaving the rest unwaited
    return internal_error(error);
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
    write_stderr_line("libra: error: " + message);
    std::abort();
  }

 private:
  // Called by the later of two posters (this rank) with the earlier (peer).
  void pair(Slot& slot, std::uint64_t seq, int peer) {
    Side& me = slot.sides[static_cast<std::size_t>(rank_)];
    Side& other = slot.sides[static_cast<std::size_t>(peer)];
    if (other.gone) {
      me.left -= 2;
      if (me.error.empty()) me.error = gave_up(rank_, seq, peer);
      return;
    }
    queue(seq, me, rank_, other, peer);
    queue(seq, other, peer, me, rank_);
  }

  void queue(std::uint64_t seq, Side& src, int from, Side& dst, int to) {
    const std::int64_t n = src.sc[static_cast<std::size_t>(to)], want = dst.rc[static_cast<std::size_t>(from)];
    if (n != want) {
      if (dst.error.empty()) {
        dst.error = fmt::format("in-process rank {}: exchange {}: rank {} sent {} bytes, expected {}", to, seq, from, n, want);
      }
    } else {
      for (std::int64_t at = 0; at < n; at += kPiece) {
        world_->copies.push_back({seq, &src, &dst, from, to, at, std::min(kPiece, n - at)});
        ++src.left;
        ++dst.left;
      }
    }
    --src.left;
    --dst.left;
  }

  // Does one queued copy, outside the lock: the oldest of those to or from
  // `mine` if any (a waiter doing everyone's copies first would return
  // late), else the oldest, to help whoever waits for it.
  void copy_one(std::unique_lock<std::mutex>& lock, const Side& mine) {
    World& w = *world_;
    auto it = std::find_if(w.copies.begin(), w.copies.end(), [&](const Copy& c) { return c.src == &mine || c.dst == &mine; });
    if (it == w.copies.end()) it = w.copies.begin();
    const Copy c = *it;
    w.copies.erase(it);
    ++w.copying[static_cast<std::size_t>(c.from)];
    ++w.copying[static_cast<std::size_t>(c.to)];
    lock.unlock();
    std::memcpy(c.dst->recv.data() + c.dst->rd[static_cast<std::size_t>(c.from)] + c.offset,
                c.src->send.data() + c.src->sd[static_cast<std::size_t>(c.to)] + c.offset, static_cast<std::size_t>(c.bytes));
    lock.lock();
    --w.copying[static_cast<std::size_t>(c.from)];
    --w.copying[static_cast<std::size_t>(c.to)];
    --c.src->left;
    --c.dst->left;
    w.cv.notify_all();
  }

  // Unregisters every exchange this rank posted and did not wait for, so
  // that no peer touches their buffers once this returns.
  void withdraw(std::unique_lock<std::mutex>& lock) {
    if (pending_.empty()) return;
    World& w = *world_;
    for (std::uint64_t seq : pending_) w.slots.at(seq).sides[static_cast<std::size_t>(rank_)].gone = true;
    // Every queued copy touching this rank belongs to a pending exchange.
    std::erase_if(w.copies, [&](const Copy& c) {
      if (c.from != rank_ && c.to != rank_) return false;
      Side* peer = c.from == rank_ ? c.dst : c.src;
      --peer->left;
      if (peer->error.empty()) peer->error = gave_up(c.from == rank_ ? c.to : c.from, c.seq, rank_);
      return true;
    });
    w.cv.notify_all();
    w.cv.wait(lock, [&] { return w.copying[static_cast<std::size_t>(rank_)] == 0; });
    for (std::uint64_t seq : pending_) {
      if (++w.slots.at(seq).finished == size()) w.slots.erase(seq);
    }
    pending_.clear();
  }

  static std::string gave_up(int rank, std::uint64_t seq, int peer) {
    return fmt::format("in-process rank {}: exchange {}: rank {} gave up on it", rank, seq, peer);
  }

  std::shared_ptr<World> world_;
  int rank_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t split_seq_ = 0;
  std::set<std::uint64_t> pending_;  // posted, not yet waited
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
