// Corpus readers (plain text, JSON Lines, Megatron .idx), format detection,
// writers and the file/builtin front door load_corpus.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "core/decimal.hpp"
#include "corpus/stream.hpp"
#include "corpus/text_util.hpp"
#include "libra/checked.hpp"
#include "libra/corpus.hpp"
#include "libra/packing.hpp"
#include "libra/workload.hpp"

namespace libra {

namespace {

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

std::string where(std::string_view name, std::int64_t line_no) {
  return std::string(name) + ":" + std::to_string(line_no) + ": ";
}

// Hands every line of `s` to parser.add(line number, line); stops at the
// first error.
template <class P>
Status feed_lines(detail::CorpusStream& s, P& parser) {
  for (;;) {
    LIBRA_ASSIGN_OR_RETURN(std::optional<std::string_view> line, s.next_line());
    if (!line) return {};
    LIBRA_TRY(parser.add(s.line_number(), *line));
  }
}

// Plain text, one line at a time (parse_length_lines and the stream reader).
class LengthLines {
 public:
  explicit LengthLines(std::string_view name) : name_(name) {}

  Status add(std::int64_t line_no, std::string_view raw) {
    const std::string_view line = trim(raw);
    if (line.empty()) return {};
    const auto parsed = detail::parse_decimal<std::int64_t>(line);
    if (parsed.error == detail::DecimalError::kSyntax) {
      return invalid_input(where(name_, line_no) + "expected a positive integer, got " + detail::quoted(line));
    }
    if (parsed.error == detail::DecimalError::kRange) {
      return invalid_input(where(name_, line_no) + "sample length " + detail::quoted(line) +
                           " exceeds the 64-bit range");
    }
    const std::int64_t value = parsed.value;
    if (value <= 0) {
      return invalid_input(where(name_, line_no) + "expected a positive integer, got " + detail::quoted(line));
    }
    auto sum = checked_add(total_, value);
    if (!sum) return invalid_input(where(name_, line_no) + "total token count exceeds the 64-bit range");
    total_ = *sum;
    lengths_.push_back(value);
    return {};
  }

  Result<std::vector<std::int64_t>> finish() && {
    if (lengths_.empty()) return invalid_input(std::string(name_) + ": no sample lengths (the file is empty)");
    return std::move(lengths_);
  }

 private:
  std::string_view name_;
  std::vector<std::int64_t> lengths_;
  std::int64_t total_ = 0;
};

// JSON Lines of packed sequences, one line at a time.
class PackedLines {
 public:
  PackedLines(std::string_view name, std::optional<std::int64_t> seq_len) : name_(name), seq_len_(seq_len) {}

