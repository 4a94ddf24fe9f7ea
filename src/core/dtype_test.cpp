#include "libra/dtype.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <cmath>
#include <cstring>
#include <limits>

namespace libra {
namespace {

float bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent reference: the nearest binary16 value by exhaustive search
// over all finite halves (decoded with ldexp, not with the code under test),
// ties to the even mantissa.
std::uint16_t nearest_half(float x) {
  auto decode = [](int h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 0) return s * std::ldexp(m, -24);
    return s * std::ldexp(1024 + m, e - 25);
  };
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    const double err = std::abs(decode(h) - static_cast<double>(x));
    if (err < best_err || (err == best_err && (h & 1) == 0 && (std::signbit(x) == ((h & 0x8000) != 0)))) {
      best = h;
      best_err = err;
    }
  }
  // Past the largest finite value by at least half an ulp (65520): infinity.
  if (std::abs(x) >= 65520.0f) return static_cast<std::uint16_t>((std::signbit(x) ? 0x8000 : 0) | 0x7c00);
  return static_cast<std::uint16_t>(best);
}

TEST(DType, NamesSizesAndParsing) {
  EXPECT_EQ(dtype_bytes(DType::kF32), 4);
  EXPECT_EQ(dtype_bytes(DType::kBF16), 2);
  EXPECT_EQ(dtype_bytes(DType::kF16), 2);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto p = parse_dtype(dtype_name(t));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, t);
    DType back;
    ASSERT_TRUE(dtype_from_code(dtype_code(t), back));
    EXPECT_EQ(back, t);
  }
  EXPECT_FALSE(parse_dtype("int8").ok());
  EXPECT_NE(parse_dtype("int8").error().message().find("'int8'"), std::string::npos);
  // Format-1 element sizes: 4 and 2 keep the meaning the executors gave them.
  EXPECT_EQ(*dtype_from_elem_bytes(4, "p"), DType::kF32);
  EXPECT_EQ(*dtype_from_elem_bytes(2, "p"), DType::kBF16);
  auto bad = dtype_from_elem_bytes(3, "plan.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("plan.json: elem_bytes 3"), std::string::npos);
  // fp32 and bf16 keep the fingerprint word of format-1 plans.
  EXPECT_EQ(dtype_code(DType::kF32), 4u);
  EXPECT_EQ(dtype_code(DType::kBF16), 2u);
}

TEST(DType, HalfConversionMatchesTheNearestValueByExhaustiveSearch) {
  const float samples[] = {0.0f,        -0.0f,       0.1f,          -0.1f,        1.0f,         1.0f / 3.0f,
                           65504.0f,    65519.0f,    65520.0f,      -70000.0f,    6.1035156e-5f, 6.0e-5f,
                           5.96e-8f,    2.98e-8f,    2.9802322e-8f, 3.0e-8f,      1e-9f,        1234.5678f,
                           bits(0x38800000u), bits(0x387fffffu), bits(0x33000001u), 0.00048828125f};
  for (float x : samples) EXPECT_EQ(f16_from_f32(x), nearest_half(x)) << x;
  // Every half round-trips exactly.
  for (int h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;
    EXPECT_EQ(f16_from_f32(f32_from_f16(static_cast<std::uint16_t>(h))), h) << h;
  }
  EXPECT_TRUE(std::isnan(f32_from_f16(f16_from_f32(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(f32_from_f16(f16_from_f32(std::numeric_limits<float>::infinity()))));
  EXPECT_FLOAT_EQ(f32_from_f16(0x2e66), 0.0999755859375f);
  EXPECT_EQ(f16_from_f32(0.1f), 0x2e66);
}

TEST(DType, LoadAndStoreThroughEveryType) {
  unsigned char buf[8] = {};
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    store_from_f32(buf, t, 1, 0.3f);
    EXPECT_EQ(load_as_f32(buf, t, 1), round_to(t, 0.3f));
    EXPECT_NEAR(load_as_f32(buf, t, 1), 0.3f, t == DType::kBF16 ? 2e-3 : 2e-4);
  }
}

// The bulk forms against the scalar ones over bit patterns that cover every
// exponent (NaN, infinities, subnormals, ties included) of both directions.
TEST(DType, BulkConversionsEqualTheScalarOnes) {
  std::vector<float> in;
  for (std::uint64_t u = 0; u < (1ull << 32); u += 0x10001ull * 7 + 3) {
    const auto b = static_cast<std::uint32_t>(u);
    float f;
    std::memcpy(&f, &b, 4);
    in.push_back(f);
  }
  for (std::uint32_t b : {0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u, 0x3f808000u, 0x3f818000u}) {
    float f;
    std::memcpy(&f, &b, 4);
    in.push_back(f);
  }
  const auto n = static_cast<std::int64_t>(in.size());
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<unsigned char> bulk(in.size() * 4), scalar(in.size() * 4);
    store_all_from_f32(in.data(), n, t, bulk.data());
    for (std::int64_t i = 0; i < n; ++i) store_from_f32(scalar.data(), t, i, in[static_cast<std::size_t>(i)]);
    ASSERT_EQ(bulk, scalar);
    std::vector<float> back(in.size());
    load_all_as_f32(bulk.data(), n, t, back.data());
    for (std::int64_t i = 0; i < n; ++i) {
      const float want = load_as_f32(scalar.data(), t, i), got = back[static_cast<std::size_t>(i)];
      ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << i;
    }
  }
}

}  // namespace
}  // namespace libra
