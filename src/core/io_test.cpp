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

}  // namespace
}  // namespace libra
