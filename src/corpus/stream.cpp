#include "corpus/stream.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

namespace libra::detail {

void CorpusStream::ZlibEnd::operator()(z_stream* z) const {
  inflateEnd(z);
  delete z;
}

CorpusStream::CorpusStream(std::string name, int fd, std::span<const unsigned char> mem)
    : name_(std::move(name)), fd_(fd), mem_(mem) {}

CorpusStream CorpusStream::from_fd(int fd, std::string name) {
  CorpusStream s(std::move(name), fd, {});
  s.in_.resize(kStreamChunk);
  return s;
}

CorpusStream CorpusStream::from_memory(std::span<const unsigned char> bytes, std::string name, bool inflate) {
  CorpusStream s(std::move(name), -1, bytes);
  if (inflate) {
    s.gzip_ = true;
  } else {
    s.view_ = true;
    s.whole_ = std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    s.started_ = true;
  }
  return s;
}

std::string_view CorpusStream::pending() const {
  return (view_ ? whole_ : std::string_view(buf_)).substr(begin_);
}

Status CorpusStream::start() {
  started_ = true;
  if (fd_ >= 0) {
    // The gzip magic decides, so a pipe that delivers one byte at a time is
    // still told apart.
    std::size_t have = 0;
    while (have < 2) {
      const ssize_t n = ::read(fd_, in_.data() + have, in_.size() - have);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error(name_ + ": read failed: " + std::strerror(errno));
      }
      have += static_cast<std::size_t>(n);
    }
    raw_ = std::span<const unsigned char>(in_.data(), have);
    gzip_ = have >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
  }
  if (gzip_) {
    z_.reset(new z_stream{});
    // 16 + MAX_WBITS: gzip header and trailer (CRC and length checked by zlib).
    if (inflateInit2(z_.get(), 16 + MAX_WBITS) != Z_OK) {
      z_.reset();
      return internal_error(name_ + ": gzip: cannot initialise zlib");
    }
  }
  return {};
}

Result<bool> CorpusStream::next_raw() {
  if (fd_ < 0) {
    if (mem_.empty()) return false;
    const std::size_t n = std::min<std::size_t>(mem_.size(), std::numeric_limits<uInt>::max());
    raw_ = mem_.first(n);
    mem_ = mem_.subspan(n);
    return true;
  }
  for (;;) {
    const ssize_t n = ::read(fd_, in_.data(), in_.size());
    if (n > 0) {
      raw_ = std::span<const unsigned char>(in_.data(), static_cast<std::size_t>(n));
      return true;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return io_error(name_ + ": read failed: " + std::strerror(errno));
  }
}

namespace {

// Room for `extra` more bytes: a few chunks while lines are short, then at
// once all that one partial line and one chunk can need. One step, not
// doubling: freed doubling steps stay in the allocator's heap and would
// double what a long line costs.
void make_room(std::string& b, std::size_t extra) {
  const std::size_t need = b.size() + extra;
  if (need <= b.capacity()) return;
  b.reserve(std::max(need, need <= 4 * kStreamChunk ? 4 * kStreamChunk : kMaxLineBytes + 2 * kStreamChunk));
}

}  // namespace

Result<bool> CorpusStream::inflate_some() {
  z_stream& z = *z_;
  for (;;) {
    if (member_end_) {
      if (raw_.empty()) {
        LIBRA_ASSIGN_OR_RETURN(bool more, next_raw());
        if (!more) return false;
      }
      // Another gzip member follows (cat a.gz b.gz).
      if (inflateReset(&z) != Z_OK) return internal_error(name_ + ": gzip: cannot reset zlib");
      member_end_ = false;
    }
    if (raw_.empty()) {
      LIBRA_ASSIGN_OR_RETURN(bool more, next_raw());
      if (!more) {
        return invalid_input(name_ + ": gzip: the stream ends early at compressed byte " + std::to_string(consumed_) +
                             " (truncated file)");
      }
    }
    const std::size_t old = buf_.size();
    make_room(buf_, kStreamChunk);
    buf_.resize(old + kStreamChunk);
    z.next_in = const_cast<Bytef*>(raw_.data());
    z.avail_in = static_cast<uInt>(raw_.size());
    z.next_out = reinterpret_cast<Bytef*>(buf_.data() + old);
    z.avail_out = static_cast<uInt>(kStreamChunk);
    const int rc = inflate(&z, Z_NO_FLUSH);
    const std::size_t used = raw_.size() - z.avail_in;
    consumed_ += used;
    raw_ = raw_.subspan(used);
    const std::size_t got = kStreamChunk - z.avail_out;
    buf_.resize(old + got);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      const std::string why = z.msg != nullptr ? z.msg : "corrupt data";
      return invalid_input(name_ + ": gzip: compressed byte " + std::to_string(consumed_) + ": " + why);
    }
    if (rc == Z_STREAM_END) member_end_ = true;
    if (got > 0) return true;
  }
}

Result<bool> CorpusStream::fill() {
  if (view_ || end_) return false;
  if (!started_) LIBRA_TRY(start());
  // What was handed out goes: the buffer holds at most one partial line
  // (within kMaxLineBytes, or next_line has failed) and one chunk.
  if (begin_ > 0) {
    buf_.erase(0, begin_);
    begin_ = 0;
  }
  bool more = false;
  if (gzip_) {
    LIBRA_ASSIGN_OR_RETURN(more, inflate_some());
  } else {
    more = !raw_.empty();
    if (!more) {
      LIBRA_ASSIGN_OR_RETURN(more, next_raw());
    }
    if (more) {
      make_room(buf_, raw_.size());
      buf_.append(reinterpret_cast<const char*>(raw_.data()), raw_.size());
      consumed_ += raw_.size();
      raw_ = {};
    }
  }
  if (!more) end_ = true;
  return more;
}

Result<std::optional<std::string_view>> CorpusStream::next_line() {
  for (;;) {
    const std::string_view p = pending();
    const std::size_t nl = p.find('\n', scanned_);
    const std::size_t len = nl == std::string_view::npos ? p.size() : nl;
    if (len > kMaxLineBytes) {
      return invalid_input(name_ + ":" + std::to_string(line_ + 1) + ": line longer than " +
                           std::to_string(kMaxLineBytes >> 20) +
                           " MiB; a corpus line holds one sample or one packed sequence");
    }
    if (nl != std::string_view::npos) {
      ++line_;
      begin_ += nl + 1;
      scanned_ = 0;
      return std::optional<std::string_view>(p.substr(0, nl));
    }
    scanned_ = p.size();
    LIBRA_ASSIGN_OR_RETURN(bool more, fill());
    if (!more) {
      const std::string_view last = pending();
      if (last.empty()) return std::optional<std::string_view>();
      ++line_;
      begin_ += last.size();
      scanned_ = 0;
      return std::optional<std::string_view>(last);
    }
  }
}

Result<std::string_view> CorpusStream::peek(std::size_t n) {
  while (pending().size() < n) {
    LIBRA_ASSIGN_OR_RETURN(bool more, fill());
    if (!more) break;
  }
  return pending();
}

Result<std::uint64_t> CorpusStream::take_rest(std::string& out, std::uint64_t keep) {
  std::uint64_t total = 0;
  for (;;) {
    const std::string_view p = pending();
    total += p.size();
    if (out.size() < keep) out.append(p.substr(0, std::min<std::uint64_t>(p.size(), keep - out.size())));
    begin_ += p.size();
    scanned_ = 0;
    LIBRA_ASSIGN_OR_RETURN(bool more, fill());
    if (!more) return total;
  }
}

}  // namespace libra::detail
