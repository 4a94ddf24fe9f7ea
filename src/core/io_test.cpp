#include "libra/io.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

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

// Issue 35 (F1): the rename replaced whatever the path named. A scratch
// directory per test; nothing outside it is touched.
class OutputKinds : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("libra_kinds_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string at(const std::string& name) const { return (dir_ / name).string(); }
  static mode_t kind(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st.st_mode & S_IFMT;
  }
  static mode_t perms(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
    return st.st_mode & 07777;
  }
  std::size_t entries() const {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  fs::path dir_;
};

TEST_F(OutputKinds, AReplacedFileKeepsItsModeAndANewOneFollowsTheUmask) {
  const std::string f = at("private.json");
  ASSERT_TRUE(write_file_atomic(f, "one").ok());
  const mode_t mask = ::umask(0);
  ::umask(mask);
  EXPECT_EQ(perms(f), 0666 & ~mask);
  ASSERT_EQ(::chmod(f.c_str(), 0600), 0);
  ASSERT_TRUE(write_file_atomic(f, "two").ok());
  EXPECT_EQ(perms(f), 0600U);
  EXPECT_EQ(*read_file(f), "two");
  EXPECT_EQ(entries(), 1U);
}

TEST_F(OutputKinds, ASymlinkIsWrittenThroughToItsTarget) {
  const std::string target = at("target.json"), link = at("link.json"), dangling = at("dangling.json");
  ASSERT_TRUE(write_file_atomic(target, "old").ok());
  ASSERT_EQ(::chmod(target.c_str(), 0640), 0);
  fs::create_symlink("target.json", link);  // relative, as `ln -s` makes them
  EXPECT_TRUE(check_writable(link).ok());
  ASSERT_TRUE(write_file_atomic(link, "new").ok());
  EXPECT_EQ(kind(link), static_cast<mode_t>(S_IFLNK));
  EXPECT_EQ(*read_file(target), "new");
  EXPECT_EQ(perms(target), 0640U);
  EXPECT_EQ(*output_target(link), *output_target(target));
  fs::create_symlink(dir_ / "sub" / "made.json", dangling);  // its directory does not exist
  EXPECT_EQ(check_writable(dangling).message(),
            dangling + ": directory " + (dir_ / "sub").string() + " does not exist");
  fs::create_directories(dir_ / "sub");
  ASSERT_TRUE(write_file_atomic(dangling, "made").ok());
  EXPECT_EQ(kind(dangling), static_cast<mode_t>(S_IFLNK));
  EXPECT_EQ(*read_file((dir_ / "sub" / "made.json").string()), "made");
  const std::string loop = at("loop");
  fs::create_symlink("loop", loop);
  EXPECT_EQ(check_writable(loop).message(), loop + ": too many levels of symbolic links");
  EXPECT_FALSE(write_file_atomic(loop, "x").ok());
}

TEST_F(OutputKinds, AFifoIsWrittenInPlaceAndOneWithoutAReaderIsAnError) {
  const std::string fifo = at("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_TRUE(check_writable(fifo).ok());
  const Status none = write_file_atomic(fifo, "lost");
  EXPECT_EQ(none.message(), fifo + ": a FIFO with no reader (start the reader first)");
  std::string got;
  std::thread reader([&] {
    std::ifstream in(fifo);  // blocks until the writer opens
    got.assign(std::istreambuf_iterator<char>(in), {});
  });
  Status s;
  for (int i = 0; i < 500; ++i) {  // until the reader has opened its end
    s = write_file_atomic(fifo, "streamed");
    if (s.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!s.ok()) ::close(::open(fifo.c_str(), O_WRONLY));  // lets the reader go rather than hang the test
  reader.join();
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(got, "streamed");
  EXPECT_EQ(kind(fifo), static_cast<mode_t>(S_IFIFO));
  EXPECT_EQ(entries(), 1U);
}

// As root, `-o /dev/null` turned /dev/null into a regular file. A device
// node of our own (1, 3 is the null device) in the scratch directory.
TEST_F(OutputKinds, ACharacterDeviceIsWrittenInPlace) {
  const std::string dev = at("null");
  if (::mknod(dev.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0) GTEST_SKIP() << "mknod needs root";
  EXPECT_TRUE(check_writable(dev).ok());
  ASSERT_TRUE(write_file_atomic(dev, "discarded").ok());
  EXPECT_EQ(kind(dev), static_cast<mode_t>(S_IFCHR));
  EXPECT_EQ(entries(), 1U);
}

TEST_F(OutputKinds, OtherSpecialFilesAreRefusedInOneLine) {
  const std::string sock = at("sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string want = sock + ": is a socket; libra writes only regular files, character devices and FIFOs";
  EXPECT_EQ(check_writable(sock).message(), want);
  EXPECT_EQ(write_file_atomic(sock, "x").message(), want);
  EXPECT_EQ(kind(sock), static_cast<mode_t>(S_IFSOCK));
  ::close(fd);
  const std::string link = at("to-sock");
  fs::create_symlink(sock, link);
  EXPECT_EQ(check_writable(link).message(),
            link + ": is a socket; libra writes only regular files, character devices and FIFOs");
  const std::string blk = at("block");
  if (::mknod(blk.c_str(), S_IFBLK | 0600, ::makedev(7, 255)) == 0) {  // root only: a loop device number, never opened
    EXPECT_EQ(write_file_atomic(blk, "x").message(),
              blk + ": is a block device; libra writes only regular files, character devices and FIFOs");
    EXPECT_EQ(kind(blk), static_cast<mode_t>(S_IFBLK));
  }
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
