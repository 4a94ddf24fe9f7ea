#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <string>

#include "corpus/gzip_test_util.hpp"
#include "corpus/text_util.hpp"
#include "libra/corpus.hpp"
#include "libra/packing.hpp"

namespace libra {
namespace {

using Bytes = std::vector<unsigned char>;

std::span<const unsigned char> as_bytes(std::string_view s) {
  return {reinterpret_cast<const unsigned char*>(s.data()), s.size()};
}

// A temporary file removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const Bytes& contents) {
    char name[] = "/tmp/libra_corpus_test_XXXXXX";
    const int fd = ::mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    if (!contents.empty()) {
      EXPECT_EQ(::write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
    }
    ::close(fd);
  }
  explicit TempFile(std::string_view text) : TempFile(Bytes(text.begin(), text.end())) {}
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An independent Megatron .idx writer: little-endian bytes pushed one by one,
// following megatron/core/datasets/indexed_dataset.py (_IndexWriter).
void put(Bytes& b, std::uint64_t v, int width) {
  for (int i = 0; i < width; ++i) b.push_back(static_cast<unsigned char>((v >> (8 * i)) & 0xff));
}
Bytes write_idx(const std::vector<std::int32_t>& lengths, const std::vector<std::int64_t>& doc_index,
                unsigned dtype = 8, unsigned item_size = 2) {
  Bytes b = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  put(b, 1, 8);
  put(b, dtype, 1);
  put(b, lengths.size(), 8);
  put(b, doc_index.size(), 8);
  for (std::int32_t l : lengths) put(b, static_cast<std::uint32_t>(l), 4);
  std::uint64_t pointer = 0;
  for (std::int32_t l : lengths) {
    put(b, pointer, 8);
    pointer += static_cast<std::uint64_t>(l) * item_size;
  }
  for (std::int64_t d : doc_index) put(b, static_cast<std::uint64_t>(d), 8);
  return b;
}

std::string error_of(const Result<std::vector<std::int64_t>>& r) { return r.ok() ? "(ok)" : r.error().message(); }
std::string error_of(const Result<std::vector<PackedSequence>>& r) { return r.ok() ? "(ok)" : r.error().message(); }

TEST(LengthLines, AcceptsBlankLinesSurroundingSpaceAndCrlf) {
  auto r = parse_length_lines("  12\r\n\n7\t\n 3 \n", "x.txt");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(*r, (std::vector<std::int64_t>{12, 7, 3}));
}

TEST(LengthLines, RejectsBadLinesNamingFileLineAndRule) {
  EXPECT_EQ(error_of(parse_length_lines("12\n7\n-3\n", "lengths.txt")),
            "lengths.txt:3: expected a positive integer, got '-3'");
  EXPECT_EQ(error_of(parse_length_lines("0\n", "a")), "a:1: expected a positive integer, got '0'");
  EXPECT_EQ(error_of(parse_length_lines("1.5\n", "a")), "a:1: expected a positive integer, got '1.5'");
  EXPECT_EQ(error_of(parse_length_lines("+4\n", "a")), "a:1: expected a positive integer, got '+4'");
  EXPECT_EQ(error_of(parse_length_lines("9223372036854775808\n", "a")),
            "a:1: sample length '9223372036854775808' exceeds the 64-bit range");
  EXPECT_EQ(error_of(parse_length_lines("9223372036854775807\n1\n", "a")),
            "a:2: total token count exceeds the 64-bit range");
  EXPECT_EQ(error_of(parse_length_lines("\n \n", "a")), "a: no sample lengths (the file is empty)");
  EXPECT_EQ(error_of(parse_length_lines("5\n\x01\x7f\n", "a")), "a:2: expected a positive integer, got '\\x01\\x7f'");
}

TEST(Quoted, KeepsMessagesOnOnePrintableLine) {
  EXPECT_EQ(detail::quoted("a\nb'c"), "'a\\x0ab\\x27c'");
  EXPECT_EQ(detail::quoted(std::string(50, 'x')), "'" + std::string(40, 'x') + "...'");
}

RC_GTEST_PROP(LengthLines, RoundTripsWhatTheWriterWrites, ()) {
  const auto lengths = *rc::gen::nonEmpty(
      rc::gen::container<std::vector<std::int64_t>>(rc::gen::inRange<std::int64_t>(1, std::int64_t{1} << 50)));
  auto r = parse_length_lines(format_length_lines(lengths), "x");
  RC_ASSERT(r.ok());
  RC_ASSERT(*r == lengths);
}

RC_GTEST_PROP(PackedJsonl, RoundTripsWhatTheWriterWrites, ()) {
  const auto seqs = *rc::gen::nonEmpty(rc::gen::container<std::vector<PackedSequence>>(
      rc::gen::nonEmpty(rc::gen::container<PackedSequence>(rc::gen::inRange<std::int64_t>(1, 3'000'000)))));
  auto r = parse_packed_jsonl(format_packed_jsonl(seqs), "x");
  RC_ASSERT(r.ok());
  RC_ASSERT(*r == seqs);
}

TEST(PackedJsonl, AcceptsJsonWhitespaceAndBlankLines) {
  auto r = parse_packed_jsonl(" [ 3 , 5 ]\r\n\n[7]", "p.jsonl");
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(*r, (std::vector<PackedSequence>{{3, 5}, {7}}));
}

TEST(PackedJsonl, RejectsBadLinesNamingFileLineAndRule) {
  EXPECT_EQ(error_of(parse_packed_jsonl("[1]\n[2,0]\n", "p")), "p:2: element 2 is 0; sample lengths must be positive integers");
  EXPECT_EQ(error_of(parse_packed_jsonl("[1]\n[]\n", "p")),
            "p:2: empty packed sequence: a packed sequence needs at least one sample");
  EXPECT_EQ(error_of(parse_packed_jsonl("[\"3\"]\n", "p")), "p:1: element 1 is '\"3\"'; sample lengths must be positive integers");
  EXPECT_EQ(error_of(parse_packed_jsonl("[[3]]\n", "p")), "p:1: element 1 is '[3]'; sample lengths must be positive integers");
  EXPECT_EQ(error_of(parse_packed_jsonl("[18446744073709551615]\n", "p")),
            "p:1: element 1 (18446744073709551615) exceeds the 64-bit range");
  EXPECT_EQ(error_of(parse_packed_jsonl("[1] [2]\n", "p")),
            "p:1: expected a JSON array of positive integers: invalid JSON at column 5");
  EXPECT_EQ(error_of(parse_packed_jsonl("[3037000500]\n", "p")),
            "p:1: workload F = sum l^2 of the packed sequence exceeds the 64-bit range");
  EXPECT_EQ(error_of(parse_packed_jsonl("[600,400]\n[1000]\n[700,301]\n", "p", 1000)),
            "p:3: packed sequence has 1001 tokens, more than the packed length 1000");
  EXPECT_EQ(error_of(parse_packed_jsonl("\n", "p")), "p: no packed sequences (the file is empty)");
  EXPECT_EQ(error_of(parse_packed_jsonl("[1e400]\n", "p")),
            "p:1: expected a JSON array of positive integers: a number is out of range");
  // Deep nesting must neither crash nor recurse without bound.
  EXPECT_FALSE(parse_packed_jsonl(std::string(100000, '[') + "\n", "p").ok());
}

RC_GTEST_PROP(MegatronIdx, ReadsWhatAnIndependentByteWriterWrites, ()) {
  const auto lengths = *rc::gen::nonEmpty(
      rc::gen::container<std::vector<std::int32_t>>(rc::gen::inRange<std::int32_t>(1, std::numeric_limits<std::int32_t>::max())));
  // Cut the sequences into documents at random points.
  std::vector<std::int64_t> docs = {0};
  for (std::size_t i = 1; i < lengths.size(); ++i) {
    if (*rc::gen::arbitrary<bool>()) docs.push_back(static_cast<std::int64_t>(i));
  }
  docs.push_back(static_cast<std::int64_t>(lengths.size()));
  const auto dtype = *rc::gen::element(std::make_pair(1U, 1U), std::make_pair(4U, 4U), std::make_pair(5U, 8U), std::make_pair(8U, 2U));
  const TempFile file(write_idx(lengths, docs, dtype.first, dtype.second));
  auto c = load_corpus(file.path());
  RC_ASSERT(c.ok());
  RC_ASSERT(c->kind == CorpusKind::kRaw);
  RC_ASSERT(c->format == CorpusFormat::kMegatronIdx);
  RC_ASSERT(c->raw_lengths == std::vector<std::int64_t>(lengths.begin(), lengths.end()));
}

// A gzip-compressed .idx is read as a stream, kept only up to the size its
// header declares: every truncation and an excess give the message (and
// byte offset) that the whole file gives.
TEST(MegatronIdx, AGzipStreamGivesTheMessagesOfTheWholeFile) {
  auto gz = [](const Bytes& b) { return test_util::gzip_member(b, 6); };
  Bytes good = write_idx({5, 6, 7}, {0, 2, 3});
  for (std::size_t n : {std::size_t{7}, std::size_t{20}, std::size_t{40}, good.size()}) {
    const Bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    const TempFile file(gz(cut));
    auto c = load_corpus(file.path());
    EXPECT_EQ(c.ok() ? "(ok)" : c.error().message(), error_of(parse_megatron_idx(cut, file.path()))) << n;
  }
  Bytes longer = good;
  longer.insert(longer.end(), 5000, 0);
  const TempFile file(gz(longer));
  auto c = load_corpus(file.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message(), error_of(parse_megatron_idx(longer, file.path())));
}

TEST(MegatronIdx, RejectsEveryTruncationAndExtension) {
  const Bytes good = write_idx({5, 6, 7}, {0, 2, 3});
  ASSERT_TRUE(parse_megatron_idx(good, "d.idx").ok());
  for (std::size_t n = 0; n < good.size(); ++n) {
    auto r = parse_megatron_idx(std::span<const unsigned char>(good.data(), n), "d.idx");
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.error().message().rfind("d.idx: byte ", 0), 0U) << r.error().message();
  }
  Bytes longer = good;
  longer.push_back(0);
  EXPECT_EQ(error_of(parse_megatron_idx(longer, "d.idx")),
            "d.idx: byte 94: 1 unexpected bytes after the document index (sequence count 3, document count 3)");
}

TEST(MegatronIdx, RejectsCorruptFieldsNamingTheByte) {
  const Bytes good = write_idx({5, 6, 7}, {0, 2, 3});
  auto corrupt = [&](std::size_t offset, unsigned char value) {
    Bytes b = good;
    b[offset] = value;
    return error_of(parse_megatron_idx(b, "d.idx"));
  };
  EXPECT_EQ(corrupt(8, 1), "d.idx: byte 0: not a Megatron .idx file: expected the magic \"MMIDIDX\\0\\0\"");
  EXPECT_EQ(corrupt(9, 2), "d.idx: byte 9: version 2 is not supported (expected 1)");
  EXPECT_EQ(corrupt(17, 0), "d.idx: byte 17: dtype code 0 is not a Megatron dtype (1..8)");
  EXPECT_EQ(corrupt(18, 200),
            "d.idx: byte 18: sequence count 200 and document count 3 need 2424 bytes of arrays but the file has 60 left");
  EXPECT_EQ(corrupt(25, 0xff).rfind("d.idx: byte 18: sequence count 18374686479671623683 and document count 3 need more than 2^64", 0), 0U);
  EXPECT_EQ(corrupt(38, 0), "d.idx: byte 38: sequence 1 has length 0; lengths must be positive");
  EXPECT_EQ(corrupt(41, 0x80), "d.idx: byte 38: sequence 1 has length -2147483642; lengths must be positive");
  EXPECT_EQ(corrupt(54, 9), "d.idx: byte 54: pointer of sequence 1 is 9, expected 10 (dtype size 2 times the tokens before it)");
  EXPECT_EQ(corrupt(70, 1),
            "d.idx: byte 70: document index entry 0 is 1; entries must start at 0 and rise to the sequence count 3");
  EXPECT_EQ(corrupt(86, 2), "d.idx: byte 86: last document index entry is 2, expected the sequence count 3");
}

TEST(ParseCorpus, DetectsTheFormatFromContent) {
  auto text = parse_corpus(as_bytes("\n 5\n6\n"), "t");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->format, CorpusFormat::kText);
  EXPECT_EQ(text->raw_lengths, (std::vector<std::int64_t>{5, 6}));
  auto jsonl = parse_corpus(as_bytes("\n  [5,6]\n"), "j");
  ASSERT_TRUE(jsonl.ok());
  EXPECT_EQ(jsonl->format, CorpusFormat::kJsonLines);
  EXPECT_EQ(jsonl->kind, CorpusKind::kPacked);
  const Bytes idx = write_idx({5, 6}, {0, 2});
  auto mm = parse_corpus(idx, "i");
  ASSERT_TRUE(mm.ok());
  EXPECT_EQ(mm->format, CorpusFormat::kMegatronIdx);
  EXPECT_EQ(mm->raw_lengths, (std::vector<std::int64_t>{5, 6}));
  auto empty = parse_corpus({}, "e");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().message(), "e: the file is empty: no sample lengths");
}

