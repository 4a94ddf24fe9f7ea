#include "libra/io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace libra {

Result<std::string> read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return io_error(path + ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot open for reading: " + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return io_error(path + ": read failed");
  return buffer.str();
}

namespace {

std::string parent_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// What an output path names once the symbolic links of its last component
// are followed (a link is written through to its target, dangling or not).
struct OutputTarget {
  std::string path;  // the file the bytes land in
  bool exists = false;
  struct stat st {};
};

Result<OutputTarget> resolve_output(const std::string& path) {
  OutputTarget t{path};
  // Anything but a regular file is opened by the path itself (the kernel
  // follows /dev/stdout's and /dev/fd/N's links to a terminal or a pipe).
  if (::stat(path.c_str(), &t.st) == 0 && !S_ISREG(t.st.st_mode)) {
    t.exists = true;
    return t;
  }
  for (int hops = 0; hops < 40; ++hops) {
    if (::lstat(t.path.c_str(), &t.st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return t;  // the directory check names the missing part
      return invalid_input(path + ": " + std::strerror(errno));
    }
    if (!S_ISLNK(t.st.st_mode)) {
      t.exists = true;
      return t;
    }
    std::string link(4096, '\0');
    const ssize_t n = ::readlink(t.path.c_str(), link.data(), link.size());
    if (n < 0 || static_cast<std::size_t>(n) >= link.size()) {
      return invalid_input(path + ": cannot read the symbolic link " + t.path);
    }
    link.resize(static_cast<std::size_t>(n));
    t.path = link.front() == '/' ? link : parent_of(t.path) + "/" + link;
  }
  return invalid_input(path + ": too many levels of symbolic links");
}

// Special files are not replaced: a character device (/dev/null, a
// terminal) or a FIFO is written in place, as "-" writes standard output;
// anything else that is not a regular file is refused.
Status check_output_kind(const std::string& path, const OutputTarget& t) {
  if (!t.exists || S_ISREG(t.st.st_mode) || S_ISCHR(t.st.st_mode) || S_ISFIFO(t.st.st_mode)) return {};
  const char* kind = S_ISDIR(t.st.st_mode)    ? "is a directory, not a file"
                     : S_ISBLK(t.st.st_mode)  ? "is a block device; libra writes only regular files, character devices and FIFOs"
                     : S_ISSOCK(t.st.st_mode) ? "is a socket; libra writes only regular files, character devices and FIFOs"
                                              : "is not a regular file, character device or FIFO";
  return invalid_input(path + ": " + kind);
}

Status write_all(int fd, std::string_view contents) {
  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(std::strerror(errno));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return {};
}

// A FIFO is opened without blocking first: with no reader, that is an error
// now rather than a wait forever.
Status write_in_place(const std::string& path, const OutputTarget& t, std::string_view contents) {
  const int fd = ::open(t.path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENXIO && S_ISFIFO(t.st.st_mode)) return io_error(path + ": a FIFO with no reader (start the reader first)");
    return io_error(path + ": cannot open for writing: " + std::strerror(errno));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  Status s = write_all(fd, contents);
  ::close(fd);
  return s.ok() ? Status() : io_error(path + ": write failed: " + s.message());
}

// A temporary file beside the target, created with O_EXCL and mode 0666
// (the umask applies, as to any new file); the name's suffix is drawn until
// one is free.
int create_temporary(const std::string& target, std::string& tmp) {
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp = target + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

}  // namespace

Status write_file_atomic(const std::string& path, std::string_view contents) {
  if (path == "-") {
    std::cout.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    std::cout.flush();
    if (!std::cout) return io_error("standard output: write failed");
    return {};
  }
  if (path.empty()) return invalid_input("output path is empty");
  LIBRA_ASSIGN_OR_RETURN(OutputTarget t, resolve_output(path));
  LIBRA_TRY(check_output_kind(path, t));
  if (t.exists && !S_ISREG(t.st.st_mode)) return write_in_place(path, t, contents);
  std::string tmp;
  const int fd = create_temporary(t.path, tmp);
  if (fd < 0) return io_error(path + ": cannot create temporary file: " + std::strerror(errno));
  auto fail = [&](const char* what, const std::string& why) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error(path + ": " + what + ": " + why);
  };
  if (Status s = write_all(fd, contents); !s.ok()) return fail("write failed", s.message());
  // The file that is replaced keeps its permissions (and, where allowed, its
  // owner): a 0600 output stays 0600.
  if (t.exists) {
    if (::fchmod(fd, t.st.st_mode & 07777) != 0) return fail("chmod failed", std::strerror(errno));
    if (t.st.st_uid != ::geteuid() || t.st.st_gid != ::getegid()) (void)::fchown(fd, t.st.st_uid, t.st.st_gid);
  }
  if (::fsync(fd) != 0) return fail("fsync failed", std::strerror(errno));
  if (::close(fd) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": close failed: " + std::strerror(saved));
  }
  if (std::rename(tmp.c_str(), t.path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": cannot rename into place: " + std::strerror(saved));
  }
  return {};
}

Status check_writable(const std::string& path) {
  if (path == "-") return {};
  if (path.empty()) return invalid_input("output path is empty");
  LIBRA_ASSIGN_OR_RETURN(OutputTarget t, resolve_output(path));
  LIBRA_TRY(check_output_kind(path, t));
  if (t.exists && !S_ISREG(t.st.st_mode)) {
    if (::access(t.path.c_str(), W_OK) != 0) return invalid_input(path + ": not writable: " + std::strerror(errno));
    return {};
  }
  const std::string dir = parent_of(t.path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return invalid_input(path + ": directory " + dir + (errno == ENOENT ? " does not exist" : std::string(": ") + std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return invalid_input(path + ": " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return invalid_input(path + ": directory " + dir + " is not writable: " + std::strerror(errno));
  }
  return {};
}

Result<std::string> output_target(const std::string& path) {
  if (path == "-") return std::string("-");
  LIBRA_ASSIGN_OR_RETURN(OutputTarget t, resolve_output(path));
  if (t.exists && !S_ISREG(t.st.st_mode) && !S_ISDIR(t.st.st_mode)) {
    // Written in place, by an fd that may have no path of its own (a pipe
    // behind /dev/stdout): the file's identity instead.
    return "special file " + std::to_string(t.st.st_dev) + ":" + std::to_string(t.st.st_ino);
  }
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::weakly_canonical(std::filesystem::absolute(t.path, ec), ec);
  if (ec) return invalid_input(path + ": " + ec.message());
  std::string out = abs.lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

Status check_writable_dir(const std::string& path) {
  if (path.empty()) return invalid_input("output directory path is empty");
  std::string dir = path;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st {};
  for (;;) {
    if (::stat(dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return invalid_input(path + ": " + dir + " exists and is not a directory");
      if (::access(dir.c_str(), W_OK | X_OK) != 0) {
        return invalid_input(path + ": directory " + dir + " is not writable: " + std::strerror(errno));
      }
      return {};
    }
    if (errno != ENOENT && errno != ENOTDIR) return invalid_input(path + ": " + dir + ": " + std::strerror(errno));
    const std::size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos) return {};  // relative: the working directory is checked by the write
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (a == "-" || b == "-" || ::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void write_stderr_line(std::string_view line) {
  std::string whole;
  whole.reserve(line.size() + 1);
  whole.append(line);
  whole.push_back('\n');
  std::string_view rest = whole;
  while (!rest.empty()) {
    const ssize_t n = ::write(STDERR_FILENO, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed or full: nothing better to do with a message
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace libra
