#include "corpus/stream.hpp"
#include "corpus/gzip_test_util.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <string>
#include <thread>
#include <vector>

namespace libra::detail {
namespace {

using Bytes = std::vector<unsigned char>;

using test_util::gzip_member;

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The lines of `text` by the plain definition: split at '\n', a last line
// without one counts, nothing after a final '\n'.
std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::string cur;
  for (char c : text) {
    if (c == '\n') {
      lines.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

// Every line of `s`, or the error message as the last element.
std::vector<std::string> read_lines(CorpusStream& s, std::string* error = nullptr) {
  std::vector<std::string> lines;
  for (;;) {
    auto line = s.next_line();
    if (!line.ok()) {
      if (error != nullptr) *error = line.error().message();
      return lines;
    }
    if (!*line) return lines;
    lines.emplace_back(**line);
    EXPECT_EQ(s.line_number(), static_cast<std::int64_t>(lines.size()));
  }
}

std::string error_of(CorpusStream s) {
  std::string error;
  read_lines(s, &error);
  return error;
}

// Feeds `bytes` into a pipe `step` bytes per write, from another thread.
class Pipe {
 public:
  Pipe(Bytes bytes, std::size_t step) {
    EXPECT_EQ(::pipe(fds_), 0);
    writer_ = std::thread([this, bytes = std::move(bytes), step] {
      for (std::size_t at = 0; at < bytes.size();) {
        const ssize_t n = ::write(fds_[1], bytes.data() + at, std::min(step, bytes.size() - at));
        if (n <= 0) break;  // the reader stopped early (EPIPE)
        at += static_cast<std::size_t>(n);
      }
      ::close(fds_[1]);
    });
  }
  ~Pipe() {
    ::close(fds_[0]);
    writer_.join();
  }
  int fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
  std::thread writer_;
};

TEST(CorpusStream, InflatesLargeAndMultiMemberStreamsLineByLine) {
  std::string big;
  for (int i = 0; i < 200000; ++i) big += std::to_string(i % 977 + 1) + (i % 5 == 0 ? "\r\n" : "\n");
  const std::string tail = "7\n\n8";  // a blank line, and a last line with no newline
  const Bytes one = gzip_member(big), two = concat(one, gzip_member(tail));
  auto s = CorpusStream::from_memory(one, "big.gz", true);
  EXPECT_EQ(read_lines(s), split(big));
  auto c = CorpusStream::from_memory(two, "cat.gz", true);
  EXPECT_EQ(read_lines(c), split(big + tail));
  // From a pipe that hands over one byte at a time at first (the magic split
  // across reads), then in odd-sized pieces.
  const Pipe bytewise(two, 1);
  auto p = CorpusStream::from_fd(bytewise.fd(), "pipe.gz");
  EXPECT_EQ(read_lines(p), split(big + tail));
  EXPECT_TRUE(p.gzip());
  const Pipe odd(two, 4099);
  auto q = CorpusStream::from_fd(odd.fd(), "pipe.gz");
  EXPECT_EQ(read_lines(q), split(big + tail));
  // Plain bytes from a pipe, and plain memory.
  const std::string plain = big + tail;
  const Pipe text(Bytes(plain.begin(), plain.end()), 777);
  auto t = CorpusStream::from_fd(text.fd(), "pipe.txt");
  EXPECT_EQ(read_lines(t), split(plain));
  EXPECT_FALSE(t.gzip());
  const Bytes plain_bytes(plain.begin(), plain.end());
  auto m = CorpusStream::from_memory(plain_bytes, "m.txt", false);
  EXPECT_EQ(read_lines(m), split(plain));
}

TEST(CorpusStream, NamesTruncationCorruptionAndTheirCompressedByte) {
  const Bytes a = gzip_member("1\n2\n3\n");
  const Bytes cut(a.begin(), a.end() - 5);
  EXPECT_EQ(error_of(CorpusStream::from_memory(cut, "cut.gz", true)),
            "cut.gz: gzip: the stream ends early at compressed byte " + std::to_string(cut.size()) + " (truncated file)");
  // The same from a pipe delivering 3 bytes at a time: the offset is the file's.
  const Pipe pipe(cut, 3);
  EXPECT_EQ(error_of(CorpusStream::from_fd(pipe.fd(), "cut.gz")),
            "cut.gz: gzip: the stream ends early at compressed byte " + std::to_string(cut.size()) + " (truncated file)");
  Bytes bad = a;
  bad[bad.size() - 6] ^= 0xff;  // the CRC: found once the whole member is read
  EXPECT_EQ(error_of(CorpusStream::from_memory(bad, "crc.gz", true)).rfind("crc.gz: gzip: compressed byte ", 0), 0U);
  // A corrupt second member names its byte within the whole file.
  Bytes second = gzip_member("4\n");
  second[3] = 0xe0;  // reserved flag bits: zlib refuses the header
  const std::string e = error_of(CorpusStream::from_memory(concat(a, second), "two.gz", true));
  EXPECT_EQ(e.rfind("two.gz: gzip: compressed byte ", 0), 0U) << e;
  const std::size_t at = std::stoul(e.substr(std::string("two.gz: gzip: compressed byte ").size()));
  EXPECT_GT(at, a.size());
  EXPECT_LE(at, a.size() + 10);
  Bytes trailing = a;
  trailing.push_back(0);
  EXPECT_FALSE(error_of(CorpusStream::from_memory(trailing, "junk.gz", true)).empty());
  // Lines already complete were handed out before the damage was reached.
  auto s = CorpusStream::from_memory(cut, "cut.gz", true);
  std::string error;
  read_lines(s, &error);
  EXPECT_FALSE(error.empty());
}

// Issue 21: a small gzip file inflating to gigabytes was inflated whole
// before its first line was read. A line longer than the bound now fails at
// that line, before it is held whole, and a stream of any length is read
// with a buffer of one line and one chunk.
TEST(CorpusStream, ALineLongerThanTheBoundFailsAtThatLine) {
  const Bytes bomb = gzip_member("1\n2\n" + std::string(kMaxLineBytes + 1, '0'));
  EXPECT_EQ(error_of(CorpusStream::from_memory(bomb, "zeros.gz", true)),
            "zeros.gz:3: line longer than 64 MiB; a corpus line holds one sample or one packed sequence");
  const std::string exact(kMaxLineBytes, '2');
  const Bytes fits = gzip_member("1\n" + exact + "\n3");
  auto ok = CorpusStream::from_memory(fits, "ok.gz", true);
  const auto lines = read_lines(ok);
  ASSERT_EQ(lines.size(), 3U);
  EXPECT_EQ(lines[1], exact);
  const Bytes long_line(kMaxLineBytes + 1, '5');
  EXPECT_EQ(error_of(CorpusStream::from_memory(long_line, "m.txt", false)),
            "m.txt:1: line longer than 64 MiB; a corpus line holds one sample or one packed sequence");
}

TEST(CorpusStream, MemoryIsBoundedByOneLineAndOneChunkNotByTheStream) {
  // 64 members of 1 MiB of short lines: 64 MiB inflated, 2^25 lines.
  std::string mib;
  while (mib.size() < (std::size_t{1} << 20)) mib += "7\n";
  const Bytes member = gzip_member(mib);
  Bytes many;
  for (int i = 0; i < 64; ++i) many = concat(std::move(many), member);
  auto s = CorpusStream::from_memory(many, "many.gz", true);
  std::int64_t n = 0;
  std::size_t most = 0;
  for (;;) {
    auto line = s.next_line();
    ASSERT_TRUE(line.ok()) << line.error().message();
    if (!*line) break;
    ++n;
    most = std::max(most, s.buffered_capacity());
  }
  EXPECT_EQ(n, 64 * static_cast<std::int64_t>(mib.size() / 2));
  EXPECT_LE(most, 4 * kStreamChunk);
}

TEST(CorpusStream, PeekAndTakeRestReadABinaryFormatWhole) {
  std::string bytes;
  for (int i = 0; i < 300000; ++i) bytes += static_cast<char>(i * 7);
  const Bytes gz = gzip_member(bytes);
  auto s = CorpusStream::from_memory(gz, "b.gz", true);
  auto head = s.peek(7);
  ASSERT_TRUE(head.ok());
  ASSERT_GE(head->size(), 7U);
  EXPECT_EQ(head->substr(0, 7), bytes.substr(0, 7));
  std::string kept;
  auto total = s.take_rest(kept, 1000);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, bytes.size());
  EXPECT_EQ(kept, bytes.substr(0, 1000));
}

}  // namespace
}  // namespace libra::detail
