#include "corpus/gzip.hpp"

#include <zlib.h>

#include <limits>

namespace libra::detail {

Result<std::string> gunzip(std::span<const unsigned char> bytes, const std::string& name, std::size_t max_bytes) {
  std::string out;
  z_stream z{};
  // 16 + MAX_WBITS: gzip header and trailer (CRC and length checked by zlib).
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return internal_error(name + ": gzip: cannot initialise zlib");
  std::size_t pos = 0;
  char buf[1 << 16];
  int rc = Z_OK;
  while (true) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - pos, std::numeric_limits<uInt>::max());
    z.next_in = const_cast<Bytef*>(bytes.data() + pos);
    z.avail_in = static_cast<uInt>(chunk);
    do {
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof buf;
      rc = inflate(&z, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
        const std::string why = z.msg != nullptr ? z.msg : "corrupt data";
        const std::size_t at = pos + (chunk - z.avail_in);
        inflateEnd(&z);
        return invalid_input(name + ": gzip: compressed byte " + std::to_string(at) + ": " + why);
      }
      const std::size_t got = sizeof buf - z.avail_out;
      if (out.size() + got > max_bytes) {
        inflateEnd(&z);
        return invalid_input(name + ": gzip: inflates to more than " + std::to_string(max_bytes) + " bytes");
      }
      out.append(buf, got);
    } while (z.avail_out == 0 && rc != Z_STREAM_END);
    pos += chunk - z.avail_in;
    if (rc == Z_STREAM_END) {
      if (pos == bytes.size()) break;
      // Another gzip member follows (cat a.gz b.gz).
      if (inflateReset(&z) != Z_OK) break;
      continue;
    }
    if (pos == bytes.size()) {
      inflateEnd(&z);
      return invalid_input(name + ": gzip: the stream ends early at compressed byte " + std::to_string(pos) +
                           " (truncated file)");
    }
  }
  inflateEnd(&z);
  return out;
}

}  // namespace libra::detail