  Status add(std::int64_t line_no, std::string_view raw) {
    using nlohmann::json;
    const std::string_view line = trim(raw);
    if (line.empty()) return {};
    json value;
    try {
      value = json::parse(line.begin(), line.end());
    } catch (const json::parse_error& e) {
      // e.byte is 1-based within the trimmed line; report the column in the raw line.
      const std::size_t lead = static_cast<std::size_t>(line.data() - raw.data());
      return invalid_input(where(name_, line_no) +
                           "expected a JSON array of positive integers: invalid JSON at column " +
                           std::to_string(e.byte + lead));
    } catch (const json::exception&) {
      // The parser throws out_of_range for numbers like 1e400.
      return invalid_input(where(name_, line_no) +
                           "expected a JSON array of positive integers: a number is out of range");
    }
    if (!value.is_array()) {
      return invalid_input(where(name_, line_no) + "expected a JSON array of positive integers, got " +
                           detail::quoted(line) +
                           (value.is_object() ? " (a JSON object; each line must be an array such as [512,300])" : ""));
    }
    if (value.empty()) {
      return invalid_input(where(name_, line_no) +
                           "empty packed sequence: a packed sequence needs at least one sample");
    }
    PackedSequence seq;
    seq.reserve(value.size());
    std::int64_t tokens = 0;
    std::int64_t f = 0;
    for (std::size_t k = 0; k < value.size(); ++k) {
      const json& e = value[k];
      const std::string at = where(name_, line_no) + "element " + std::to_string(k + 1) + " ";
      std::int64_t l = 0;
      if (e.is_number_unsigned()) {
        const auto u = e.get<std::uint64_t>();
        if (u > static_cast<std::uint64_t>(kInt64Max)) {
          return invalid_input(at + "(" + std::to_string(u) + ") exceeds the 64-bit range");
        }
        l = static_cast<std::int64_t>(u);
      } else if (e.is_number_integer()) {
        l = e.get<std::int64_t>();
      } else {
        return invalid_input(at + "is " + detail::quoted(e.dump()) + "; sample lengths must be positive integers");
      }
      if (l <= 0) {
        return invalid_input(at + "is " + std::to_string(l) + "; sample lengths must be positive integers");
      }
      auto t = checked_add(tokens, l);
      if (!t) {
        return invalid_input(where(name_, line_no) + "token count of the packed sequence exceeds the 64-bit range");
      }
      tokens = *t;
      auto sq = checked_mul(l, l);
      auto ff = sq ? checked_add(f, *sq) : std::nullopt;
      if (!ff) {
        return invalid_input(where(name_, line_no) +
                             "workload F = sum l^2 of the packed sequence exceeds the 64-bit range");
      }
      f = *ff;
      seq.push_back(l);
    }
    if (seq_len_ && tokens > *seq_len_) {
      return invalid_input(where(name_, line_no) + "packed sequence has " + std::to_string(tokens) +
                           " tokens, more than the packed length " + std::to_string(*seq_len_));
    }
    auto sum = checked_add(total_, tokens);
    if (!sum) return invalid_input(where(name_, line_no) + "total token count exceeds the 64-bit range");
    total_ = *sum;
    sequences_.push_back(std::move(seq));
    return {};
  }

  Result<std::vector<PackedSequence>> finish() && {
    if (sequences_.empty()) return invalid_input(std::string(name_) + ": no packed sequences (the file is empty)");
    return std::move(sequences_);
  }

