#include "libra/io.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

namespace libra {
namespace {

namespace fs = std::filesystem;

TEST(WriteFileAtomic, WritesAndReplacesWithoutLeftovers) {
  fs::path dir = fs::temp_directory_path() / ("libra_io_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / "out.txt").string();
  ASSERT_TRUE(write_file_atomic(path, "first").ok());
  ASSERT_TRUE(write_file_atomic(path, "second").ok());
  EXPECT_EQ(*read_file(path), "second");
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1u);  // no temporary file left behind
  fs::remove_all(dir);
}

TEST(WriteFileAtomic, ReportsUnwritableDirectory) {
  Status s = write_file_atomic("/nonexistent-dir/x.txt", "data");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/nonexistent-dir/x.txt"), std::string::npos);
}

TEST(ReadFile, ReportsMissingFile) {
  auto r = read_file("/nonexistent-file.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIo);
}

TEST(ReadFile, RejectsADirectory) {
  auto r = read_file(fs::temp_directory_path().string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("not a regular file"), std::string::npos);
}

// The checks made before any work agree with what the write then does.
TEST(CheckWritable, AgreesWithWriteFileAtomic) {
  fs::path dir = fs::temp_directory_path() / ("libra_check_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "out.txt").string();
  EXPECT_TRUE(check_writable("-").ok());
  EXPECT_TRUE(check_writable(file).ok());
  EXPECT_TRUE(write_file_atomic(file, "x").ok());
  EXPECT_EQ(check_writable("/nonexistent-dir/x.txt").message(), "/nonexistent-dir/x.txt: directory /nonexistent-dir does not exist");
  EXPECT_FALSE(write_file_atomic("/nonexistent-dir/x.txt", "x").ok());
  EXPECT_EQ(check_writable(dir.string()).message(), dir.string() + ": is a directory, not a file");
  EXPECT_EQ(check_writable(file + "/y").message(), file + "/y: " + file + " is not a directory");
  EXPECT_TRUE(check_writable_dir((dir / "a" / "b").string()).ok());
  EXPECT_TRUE(check_writable_dir(dir.string() + "/").ok());
  EXPECT_EQ(check_writable_dir(file + "/sub").message(), file + "/sub: " + file + " exists and is not a directory");
  EXPECT_TRUE(same_file(file, (dir / "." / "out.txt").string()));
  EXPECT_FALSE(same_file(file, (dir / "other.txt").string()));
  EXPECT_FALSE(same_file("-", "-"));
  fs::remove_all(dir);
}

// The line arrives whole and newline-terminated. That it is one write, so
// other processes' output cannot cut it, is what the MPI test
// mpi.cli.exec_ranks_under_mpirun exercises (it failed in CI before).
TEST(WriteStderrLine, WritesTheLineAndANewline) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const int saved = ::dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_EQ(::dup2(fds[1], STDERR_FILENO), STDERR_FILENO);
  const std::string line(3000, 'x');
  write_stderr_line("libra: error: " + line);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(fds[1]);
  std::string got;
  char buf[1024];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  EXPECT_EQ(got, "libra: error: " + line + "\n");
}

}  // namespace
}  // namespace libra
