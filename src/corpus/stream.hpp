// Corpus sources read as a stream of lines (internal): plain files, standard
// input and gzip, inflated in fixed-size chunks, each line handed out as it
// completes. Memory is bounded by the longest line allowed, not by the file,
// so a small gzip file inflating to gigabytes fails at its bad line instead
// of exhausting memory.
//
//   libra::detail::CorpusStream s = libra::detail::CorpusStream::from_fd(fd, "lengths.txt.gz");
//   while (true) {
//     LIBRA_ASSIGN_OR_RETURN(std::optional<std::string_view> line, s.next_line());
//     if (!line) break;  // s.line_number() numbers *line
//   }
#pragma once

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/status.hpp"

namespace libra::detail {

// Corpus lines are one sample length or one packed sequence (a 1M-token
// sequence of 1-token samples is ~2 MB of text): a longer line is no
// corpus, and a source holding one is refused at that line.
inline constexpr std::size_t kMaxLineBytes = std::size_t{1} << 26;  // 64 MiB

// Bytes read from a file descriptor, and inflated, per step.
inline constexpr std::size_t kStreamChunk = std::size_t{1} << 16;

class CorpusStream {
 public:
  // Reads `fd` (borrowed, not closed) in chunks; a gzip stream (magic 1f 8b,
  // any number of members) is inflated, whatever its name. Messages name `name`.
  static CorpusStream from_fd(int fd, std::string name);
  // `bytes` as they are (inflate false: lines are views into `bytes`, no
  // copy) or as gzip (inflate true).
  static CorpusStream from_memory(std::span<const unsigned char> bytes, std::string name, bool inflate);

  CorpusStream(CorpusStream&&) noexcept = default;
  CorpusStream& operator=(CorpusStream&&) = delete;

  // The next line without its '\n' (a last line without one too), valid
  // until the next call; nullopt at the end. A line longer than
  // kMaxLineBytes is an error naming it, found before it is held whole.
  [[nodiscard]] Result<std::optional<std::string_view>> next_line();
  // The 1-based number of the line next_line last returned.
  std::int64_t line_number() const { return line_; }

  // At least `n` decoded bytes not yet handed out (fewer only at the end),
  // without consuming them: how a format is told from its first bytes.
  [[nodiscard]] Result<std::string_view> peek(std::size_t n);

  // Everything not yet handed out, for a binary format read whole: at most
  // `keep` bytes go into `out`; the rest is read and counted, not kept.
  // Returns the total count.
  [[nodiscard]] Result<std::uint64_t> take_rest(std::string& out, std::uint64_t keep);

  bool gzip() const { return gzip_; }
  // The bytes reserved for decoded data (what the tests bound).
  std::size_t buffered_capacity() const { return buf_.capacity(); }
  const std::string& name() const { return name_; }

 private:
  CorpusStream(std::string name, int fd, std::span<const unsigned char> mem);
  std::string_view pending() const;
  [[nodiscard]] Status start();
  // Appends the next decoded chunk; false at the end of the source.
  [[nodiscard]] Result<bool> fill();
  [[nodiscard]] Result<bool> next_raw();
  [[nodiscard]] Result<bool> inflate_some();

  std::string name_;
  int fd_ = -1;
  std::span<const unsigned char> mem_;  // memory input not yet in raw_
  std::vector<unsigned char> in_;       // a chunk read from fd_
  std::span<const unsigned char> raw_;  // raw bytes not yet consumed
  std::uint64_t consumed_ = 0;          // raw bytes consumed: the offset in compressed-byte messages
  bool gzip_ = false;
  bool view_ = false;      // plain memory: lines are views into whole_
  std::string_view whole_;
  // zlib's state points back at its z_stream: held on the heap, it stays put when the stream moves.
  struct ZlibEnd {
    void operator()(z_stream* z) const;
  };
  std::unique_ptr<z_stream, ZlibEnd> z_;
  bool started_ = false;
  bool member_end_ = false;
  std::string buf_;         // decoded bytes; [begin_, size) not yet handed out
  std::size_t begin_ = 0;
  std::size_t scanned_ = 0;  // bytes after begin_ known to hold no '\n'
  bool end_ = false;
  std::int64_t line_ = 0;
};

}  // namespace libra::detail
