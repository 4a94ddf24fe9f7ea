// validate_schedule: every program of a schedule inside its buffers, before
// an engine trusts its offsets (a schedule may come from a file or a binding,
// not only from make_rank_schedule).
#include <fmt/format.h>

#include <string>

#include "libra/schedule.hpp"

namespace libra {

namespace {

bool is_in(Phase p) { return p == Phase::kFwdIn || p == Phase::kBwdIn; }

Status check_program(const RankSchedule& s, const Strided& a, std::int64_t buffer, const std::string& what) {
  if (a.rows < 0 || a.run < 0 || a.offset < 0 || a.run > a.stride ||
      (a.rows > 0 && a.run > 0 && a.offset + (a.rows - 1) * a.stride + a.run > buffer)) {
    return invalid_input(fmt::format("schedule of worker {}: {} (offset {}, {} rows of {} vectors, stride {}) lies "
                                     "outside its buffer of {} vectors",
                                     s.worker, what, a.offset, a.rows, a.run, a.stride, buffer));
  }
  return Status();
}

// Segments lie inside their buffers (home for an In send or an Out
// receipt, the staging buffer where a segment says so, compute otherwise)
// and the byte counts are their sums.
Status check_side(const RankSchedule& s, const Exchange& x, bool in, bool send, const std::string& name) {
  const auto& lists = send ? x.send : x.recv;
  const auto& bytes = send ? x.send_bytes : x.recv_bytes;
  const auto& displs = send ? x.send_displs : x.recv_displs;
  if (lists.size() != static_cast<std::size_t>(s.workers) || bytes.size() != lists.size() || displs.size() != lists.size()) {
    return invalid_input("schedule: an exchange does not list every peer");
  }
  std::int64_t total = 0;
  for (std::size_t peer = 0; peer < lists.size(); ++peer) {
    std::int64_t n = 0;
    for (const Segment& seg : lists[peer]) {
      const bool home = !seg.stage && (send ? in : !in);
      const std::int64_t buffer = seg.stage ? s.stage_vectors(seg.field)
                                  : home    ? s.home_vectors(seg.field)
                                            : s.compute_vectors(seg.field);
      LIBRA_TRY(check_program(s, seg.at, buffer,
                              fmt::format("{} {} {} of peer {}", name, send ? "send" : "receive", field_name(seg.field), peer)));
      if (seg.add && (send || !home || field_dtype(seg.field, s.dtype) != DType::kF32)) {
        return invalid_input("schedule: only fp32 home buffers are added into");
      }
      n += seg.at.count() * s.vector_bytes(seg.field);
    }
    if (n != bytes[peer] || displs[peer] != total) return invalid_input("schedule: byte counts disagree with the segments");
    total += n;
  }
  if (total != (send ? x.total_send_bytes : x.total_recv_bytes)) {
    return invalid_input("schedule: total bytes disagree with the segments");
  }
  return Status();
}

Status check_exchange(const RankSchedule& s, const Exchange& x, bool in, const std::string& name) {
  LIBRA_TRY(check_side(s, x, in, true, name));
  return check_side(s, x, in, false, name);
}

Status check_header(const RankSchedule& s) {
  if (s.workers < 1 || s.worker < 0 || s.worker >= s.workers || s.chunks < 1 || s.heads_q < 1 || s.heads_kv < 1 ||
      s.head_dim < 1) {
    return invalid_input(fmt::format("schedule: worker {} of {}, {} chunks, heads {}/{}, head_dim {} is not a schedule",
                                     s.worker, s.workers, s.chunks, s.heads_q, s.heads_kv, s.head_dim));
  }
  return Status();
}

// Every (phase, chunk) exchange.
Status check_phases(const RankSchedule& s) {
  for (int p = 0; p < 4; ++p) {
    if (s.exchanges[static_cast<std::size_t>(p)].size() != static_cast<std::size_t>(s.chunks)) {
      return invalid_input("schedule: exchanges of a phase do not cover its chunks");
    }
    for (int m = 0; m < s.chunks; ++m) {
      const auto ph = static_cast<Phase>(p);
      LIBRA_TRY(check_exchange(s, s.exchange(ph, m), is_in(ph), fmt::format("{} chunk {}", phase_name(ph), m)));
    }
  }
  return Status();
}

// The stage exchanges of a relayed schedule: inside their buffers, never
// to the worker itself, receipts only into the staging buffer.
Status check_stages(const RankSchedule& s) {
  if (s.stage_q_vectors < 0 || s.stage_kv_vectors < 0) return invalid_input("schedule: negative staging buffer size");
  for (int pass = 0; pass < 2; ++pass) {
    const auto& stages = s.stage_exchanges[static_cast<std::size_t>(pass)];
    if (stages.size() != (s.relayed ? static_cast<std::size_t>(s.chunks) : 0U)) {
      return invalid_input("schedule: stage exchanges must cover the chunks of a relayed schedule, and only of one");
    }
    for (int m = 0; m < static_cast<int>(stages.size()); ++m) {
      const Exchange& x = stages[static_cast<std::size_t>(m)];
      const std::string name = fmt::format("{} stage chunk {}", pass == 0 ? "fwd" : "bwd", m);
      LIBRA_TRY(check_exchange(s, x, true, name));
      if (!x.send[static_cast<std::size_t>(s.worker)].empty() || !x.recv[static_cast<std::size_t>(s.worker)].empty()) {
        return invalid_input(fmt::format("schedule of worker {}: {}: a worker relays for itself", s.worker, name));
      }
      for (const auto& list : x.recv) {
        for (const Segment& seg : list) {
          if (!seg.stage) return invalid_input(fmt::format("schedule of worker {}: {}: a receipt outside the staging buffer", s.worker, name));
        }
      }
    }
  }
  return Status();
}

// The message to self is copied segment by segment: both sides must agree.
Status check_self_messages(const RankSchedule& s) {
  for (int p = 0; p < 4; ++p) {
    for (int m = 0; m < s.chunks; ++m) {
      const Exchange& x = s.exchange(static_cast<Phase>(p), m);
      const auto& a = x.send[static_cast<std::size_t>(s.worker)];
      const auto& b = x.recv[static_cast<std::size_t>(s.worker)];
      bool same = a.size() == b.size();
      for (std::size_t k = 0; same && k < a.size(); ++k) {
        same = a[k].field == b[k].field && a[k].at.rows == b[k].at.rows && a[k].at.run == b[k].at.run;
      }
      if (!same) return invalid_input(fmt::format("schedule of worker {}: {} chunk {}: the message to self does not match "
                                                  "its receipt", s.worker, phase_name(static_cast<Phase>(p)), m));
    }
  }
  return Status();
}

Status check_home_and_order(const RankSchedule& s) {
  if (s.home_tokens < 0 || s.home_tokens > s.home_rows) {
    return invalid_input(fmt::format("schedule of worker {}: {} token rows in a home shard of {}", s.worker,
                                     s.home_tokens, s.home_rows));
  }
  for (auto [peer, m] : s.apply_order) {
    if (peer < 0 || peer >= s.workers || m < 0 || m >= s.chunks) return invalid_input("schedule: apply order out of range");
  }
  return Status();
}

// A kernel call's views inside their buffers, its fragments in range, and
// the rows the fragments touch inside the views (the kernel checks the
// rest of each fragment).
Status check_call(const RankSchedule& s, const KernelCall& c, int m) {
  LIBRA_TRY(check_program(s, c.q, c.q_home ? s.home_vectors(Field::kQ) : s.compute_q_vectors,
                          fmt::format("kernel call Q view of chunk {}", m)));
  LIBRA_TRY(check_program(s, c.kv, c.kv_home ? s.home_vectors(Field::kK) : s.compute_kv_vectors,
                          fmt::format("kernel call KV view of chunk {}", m)));
  if (c.fragment_begin < 0 || c.fragment_begin > c.fragment_end ||
      static_cast<std::size_t>(c.fragment_end) > s.fragments.size()) {
    return invalid_input("schedule: kernel call fragments out of range");
  }
  for (const CallFragment& f : s.call_fragments(c)) {
    if (f.q_row < 0 || f.kv_row < 0 || f.q_row + (f.e - f.a) > c.q.rows || f.kv_row + f.e > c.kv.rows) {
      return invalid_input(fmt::format("schedule of worker {}: a fragment of chunk {} reaches past its views", s.worker, m));
    }
  }
  return Status();
}

Status check_calls(const RankSchedule& s) {
  for (int pass = 0; pass < 2; ++pass) {
    if (s.kernel_calls[static_cast<std::size_t>(pass)].size() != static_cast<std::size_t>(s.chunks)) {
      return invalid_input("schedule: kernel calls do not cover the chunks");
    }
    for (int m = 0; m < s.chunks; ++m) {
      for (const KernelCall& c : s.calls(static_cast<Pass>(pass), m)) LIBRA_TRY(check_call(s, c, m));
    }
  }
  return Status();
}

}  // namespace

Status validate_schedule(const RankSchedule& s) {
  LIBRA_TRY(check_header(s));
  LIBRA_TRY(check_phases(s));
  LIBRA_TRY(check_stages(s));
  LIBRA_TRY(check_self_messages(s));
  LIBRA_TRY(check_home_and_order(s));
  return check_calls(s);
}

}  // namespace libra
