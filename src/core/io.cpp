#include "libra/io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

Status write_file_atomic(const std::string& path, std::string_view contents) {
  if (path == "-") {
    std::cout.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    std::cout.flush();
    if (!std::cout) return io_error("standard output: write failed");
    return {};
  }
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) return io_error(path + ": cannot create temporary file: " + std::strerror(errno));
  auto fail = [&](const char* what) {
    int saved = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error(path + ": " + what + ": " + std::strerror(saved));
  };
  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("write failed");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0) return fail("chmod failed");
  if (::fsync(fd) != 0) return fail("fsync failed");
  if (::close(fd) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": close failed: " + std::strerror(saved));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int saved = errno;
    ::unlink(tmp.c_str());
    return io_error(path + ": cannot rename into place: " + std::strerror(saved));
  }
  return {};
}

Status check_writable(const std::string& path) {
  if (path == "-") return {};
  if (path.empty()) return invalid_input("output path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return invalid_input(path + ": is a directory, not a file");
  }
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (::stat(dir.c_str(), &st) != 0) {
    return invalid_input(path + ": directory " + dir + (errno == ENOENT ? " does not exist" : std::string(": ") + std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) return invalid_input(path + ": " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return invalid_input(path + ": directory " + dir + " is not writable: " + std::strerror(errno));
  }
  return {};
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
