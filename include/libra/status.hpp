// libra/status.hpp: error values for every fallible libra call.
//
// Defines `libra::Error` (a code plus a one-line message that names the
// input, the place and the rule broken), `libra::Status` (success or an
// Error) and `libra::Result<T>` (a T or an Error). libra never throws for bad
// input: every reader, planner and executor returns one of these, and the CLI
// turns an Error into one line on stderr and exit status 2.
//
//   libra::Result<std::int64_t> f = libra::workload_proxy(lengths);
//   if (!f.ok()) { std::cerr << f.error().message() << '\n'; return 2; }
//   std::int64_t value = *f;
//
// Inside libra, LIBRA_TRY and LIBRA_ASSIGN_OR_RETURN propagate errors.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace libra {

enum class ErrorCode {
  kInvalidInput,  // the caller's data or configuration breaks a rule
  kIo,            // a file could not be opened, read, mapped or written
  kMismatch,      // ranks or files disagree (plan fingerprint, version)
  kInternal,      // a libra invariant failed: a bug, please report
};

// `text` as printable ASCII: every byte below 0x20 or from 0x7f up becomes
// \xNN. Every Error message goes through it, so no file name, JSON parser
// excerpt or corrupt byte can split the one line or reach a terminal raw.
inline std::string printable_ascii(std::string text) {
  std::size_t bad = 0;
  for (char ch : text) bad += static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) >= 0x7f;
  if (bad == 0) return text;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size() + 3 * bad);
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

class [[nodiscard]] Error {
 public:
  Error(ErrorCode code, std::string message) : code_(code), message_(printable_ascii(std::move(message))) {}
  ErrorCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

inline Error invalid_input(std::string message) { return {ErrorCode::kInvalidInput, std::move(message)}; }
inline Error io_error(std::string message) { return {ErrorCode::kIo, std::move(message)}; }
inline Error mismatch_error(std::string message) { return {ErrorCode::kMismatch, std::move(message)}; }
inline Error internal_error(std::string message) { return {ErrorCode::kInternal, std::move(message)}; }

class [[nodiscard]] Status {
 public:
  Status() = default;  // success
  Status(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design
  bool ok() const noexcept { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return error_;
  }
  const std::string& message() const { return error_.message(); }

 private:
  Error error_{ErrorCode::kInternal, ""};
  bool ok_ = true;
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}    // NOLINT: implicit by design
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace libra

#define LIBRA_CONCAT_INNER_(a, b) a##b
#define LIBRA_CONCAT_(a, b) LIBRA_CONCAT_INNER_(a, b)

// Returns the error of a Status or Result expression from the enclosing
// function, which must return Status or Result<U>.
#define LIBRA_TRY(expr)                                   \
  do {                                                    \
    auto libra_try_status_ = (expr);                      \
    if (!libra_try_status_.ok()) return libra_try_status_.error(); \
  } while (0)

// LIBRA_ASSIGN_OR_RETURN(auto x, f()); binds the value or returns the error.
#define LIBRA_ASSIGN_OR_RETURN(lhs, expr) \
  LIBRA_ASSIGN_OR_RETURN_IMPL_(LIBRA_CONCAT_(libra_result_, __LINE__), lhs, expr)
#define LIBRA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.error();                 \
  lhs = std::move(tmp).value()
