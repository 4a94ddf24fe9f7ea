#include "corpus/gzip.hpp"

#include <zlib.h>

#include <limits>

namespace libra::detail {

Status LineBound::add(std::string_view chunk, const std::string& name) {
  for (std::size_t at = 0; at < chunk.size();) {
    const std::size_t nl = chunk.find('\n', at);
    const std::size_t n = (nl == std::string_view::npos ? chunk.size() : nl) - at;
    if (run_ + n > kMaxLineBytes) {
      return invalid_input(name + ":" + std::to_string(line_) + ": line longer than " +
                           std::to_string(kMaxLineBytes >> 20) + " MiB; a corpus line holds one sample or one packed "
                           "sequence");
    }
    if (nl == std::string_view::npos) {
      run_ += n;
      break;
    }
    run_ = 0;
    ++line_;
    at = nl + 1;
  }
  return {};
}

Result<std::string> gunzip(std::span<const unsigned char> bytes, const std::string& name, std::size_t max_bytes) {
  std::string out;
  z_stream z{};
  // 16 + MAX_WBITS: gzip header and trailer (CRC and length checked by zlib).
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return internal_error(name + ": gzip: cannot initialise zlib");
  std::size_t pos = 0;
  LineBound lines;
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
      if (Status s = lines.add(std::string_view(buf, got), name); !s.ok()) {
        inflateEnd(&z);
        return s.error();
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
