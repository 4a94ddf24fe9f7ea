// Test-only: gzip members made by zlib's own deflate, the encoder independent
// of the stream reader under test. Shared by the corpus test files.
//
//   Bytes gz = gzip_member("1 2 3\n");   // one member; concatenate for more
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <span>
#include <string_view>
#include <vector>

namespace libra::test_util {

inline std::vector<unsigned char> gzip_member(std::span<const unsigned char> bytes, int level = Z_BEST_SPEED) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::vector<unsigned char> out(deflateBound(&z, bytes.size()) + 32);
  z.next_in = const_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

inline std::vector<unsigned char> gzip_member(std::string_view text, int level = Z_BEST_SPEED) {
  return gzip_member(std::span(reinterpret_cast<const unsigned char*>(text.data()), text.size()), level);
}

}  // namespace libra::test_util
