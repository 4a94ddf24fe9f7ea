// gzip inflation for corpus readers (zlib): `libra corpus stats lengths.txt.gz`.
//
//   Result<std::string> text = libra::detail::gunzip(bytes, "lengths.txt.gz");
#pragma once

#include <span>
#include <string>

#include "libra/status.hpp"

namespace libra::detail {

// Inflates every gzip member of `bytes`; the error names `name` and the
// compressed byte where the stream broke. Output is capped at kMaxGunzipBytes
// so a crafted stream cannot exhaust memory.
inline constexpr std::size_t kMaxGunzipBytes = std::size_t{1} << 36;  // 64 GiB
[[nodiscard]] Result<std::string> gunzip(std::span<const unsigned char> bytes, const std::string& name,
                                         std::size_t max_bytes = kMaxGunzipBytes);

}  // namespace libra::detail
