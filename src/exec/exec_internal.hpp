// Internal to the exec stage: typed byte buffers, the copies between home
// tensors, worker mirrors and message buffers, and in-flight transfer groups.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "libra/comm.hpp"
#include "libra/executor.hpp"
#include "libra/kernel.hpp"
#include "libra/status.hpp"

namespace libra::exec_detail {

using kernel::DType;

// A row-major [rows, heads, width] block of one element type, covering slot
// positions [row0, row0 + rows) and heads [head0, head0 + heads).
struct Layout {
  std::byte* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t row0 = 0;
  std::int64_t rows = 0;
  std::int32_t head0 = 0;
  std::int32_t heads = 0;
  std::int64_t width = 0;  // elements per head: head_dim, or 1 for LSE

  std::int64_t eb() const { return kernel::dtype_bytes(dtype); }
  std::int64_t bytes() const { return rows * heads * width * eb(); }
  bool covers(std::int64_t t0, std::int64_t t1, std::int32_t h0, std::int32_t h1) const {
    return data != nullptr && t0 >= row0 && t1 <= row0 + rows && h0 >= head0 && h1 <= head0 + heads && t0 <= t1 &&
           h0 <= h1;
  }
  std::byte* at(std::int64_t t, std::int32_t h) const { return data + (((t - row0) * heads + (h - head0)) * width) * eb(); }
  // The kernel's view of heads [h0, h1).
  kernel::Tensor view(std::int32_t h0, std::int32_t h1) const {
    kernel::Tensor t{data, dtype, rows, heads, width, heads * width};
    return t.heads_slice(h0 - head0, h1 - h0);
  }
};

// A rectangle of one slot: rows [t0, t1) x heads [h0, h1).
struct Rect {
  std::int32_t slot = 0;
  std::int64_t t0 = 0, t1 = 0;
  std::int32_t h0 = 0, h1 = 0;
  std::int64_t elems(std::int64_t width) const { return (t1 - t0) * (h1 - h0) * width; }
};

inline Status copy_rect(const Layout& src, const Layout& dst, const Rect& r) {
  if (src.dtype != dst.dtype || src.width != dst.width || !src.covers(r.t0, r.t1, r.h0, r.h1) ||
      !dst.covers(r.t0, r.t1, r.h0, r.h1)) {
    return internal_error(fmt::format("exec: copy of slot {} rows [{}, {}) heads [{}, {}) outside its buffers", r.slot,
                                      r.t0, r.t1, r.h0, r.h1));
  }
  const std::size_t n = static_cast<std::size_t>((r.h1 - r.h0) * src.width * src.eb());
  for (std::int64_t t = r.t0; t < r.t1; ++t) std::memcpy(dst.at(t, r.h0), src.at(t, r.h0), n);
  return Status();
}

inline float load_elem(const std::byte* p, DType t) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return kernel::f32_from_bf16(b);
}

// dst (fp32) += src (any type) over the rectangle.
inline Status add_rect(const Layout& src, const Layout& dst, const Rect& r) {
  if (dst.dtype != DType::kF32 || src.width != dst.width || !src.covers(r.t0, r.t1, r.h0, r.h1) ||
      !dst.covers(r.t0, r.t1, r.h0, r.h1)) {
    return internal_error(fmt::format("exec: sum of slot {} rows [{}, {}) heads [{}, {}) outside its buffers", r.slot,
                                      r.t0, r.t1, r.h0, r.h1));
  }
  const std::int64_t n = (r.h1 - r.h0) * src.width;
  for (std::int64_t t = r.t0; t < r.t1; ++t) {
    const std::byte* s = src.at(t, r.h0);
    float* d = reinterpret_cast<float*>(dst.at(t, r.h0));
    for (std::int64_t i = 0; i < n; ++i) d[i] += load_elem(s + i * src.eb(), src.dtype);
  }
  return Status();
}

// Message packing: a rectangle of a layout appended to / read from a byte
// cursor, rows in order, heads contiguous within a row.
inline Status pack_rect(const Layout& src, const Rect& r, std::byte*& cursor, const std::byte* end) {
  if (!src.covers(r.t0, r.t1, r.h0, r.h1)) {
    return internal_error(fmt::format("exec: send of slot {} rows [{}, {}) heads [{}, {}) outside the sender's buffer",
                                      r.slot, r.t0, r.t1, r.h0, r.h1));
  }
  const std::size_t n = static_cast<std::size_t>((r.h1 - r.h0) * src.width * src.eb());
  if (cursor + static_cast<std::ptrdiff_t>(n) * (r.t1 - r.t0) > end) return internal_error("exec: message overflow");
  for (std::int64_t t = r.t0; t < r.t1; ++t) {
    std::memcpy(cursor, src.at(t, r.h0), n);
    cursor += n;
  }
  return Status();
}

