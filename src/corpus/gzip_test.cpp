#include "corpus/gzip.hpp"

#include <gtest/gtest.h>
#include <zlib.h>

#include <string>
#include <vector>

namespace libra::detail {
namespace {

// One gzip member made by zlib's deflate, the independent encoder.
std::vector<unsigned char> gzip_member(const std::string& text) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<unsigned char> out(deflateBound(&z, text.size()) + 32);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(Gunzip, InflatesLargeAndMultiMemberStreams) {
  std::string big;
  for (int i = 0; i < 200000; ++i) big += std::to_string(i % 977 + 1) + "\n";
  auto a = gzip_member(big), b = gzip_member("7\n8\n");
  auto r = gunzip(a, "big.gz");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(*r, big);
  a.insert(a.end(), b.begin(), b.end());
  r = gunzip(a, "cat.gz");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, big + "7\n8\n");
}

TEST(Gunzip, NamesTruncationCorruptionAndTheCap) {
  auto a = gzip_member("1\n2\n3\n");
  auto cut = std::vector<unsigned char>(a.begin(), a.end() - 5);
  auto r = gunzip(cut, "cut.gz");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("cut.gz: gzip: the stream ends early"), std::string::npos);
  auto bad = a;
  bad[bad.size() - 6] ^= 0xff;  // CRC
  r = gunzip(bad, "crc.gz");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("crc.gz: gzip: compressed byte"), std::string::npos);
  r = gunzip(gzip_member(std::string(100000, '1')), "bomb.gz", 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("inflates to more than 1000 bytes"), std::string::npos);
  auto trailing = a;
  trailing.push_back(0);
  EXPECT_FALSE(gunzip(trailing, "junk.gz").ok());
}

// Issue 21: a small gzip file inflating to gigabytes with no newline was
// inflated whole ("out of memory"); it now fails at its line, once the line
// passes kMaxLineBytes, with the output never larger than that.
TEST(Gunzip, ALineLongerThanTheBoundFailsAtThatLine) {
  auto bomb = gzip_member("1\n2\n" + std::string(kMaxLineBytes + 1, '0'));
  auto r = gunzip(bomb, "zeros.gz");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("zeros.gz:3: line longer than 64 MiB"), std::string::npos) << r.error().message();
  EXPECT_TRUE(gunzip(gzip_member("1\n" + std::string(1000, '2') + "\n"), "ok.gz").ok());
}

}  // namespace
}  // namespace libra::detail
