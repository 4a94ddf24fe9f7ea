// gzip inflation for corpus readers (zlib): `libra corpus stats lengths.txt.gz`.
//
//   Result<std::string> text = libra::detail::gunzip(bytes, "lengths.txt.gz");
#pragma once

#include <span>
#include <cstdint>
#include <string>
#include <string_view>

#include "libra/status.hpp"

namespace libra::detail {

// Inflates every gzip member of `bytes`; the error names `name` and the
// compressed byte where the stream broke. Output is capped at kMaxGunzipBytes
// so a crafted stream cannot exhaust memory.
inline constexpr std::size_t kMaxGunzipBytes = std::size_t{1} << 36;  // 64 GiB
[[nodiscard]] Result<std::string> gunzip(std::span<const unsigned char> bytes, const std::string& name,
                                         std::size_t max_bytes = kMaxGunzipBytes);

// Corpus lines are one sample length or one packed sequence (a 1M-token
// sequence of 1-token samples is ~2 MB of text): a longer line is no
// corpus. Streams (gzip, standard input) are checked as they are read, so a
// small file inflating to gigabytes without a newline fails at its first
// line, not when memory runs out.
inline constexpr std::size_t kMaxLineBytes = std::size_t{1} << 26;  // 64 MiB

// Counts lines across the chunks of a stream and fails on the first longer
// than kMaxLineBytes.
class LineBound {
 public:
  [[nodiscard]] Status add(std::string_view chunk, const std::string& name);

 private:
  std::int64_t line_ = 1;
  std::size_t run_ = 0;  // bytes since the last newline
};

}  // namespace libra::detail