// Unpacks into dst, assigning (add = false) or adding into an fp32 layout
// from wire elements of type `wire`.
inline Status unpack_rect(const Layout& dst, const Rect& r, DType wire, bool add, const std::byte*& cursor,
                          const std::byte* end) {
  if (!dst.covers(r.t0, r.t1, r.h0, r.h1)) {
    return internal_error(fmt::format("exec: receive of slot {} rows [{}, {}) heads [{}, {}) outside the receiver's buffer",
                                      r.slot, r.t0, r.t1, r.h0, r.h1));
  }
  const std::int64_t n = (r.h1 - r.h0) * dst.width;
  const std::int64_t wb = kernel::dtype_bytes(wire);
  if (cursor + n * wb * (r.t1 - r.t0) > end) return internal_error("exec: message underflow");
  if (!add) {
    if (wire != dst.dtype) return internal_error("exec: wire and buffer types differ");
    for (std::int64_t t = r.t0; t < r.t1; ++t) {
      std::memcpy(dst.at(t, r.h0), cursor, static_cast<std::size_t>(n * wb));
      cursor += n * wb;
    }
    return Status();
  }
  if (dst.dtype != DType::kF32) return internal_error("exec: sums are accumulated in fp32");
  for (std::int64_t t = r.t0; t < r.t1; ++t) {
    float* d = reinterpret_cast<float*>(dst.at(t, r.h0));
    for (std::int64_t i = 0; i < n; ++i) d[i] += load_elem(cursor + i * wb, wire);
    cursor += n * wb;
  }
  return Status();
}

// fp32 API tensors <-> typed byte buffers.
inline std::vector<std::byte> to_dtype(std::span<const float> x, DType t) {
  std::vector<std::byte> out(x.size() * static_cast<std::size_t>(kernel::dtype_bytes(t)));
  if (t == DType::kF32) {
    if (!x.empty()) std::memcpy(out.data(), x.data(), x.size() * 4);
  } else {
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::uint16_t b = kernel::bf16_from_f32(x[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

inline std::vector<float> to_f32(std::span<const std::byte> x, DType t) {
  const std::size_t eb = static_cast<std::size_t>(kernel::dtype_bytes(t));
  std::vector<float> out(x.size() / eb);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_elem(x.data() + i * eb, t);
  return out;
}

// A group of non-blocking requests traced as one transfer: from posting to
// the first moment they were seen complete.
class InFlight {
 public:
  InFlight() = default;
  InFlight(std::string name, TraceRecorder* trace) : name_(std::move(name)), trace_(trace) {
    if (trace_) posted_ = trace_->now_us();
  }
  void add(Request r) { requests_.push_back(r); }
  bool empty() const { return requests_.empty(); }
  // Non-blocking progress; records the transfer when it completes.
  Status poll(Communicator& comm) {
    if (done_ || requests_.empty()) return Status();
    LIBRA_ASSIGN_OR_RETURN(bool all, comm.test_all(requests_));
    if (all) finish();
    return Status();
  }
  Status wait(Communicator& comm) {
    if (done_) return Status();
    const double w0 = trace_ ? trace_->now_us() : 0;
    LIBRA_TRY(comm.wait_all(requests_));
    if (trace_ && !requests_.empty()) trace_->record("wait " + name_, TraceRecorder::kWait, w0, trace_->now_us());
    finish();
    return Status();
  }

 private:
  void finish() {
    done_ = true;
    if (trace_ && !requests_.empty()) trace_->record(name_, TraceRecorder::kTransfer, posted_, trace_->now_us());
  }
  std::string name_;
  TraceRecorder* trace_ = nullptr;
  double posted_ = 0;
  bool done_ = false;
  std::vector<Request> requests_;
};

// Stable 64-bit mixing for fingerprints of executor inputs.
inline std::uint64_t mix64(std::uint64_t h, std::uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  return h;
}

}  // namespace libra::exec_detail
