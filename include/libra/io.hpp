// libra/io.hpp: whole-file reads and atomic file writes.
//
// Every file libra writes goes through write_file_atomic: the bytes go to a
// temporary file beside the target, are flushed to disk, and are renamed over
// the target only when complete, so a crash or an error never leaves a
// half-written output behind.
//
//   libra::Status s = libra::write_file_atomic("plan.json", text);
//   libra::Result<std::string> bytes = libra::read_file("pool.jsonl");
#pragma once

#include <string>
#include <string_view>

#include "libra/status.hpp"

namespace libra {

[[nodiscard]] Result<std::string> read_file(const std::string& path);

// Writes `contents` to `path` atomically (temporary file, fsync, rename).
// The path "-" means standard output, written directly.
[[nodiscard]] Status write_file_atomic(const std::string& path, std::string_view contents);

}  // namespace libra