 private:
  std::string_view name_;
  std::optional<std::int64_t> seq_len_;
  std::vector<PackedSequence> sequences_;
  std::int64_t total_ = 0;
};

detail::CorpusStream text_stream(std::string_view text, std::string_view name) {
  return detail::CorpusStream::from_memory(
      std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(text.data()), text.size()),
      std::string(name), false);
}

std::uint64_t read_u64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::int64_t read_i64(const unsigned char* p) {
  const std::uint64_t u = read_u64(p);
  std::int64_t v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
std::int32_t read_i32(const unsigned char* p) {
  const std::uint32_t u = static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
                          (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
  std::int32_t v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// Megatron-LM DType codes -> element size in bytes (megatron/core/datasets/indexed_dataset.py).
std::int64_t megatron_dtype_size(unsigned code) {
  switch (code) {
    case 1: return 1;  // uint8
    case 2: return 1;  // int8
    case 3: return 2;  // int16
    case 4: return 4;  // int32
    case 5: return 8;  // int64
    case 6: return 8;  // float64
    case 7: return 4;  // float32
    case 8: return 2;  // uint16
    default: return 0;
  }
}

}  // namespace

Result<std::vector<std::int64_t>> parse_length_lines(std::string_view text, std::string_view name) {
  detail::CorpusStream s = text_stream(text, name);
  LengthLines parser(name);
  LIBRA_TRY(feed_lines(s, parser));
  return std::move(parser).finish();
}

Result<std::vector<PackedSequence>> parse_packed_jsonl(std::string_view text, std::string_view name,
                                                       std::optional<std::int64_t> seq_len) {
  detail::CorpusStream s = text_stream(text, name);
  PackedLines parser(name, seq_len);
  LIBRA_TRY(feed_lines(s, parser));
  return std::move(parser).finish();
}

namespace {

constexpr std::size_t kIdxHeader = 34;

// The bytes an .idx header declares in all (header and arrays), or nullopt
// when that passes 2^64. `header` holds at least kIdxHeader bytes.
std::optional<std::uint64_t> idx_declared_size(const unsigned char* header);

// An .idx whose first bytes are `bytes` and whose whole length is `size`
// (>= bytes.size(): a stream keeps only what its header declares; any
// excess is counted, so the message still gives it).
Result<std::vector<std::int64_t>> parse_megatron_idx_sized(std::span<const unsigned char> bytes, std::uint64_t size,
                                                           std::string_view name);

}  // namespace

Result<std::vector<std::int64_t>> parse_megatron_idx(std::span<const unsigned char> bytes, std::string_view name) {
  return parse_megatron_idx_sized(bytes, bytes.size(), name);
}

namespace {

std::optional<std::uint64_t> idx_declared_size(const unsigned char* header) {
  std::uint64_t seq_bytes = 0, doc_bytes = 0, need = 0, all = 0;
  if (__builtin_mul_overflow(read_u64(header + 18), std::uint64_t{12}, &seq_bytes) ||
      __builtin_mul_overflow(read_u64(header + 26), std::uint64_t{8}, &doc_bytes) ||
      __builtin_add_overflow(seq_bytes, doc_bytes, &need) || __builtin_add_overflow(need, kIdxHeader, &all)) {
    return std::nullopt;
  }
  return all;
}

// What the .idx header declares: the dtype's item size and the counts.
struct IdxHeader {
  std::int64_t item = 0;
  std::uint64_t seqs = 0, docs = 0;
};

// "FILE: byte N: ", the lead of every .idx error.
struct IdxPlace {
  const std::string& file;
  std::string operator()(std::uint64_t offset) const { return file + ": byte " + std::to_string(offset) + ": "; }
};

constexpr std::size_t kIdxVersion = 9, kIdxDtype = 17, kIdxSeqCount = 18, kIdxDocCount = 26;

// The magic, the header, the version and dtype, and array sizes that fill
// the rest of the file exactly.
Result<IdxHeader> read_idx_header(const unsigned char* p, std::uint64_t size, const IdxPlace& at) {
  if (size < kMegatronIdxMagic.size() || std::memcmp(p, kMegatronIdxMagic.data(), kMegatronIdxMagic.size()) != 0) {
    return invalid_input(at(0) + "not a Megatron .idx file: expected the magic \"MMIDIDX\\0\\0\"");
  }
  if (size < kIdxHeader) {
    return invalid_input(at(size) + "file ends inside the " + std::to_string(kIdxHeader) + "-byte .idx header");
  }
  const std::uint64_t version = read_u64(p + kIdxVersion);
  if (version != 1) {
    return invalid_input(at(kIdxVersion) + "version " + std::to_string(version) + " is not supported (expected 1)");
  }
  const unsigned dtype = p[kIdxDtype];
  IdxHeader h{megatron_dtype_size(dtype), read_u64(p + kIdxSeqCount), read_u64(p + kIdxDocCount)};
  if (h.item == 0) {
    return invalid_input(at(kIdxDtype) + "dtype code " + std::to_string(dtype) + " is not a Megatron dtype (1..8)");
  }
  const std::uint64_t left = size - kIdxHeader;
  // 4 bytes of length and 8 of pointer per sequence, 8 per document-index entry.
  std::uint64_t seq_bytes = 0, doc_bytes = 0, need = 0;
  const bool overflow = __builtin_mul_overflow(h.seqs, std::uint64_t{12}, &seq_bytes) ||
                        __builtin_mul_overflow(h.docs, std::uint64_t{8}, &doc_bytes) ||
                        __builtin_add_overflow(seq_bytes, doc_bytes, &need);
  if (overflow || need > left) {
    return invalid_input(at(kIdxSeqCount) + "sequence count " + std::to_string(h.seqs) + " and document count " +
                         std::to_string(h.docs) + " need " + (overflow ? std::string("more than 2^64") : std::to_string(need)) +
                         " bytes of arrays but the file has " + std::to_string(left) + " left");
  }
  if (need < left) {
    return invalid_input(at(kIdxHeader + need) + std::to_string(left - need) +
                         " unexpected bytes after the document index (sequence count " + std::to_string(h.seqs) +
                         ", document count " + std::to_string(h.docs) + ")");
  }
  if (h.seqs == 0) return invalid_input(at(kIdxSeqCount) + "sequence count is 0: no sample lengths");
  if (h.docs == 0) return invalid_input(at(kIdxDocCount) + "document count is 0: the document index needs at least the leading 0");
  return h;
}

// The n sequence lengths, each positive.
Result<std::vector<std::int64_t>> read_idx_lengths(const unsigned char* p, std::size_t n, const IdxPlace& at) {
  const std::size_t len_off = kIdxHeader;
  std::vector<std::int64_t> lengths(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t l = read_i32(p + len_off + 4 * i);
    if (l <= 0) {
      return invalid_input(at(len_off + 4 * i) + "sequence " + std::to_string(i) + " has length " + std::to_string(l) +
                           "; lengths must be positive");
    }
    lengths[i] = l;
  }
  return lengths;
}

// Megatron writes pointer[i] = item size * (sum of the lengths before i).
Status check_idx_pointers(const unsigned char* p, std::span<const std::int64_t> lengths, std::int64_t item,
                          const IdxPlace& at) {
  const std::size_t ptr_off = kIdxHeader + 4 * lengths.size();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const std::int64_t ptr = read_i64(p + ptr_off + 8 * i);
    std::optional<std::int64_t> expected = checked_mul(total, item);
    if (!expected || ptr != *expected) {
      return invalid_input(at(ptr_off + 8 * i) + "pointer of sequence " + std::to_string(i) + " is " +
                           std::to_string(ptr) + ", expected " + (expected ? std::to_string(*expected) : "overflow") +
                           " (dtype size " + std::to_string(item) + " times the tokens before it)");
    }
    total += lengths[i];  // n < 2^61 and each length < 2^31: cannot overflow
  }
  return Status();
}

// The document index rises from 0 to the sequence count n.
Status check_idx_documents(const unsigned char* p, std::size_t n, std::size_t d, const IdxPlace& at) {
  const std::size_t doc_off = kIdxHeader + 12 * n;
  std::int64_t prev = 0;
  for (std::size_t k = 0; k < d; ++k) {
    const std::int64_t v = read_i64(p + doc_off + 8 * k);
    const bool ok = (k == 0) ? v == 0 : (v >= prev && v <= static_cast<std::int64_t>(n));
    if (!ok) {
      return invalid_input(at(doc_off + 8 * k) + "document index entry " + std::to_string(k) + " is " +
                           std::to_string(v) + "; entries must start at 0 and rise to the sequence count " +
                           std::to_string(n));
    }
    prev = v;
  }
  if (prev != static_cast<std::int64_t>(n)) {
    return invalid_input(at(doc_off + 8 * (d - 1)) + "last document index entry is " + std::to_string(prev) +
                         ", expected the sequence count " + std::to_string(n));
  }
  return Status();
}

Result<std::vector<std::int64_t>> parse_megatron_idx_sized(std::span<const unsigned char> bytes, std::uint64_t size,
                                                           std::string_view name) {
  const std::string file(name);
  const IdxPlace at{file};
  const unsigned char* p = bytes.data();
  LIBRA_ASSIGN_OR_RETURN(const IdxHeader h, read_idx_header(p, size, at));
  const auto n = static_cast<std::size_t>(h.seqs);
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> lengths, read_idx_lengths(p, n, at));
  LIBRA_TRY(check_idx_pointers(p, lengths, h.item, at));
  LIBRA_TRY(check_idx_documents(p, n, static_cast<std::size_t>(h.docs), at));
  return lengths;
}

bool has_idx_magic(std::string_view head) {
  return head.size() >= 7 && std::memcmp(head.data(), kMegatronIdxMagic.data(), 7) == 0;
}

Corpus idx_corpus(std::vector<std::int64_t> lengths, const std::string& name) {
  Corpus c;
  c.source = name;
  c.raw_lengths = std::move(lengths);
  c.kind = CorpusKind::kRaw;
  c.format = CorpusFormat::kMegatronIdx;
  return c;
}

// A read-only mapping of a whole regular file (how an .idx on disk is read).
class Mapping {
 public:
  Mapping(int fd, std::size_t size) : size_(size) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  bool ok() const { return data_ != nullptr; }
  std::span<const unsigned char> bytes() const { return {static_cast<const unsigned char*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

// A corpus from a stream: an .idx is read whole (memory-mapped when
// `map_fd` is a regular file of `map_size` bytes read as it is; from a pipe
// or gzip, up to the size its header declares), text and JSON Lines one
// line at a time, so they never hold more than one line of the source.
Result<Corpus> parse_corpus_stream(detail::CorpusStream& s, const std::string& name, std::optional<std::int64_t> seq_len,
                                   int map_fd, std::size_t map_size) {
  LIBRA_ASSIGN_OR_RETURN(std::string_view head, s.peek(kIdxHeader));
  // "MMIDIDX" with a damaged tail is still meant as an .idx: let its reader
  // name the bad magic rather than the text reader complain about line 1.
  if (has_idx_magic(head)) {
    if (map_fd >= 0 && !s.gzip()) {
      const Mapping m(map_fd, map_size);
      if (m.ok()) {
        LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> lengths, parse_megatron_idx(m.bytes(), name));
        return idx_corpus(std::move(lengths), name);
      }
    }
    std::uint64_t keep = kIdxHeader;
    if (head.size() >= kIdxHeader) {
      keep = std::max<std::uint64_t>(keep, idx_declared_size(reinterpret_cast<const unsigned char*>(head.data()))
                                               .value_or(kIdxHeader));
    }
    std::string whole;
    LIBRA_ASSIGN_OR_RETURN(std::uint64_t size, s.take_rest(whole, keep));
    LIBRA_ASSIGN_OR_RETURN(
        std::vector<std::int64_t> lengths,
        parse_megatron_idx_sized(std::span<const unsigned char>(reinterpret_cast<const unsigned char*>(whole.data()),
                                                                whole.size()),
                                 size, name));
    return idx_corpus(std::move(lengths), name);
  }
  Corpus c;
  c.source = name;
  // The first non-blank character decides; a leading '{' is JSON too: its
  // reader explains that lines are arrays.
  for (;;) {
    LIBRA_ASSIGN_OR_RETURN(std::optional<std::string_view> line, s.next_line());
    if (!line) return invalid_input(name + ": the file is empty: no sample lengths");
    const std::string_view content = trim(*line);
    if (content.empty()) continue;
    if (content.front() == '[' || content.front() == '{') {
      PackedLines parser(name, seq_len);
      LIBRA_TRY(parser.add(s.line_number(), *line));
      LIBRA_TRY(feed_lines(s, parser));
      LIBRA_ASSIGN_OR_RETURN(c.packed, std::move(parser).finish());
      c.kind = CorpusKind::kPacked;
      c.format = CorpusFormat::kJsonLines;
      return c;
    }
    LengthLines parser(name);
    LIBRA_TRY(parser.add(s.line_number(), *line));
    LIBRA_TRY(feed_lines(s, parser));
    LIBRA_ASSIGN_OR_RETURN(c.raw_lengths, std::move(parser).finish());
    c.kind = CorpusKind::kRaw;
    c.format = CorpusFormat::kText;
    return c;
  }
}

}  // namespace

Result<Corpus> parse_corpus(std::span<const unsigned char> bytes, const std::string& name) {
  const std::string_view head(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (has_idx_magic(head)) {
    LIBRA_ASSIGN_OR_RETURN(std::vector<std::int64_t> lengths, parse_megatron_idx(bytes, name));
    return idx_corpus(std::move(lengths), name);
  }
  detail::CorpusStream s = detail::CorpusStream::from_memory(bytes, name, false);
  return parse_corpus_stream(s, name, std::nullopt, -1, 0);
}

std::string format_length_lines(std::span<const std::int64_t> lengths) {
  std::string out;
  out.reserve(lengths.size() * 6);
  for (std::int64_t l : lengths) {
    out += std::to_string(l);
    out += '\n';
  }
  return out;
}

std::string format_packed_jsonl(std::span<const PackedSequence> sequences) {
  std::string out;
  for (const PackedSequence& seq : sequences) {
    out += '[';
    for (std::size_t k = 0; k < seq.size(); ++k) {
      if (k > 0) out += ',';
      out += std::to_string(seq[k]);
    }
    out += "]\n";
  }
  return out;
}

namespace {

constexpr std::string_view kBuiltinPrefix = "builtin:";

Result<Corpus> load_builtin(const std::string& source) {
  std::string_view rest = std::string_view(source).substr(kBuiltinPrefix.size());
  std::optional<std::uint64_t> seed;
  const std::size_t colon = rest.find(':');
  std::string_view name = rest.substr(0, colon);
  if (colon != std::string_view::npos) {
    const auto v = detail::parse_decimal<std::uint64_t>(rest.substr(colon + 1));
    if (!v.ok()) {
      return invalid_input(detail::quoted(source) + ": the seed after the second ':' must be a decimal integer in [0, 2^64)");
    }
    seed = v.value;
  }
  LIBRA_ASSIGN_OR_RETURN(Corpus c, builtin_corpus(name, seed));
  c.source = source;
  return c;
}

Result<Corpus> load_corpus_checked(const std::string& source, std::optional<std::int64_t> seq_len) {
  if (source.starts_with(kBuiltinPrefix)) return load_builtin(source);
  if (source.empty()) return invalid_input("corpus source: empty path");
  // A Megatron dataset is named by its prefix (data/my_text_document for
  // data/my_text_document.idx + .bin), as Megatron's own --data-path does.
  struct stat st {};
  const bool prefix = source != "-" && ::stat(source.c_str(), &st) != 0 && errno == ENOENT &&
                      ::stat((source + ".idx").c_str(), &st) == 0;
  const std::string path = prefix ? source + ".idx" : source;
  if (path == "-") {
    detail::CorpusStream s = detail::CorpusStream::from_fd(STDIN_FILENO, "standard input");
    return parse_corpus_stream(s, path, seq_len, -1, 0);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io_error(path + ": cannot open: " + std::strerror(errno));
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) return io_error(path + ": cannot stat: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode) || !(S_ISREG(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
    return io_error(path + ": not a regular file");
  }
  // Files that report size 0 (/proc) are streams like a pipe.
  const bool mappable = S_ISREG(st.st_mode) && st.st_size > 0;
  detail::CorpusStream s = detail::CorpusStream::from_fd(fd, path);
  return parse_corpus_stream(s, path, seq_len, mappable ? fd : -1,
                             mappable ? static_cast<std::size_t>(st.st_size) : 0);
}

}  // namespace

Result<Corpus> load_corpus(const std::string& source) { return load_corpus_checked(source, std::nullopt); }

Result<std::vector<PackedSequence>> load_packed_sequences(const std::string& source,
                                                          std::optional<std::int64_t> seq_len) {
  if (seq_len && (*seq_len < 1 || *seq_len > kMaxSeqLen)) {
    return invalid_input(source + ": packed length " + std::to_string(*seq_len) + " must be in [1, " +
                         std::to_string(kMaxSeqLen) + "]");
  }
  LIBRA_ASSIGN_OR_RETURN(Corpus c, load_corpus_checked(source, seq_len));
  if (c.kind == CorpusKind::kPacked) {
    if (seq_len) {
      // Builtins are raw, files were checked line by line; this guards hand-built corpora.
      for (std::size_t i = 0; i < c.packed.size(); ++i) {
        std::int64_t tokens = 0;
        for (std::int64_t l : c.packed[i]) tokens += l;
        if (tokens > *seq_len) {
          return invalid_input(source + ": packed sequence " + std::to_string(i) + " has " + std::to_string(tokens) +
                               " tokens, more than the packed length " + std::to_string(*seq_len));
        }
      }
    }
    return std::move(c.packed);
  }
  const std::int64_t length = seq_len ? *seq_len : c.default_seq_len;
  if (length <= 0) {
    return invalid_input(source + ": raw sample lengths have no default packed length; give one (--seq-len)");
  }
  PackOptions opts;
  opts.seq_len = length;
  LIBRA_ASSIGN_OR_RETURN(PackResult r, pack(c.raw_lengths, opts));
  return std::move(r.sequences);
}

}  // namespace libra