TEST(LoadCorpus, ReportsMissingFilesAndDirectories) {
  auto missing = load_corpus("/nonexistent/libra/lengths.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kIo);
  EXPECT_EQ(missing.error().message(), "/nonexistent/libra/lengths.txt: cannot open: No such file or directory");
  auto dir = load_corpus("/tmp");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().message(), "/tmp: not a regular file");
  const TempFile empty("");
  EXPECT_FALSE(load_corpus(empty.path()).ok());
}

TEST(LoadPackedSequences, PacksRawFilesAtTheGivenLength) {
  const TempFile raw("300\n1000\n100\n700\n200\n900\n500\n400\n800\n600\n");
  auto seqs = load_packed_sequences(raw.path(), 1000);
  ASSERT_TRUE(seqs.ok()) << seqs.error().message();
  EXPECT_EQ(*seqs, (std::vector<PackedSequence>{{300}, {1000}, {100, 700, 200}, {900}, {500, 400}, {800}, {600}}));
  auto no_length = load_packed_sequences(raw.path(), std::nullopt);
  ASSERT_FALSE(no_length.ok());
  EXPECT_NE(no_length.error().message().find("no default packed length"), std::string::npos);
  EXPECT_FALSE(load_packed_sequences(raw.path(), 0).ok());
  EXPECT_FALSE(load_packed_sequences(raw.path(), kMaxSeqLen + 1).ok());
}

TEST(LoadPackedSequences, ChecksPackedFilesAgainstSeqLenNamingTheLine) {
  const TempFile packed("[600,400]\n\n[1000]\n[700,301]\n");
  auto as_given = load_packed_sequences(packed.path(), std::nullopt);
  ASSERT_TRUE(as_given.ok());
  EXPECT_EQ(as_given->size(), 3U);
  auto too_long = load_packed_sequences(packed.path(), 1000);
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().message(),
            packed.path() + ":4: packed sequence has 1001 tokens, more than the packed length 1000");
}

TEST(LoadPackedSequences, PacksBuiltinsAtTheirDefaultLength) {
  auto seqs = load_packed_sequences("builtin:paper-256k", std::nullopt);
  ASSERT_TRUE(seqs.ok());
  for (const auto& s : *seqs) {
    std::int64_t t = 0;
    for (auto l : s) t += l;
    ASSERT_LE(t, 262'144);
  }
}

}  // namespace
}  // namespace libra
