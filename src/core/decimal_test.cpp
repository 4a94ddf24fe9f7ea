#include "core/decimal.hpp"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <string>

namespace libra::detail {
namespace {

TEST(ParseDecimal, LeadingZerosAreDecimalNotOctal) {
  EXPECT_EQ(parse_decimal<std::int64_t>("064").value, 64);
  EXPECT_EQ(parse_decimal<int>("010").value, 10);
  EXPECT_EQ(parse_decimal<int>("032").value, 32);
  EXPECT_EQ(parse_decimal<int>("0").value, 0);
  EXPECT_EQ(parse_decimal<int>("-010").value, -10);
}

TEST(ParseDecimal, RejectsEverythingButDigits) {
  for (const char* s : {"", "-", "+1024", "0x400", "0X10", " 1", "1 ", "1e3", "1.0", "--1", "0b1", "1_000", "١"}) {
    EXPECT_EQ(parse_decimal<std::int64_t>(s).error, DecimalError::kSyntax) << s;
  }
  EXPECT_EQ(parse_decimal<std::uint64_t>("-1").error, DecimalError::kSyntax);
}

TEST(ParseDecimal, RangeOfTheTargetType) {
  EXPECT_EQ(parse_decimal<std::int64_t>("9223372036854775807").value, INT64_MAX);
  EXPECT_EQ(parse_decimal<std::int64_t>("-9223372036854775808").value, INT64_MIN);
  EXPECT_EQ(parse_decimal<std::int64_t>("9223372036854775808").error, DecimalError::kRange);
  EXPECT_EQ(parse_decimal<std::int64_t>("-9223372036854775809").error, DecimalError::kRange);
  EXPECT_EQ(parse_decimal<std::uint64_t>("18446744073709551615").value, UINT64_MAX);
  EXPECT_EQ(parse_decimal<std::uint64_t>("18446744073709551616").error, DecimalError::kRange);
  EXPECT_EQ(parse_decimal<int>("2147483648").error, DecimalError::kRange);
  EXPECT_EQ(parse_decimal<std::int64_t>("00000000000000000000000000001").value, 1);
}

// std::to_string is the independent reference: every value round-trips,
// also behind extra leading zeros.
RC_GTEST_PROP(ParseDecimal, RoundTripsToString, (std::int64_t v, std::uint8_t zeros)) {
  std::string s = std::to_string(v);
  const std::string pad(zeros % 5, '0');
  s.insert(v < 0 ? 1 : 0, pad);
  const auto r = parse_decimal<std::int64_t>(s);
  RC_ASSERT(r.ok());
  RC_ASSERT(r.value == v);
}

}  // namespace
}  // namespace libra::detail
