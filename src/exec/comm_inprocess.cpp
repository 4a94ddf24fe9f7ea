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
#include <stdexcept>
#include <thread>

#include "libra/comm.hpp"
#include "core/fault.hpp"
#include "libra/io.hpp"

namespace libra {

namespace {

// Thrown by abort() to end one rank's thread; caught by run_in_process.
struct RankAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

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

// The failures of the ranks of one run_in_process, in the order they
// happened, shared by its world and every split of it: the first failure
// that is not a consequence of another ("gave up", "stopped") is the one
// the job reports.
struct Failures {
  std::mutex mu;
  std::int64_t next = 0;
  std::vector<std::int64_t> order;  // by rank: -1 none; else 2*seq (+1 when a consequence)
  explicit Failures(int n) : order(static_cast<std::size_t>(n), -1) {}
  void record(int rank, bool consequence) {
    std::lock_guard<std::mutex> lock(mu);
    auto& o = order[static_cast<std::size_t>(rank)];
    if (o < 0) o = 2 * next++ + (consequence ? 1 : 0);
    detail::fault_release().store(true);
  }
  int first() {
    std::lock_guard<std::mutex> lock(mu);
    int best = -1;
    for (std::size_t r = 0; r < order.size(); ++r) {
      const std::int64_t o = order[r];
      if (o < 0) continue;
      const std::int64_t b = best < 0 ? -1 : order[static_cast<std::size_t>(best)];
      if (best < 0 || (o & 1) < (b & 1) || ((o & 1) == (b & 1) && o < b)) best = static_cast<int>(r);
    }
    return best;
  }
};

// Marks the messages of errors caused by another rank's failure.
constexpr const char* kGaveUp = "gave up on it";
constexpr const char* kStopped = "stopped before posting it";
bool is_consequence(const std::string& m) {
  return m.find(kGaveUp) != std::string::npos || m.find(kStopped) != std::string::npos;
}

struct World {
  World(int n, int timeout, std::shared_ptr<Failures> f, std::vector<int> roots)
      : size(n), timeout_ms(timeout), copying(static_cast<std::size_t>(n)), dead(static_cast<std::size_t>(n), false),
        failures(std::move(f)), root_rank(std::move(roots)) {}
  int size;
  int timeout_ms;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, Slot> slots;  // by exchange sequence number; nodes stay put, so Side* are stable
  std::deque<Copy> copies;              // both sides registered, waiting for a rank to do them
  std::vector<int> copying;             // by rank: copies in flight touching it
  std::vector<bool> dead;               // by rank: its communicator is gone, it posts nothing more
  std::shared_ptr<Failures> failures;
  std::vector<int> root_rank;           // by rank: its rank in the run_in_process world
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
    // Peers waiting for an exchange this rank will never post learn it now,
    // not after the timeout.
    world_->dead[static_cast<std::size_t>(rank_)] = true;
    world_->cv.notify_all();
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
      int missing = first_missing(slot, true);
      const bool peer_dead = missing < size();
      if (!peer_dead) {
        if (w.cv.wait_until(lock, deadline) == std::cv_status::no_timeout || me.left == 0) continue;
        missing = first_missing(slot, false);
      }
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
      if (peer_dead) {
        return internal_error(fmt::format("in-process rank {}: exchange {}: rank {} {}", rank_, seq, missing, kStopped));
      }
      return internal_error(fmt::format("in-process rank {}: no data from rank {} for exchange {} within the timeout of "
                                        "{} ms (rank {} stopped or is too slow)",
                                        rank_, missing, seq, w.timeout_ms, missing));
    }
    const std::string error = std::move(me.error);
    if (++slot.finished == size()) w.slots.erase(seq);
    if (error.empty()) return Status();
    withdraw(lock);  // a caller that failed stops, leaving the rest unwaited
    return internal_error(error);
  }

  Status barrier() override { return allgather(0).status(); }

  Result<std::vector<std::uint64_t>> allgather(std::uint64_t value) override {
    return allgather_by_exchange(*this, value);
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
      if (!slot) {
        std::vector<int> roots;
        for (const auto& m : members) roots.push_back(world_->root_rank[static_cast<std::size_t>(m.second)]);
        slot = std::make_shared<World>(static_cast<int>(members.size()), world_->timeout_ms, world_->failures,
                                       std::move(roots));
      }
      child = slot;
    }
    return std::unique_ptr<Communicator>(std::make_unique<InProcessCommunicator>(child, new_rank));
  }

  // Ends this rank only: the other ranks are threads of the same process,
  // which learn of it through their exchanges with this one (withdrawn as
  // the exception unwinds) and end in turn; run_in_process reports the
  // first failure, so the job prints one line.
  [[noreturn]] void abort(const std::string& message) override {
    world_->failures->record(world_->root_rank[static_cast<std::size_t>(rank_)], is_consequence(message));
    throw RankAborted(message);
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
    return fmt::format("in-process rank {}: exchange {}: rank {} {}", rank, seq, peer, kGaveUp);
  }

  // The lowest rank (not this one; with `dead_only`, one whose communicator
  // is gone) that has not posted the exchange; size() if none.
  int first_missing(const Slot& slot, bool dead_only) const {
    for (int p = 0; p < size(); ++p) {
      const auto pu = static_cast<std::size_t>(p);
      if (p != rank_ && !slot.sides[pu].posted && (!dead_only || world_->dead[pu])) return p;
    }
    return size();
  }

  std::shared_ptr<World> world_;
  int rank_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t split_seq_ = 0;
  std::set<std::uint64_t> pending_;  // posted, not yet waited
};

}  // namespace

std::vector<Status> run_in_process(int size, const std::function<Status(Communicator&)>& body, int timeout_ms,
                                   int* first_failed) {
  std::vector<Status> statuses(static_cast<std::size_t>(std::max(size, 0)));
  if (first_failed != nullptr) *first_failed = -1;
  if (size <= 0) return statuses;
  auto failures = std::make_shared<Failures>(size);
  std::vector<int> roots(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) roots[static_cast<std::size_t>(r)] = r;
  auto world = std::make_shared<World>(size, timeout_ms, failures, roots);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Status& st = statuses[static_cast<std::size_t>(r)];
      // The world communicator outlives the catch, so a failure is recorded
      // before this rank's exchanges are withdrawn and its peers fail too.
      InProcessCommunicator comm(world, r);
      try {
        st = body(comm);
        if (!st.ok()) failures->record(r, is_consequence(st.error().message()));
      } catch (const RankAborted& e) {
        st = internal_error(e.what());
      } catch (const std::bad_alloc& e) {
        failures->record(r, false);
        st = internal_error(fmt::format("rank {}: out of memory: {}", r, e.what()));
      } catch (const std::exception& e) {
        failures->record(r, false);
        st = internal_error(fmt::format("rank {}: exception: {}", r, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_failed != nullptr) *first_failed = failures->first();
  return statuses;
}

}  // namespace libra
