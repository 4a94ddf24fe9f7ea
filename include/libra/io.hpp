// libra/io.hpp: whole-file reads and atomic file writes.
//
// Every file libra writes goes through write_file_atomic: the bytes go to a
// temporary file beside the target, are flushed to disk, and are renamed over
// the target only when complete, so a crash or an error never leaves a
// half-written output behind. The target is what the path names after its
// symbolic links are followed (the link stays, its target gets the bytes); a
// file that is replaced keeps its permission bits; a character device
// (/dev/null) or a FIFO is written in place, never replaced; any other
// special file (block device, socket, directory) is refused.
//
//   libra::Status s = libra::write_file_atomic("plan.json", text);
//   libra::Result<std::string> bytes = libra::read_file("pool.jsonl");
//   if (libra::Status s = libra::check_writable(out); !s.ok()) ...  // before the work
#pragma once

#include <string>
#include <string_view>

#include "libra/status.hpp"

namespace libra {

[[nodiscard]] Result<std::string> read_file(const std::string& path);

// Writes `contents` to `path` atomically (temporary file, fsync, rename),
// as above. The path "-" means standard output, written directly; so are a
// character device and a FIFO (one with no reader is an error, not a wait).
[[nodiscard]] Status write_file_atomic(const std::string& path, std::string_view contents);

// Checks, before any work, that write_file_atomic(path, ...) can succeed as
// far as the file system can tell: "-", a writable character device or FIFO,
// or a path (symbolic links followed) that is no other special file and whose
// directory exists and is writable. The message names the path and the
// reason, e.g. "/nonexistent/x.json: directory /nonexistent does not exist".
[[nodiscard]] Status check_writable(const std::string& path);

// The absolute, normalised path that write_file_atomic(path, ...) writes
// (symbolic links of the last component followed, existing directories
// resolved), or "-": two outputs with the same target collide.
[[nodiscard]] Result<std::string> output_target(const std::string& path);

// The same before writing into directory `path`, created if missing (with
// its parents): an existing directory, or a path whose nearest existing
// ancestor is a writable directory.
[[nodiscard]] Status check_writable_dir(const std::string& path);

// True when both paths name one existing file (same device and inode), so an
// output would replace an input.
bool same_file(const std::string& a, const std::string& b);

// Writes `line` and a newline to stderr in one write(2). Under mpirun the
// processes share one stderr: a line written in pieces (as `std::cerr << a
// << b` does, stderr being unbuffered) can be cut by another process's
// output, so every message libra prints goes through here.
void write_stderr_line(std::string_view line);

}  // namespace libra
