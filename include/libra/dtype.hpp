// libra/dtype.hpp: the element types libra stores, sends and computes on.
//
// Defines `libra::DType` (fp32, bf16, fp16), its size and name, parsing from
// the names the CLI and plan files use, the elem_bytes of older plan files
// mapped onto it, and scalar conversions between fp32 and the 16-bit types
// (round to nearest even; NaN stays NaN). Every stage names element types
// with it: plan configs (AttentionShape::dtype), plan files, the kernel's
// tensor views, the executors' buffers and messages.
//
//   libra::Result<libra::DType> t = libra::parse_dtype("bf16");
//   std::int64_t bytes = libra::dtype_bytes(*t);            // 2
//   std::uint16_t h = libra::f16_from_f32(0.1f);            // 0x2e66
//   float back = libra::f32_from_f16(h);                    // 0.0999755859375
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "libra/status.hpp"

namespace libra {

// The numeric values are stable: plan files and fingerprints encode them
// (see dtype_code below), so new types are appended, never renumbered.
enum class DType : std::uint8_t {
  kF32 = 0,   // IEEE binary32
  kBF16 = 1,  // the upper 16 bits of a binary32
  kF16 = 2,   // IEEE binary16
};

[[nodiscard]] constexpr std::int64_t dtype_bytes(DType t) { return t == DType::kF32 ? 4 : 2; }
// "fp32", "bf16", "fp16".
[[nodiscard]] const char* dtype_name(DType t);
// Accepts the names above (and "float32", "bfloat16", "float16"); the error
// names the input and the accepted names.
[[nodiscard]] Result<DType> parse_dtype(std::string_view name);

// Plan files of format 1 stored only an element size, which the executors
// read as 4 -> fp32, 2 -> bf16. `source` names the input in the error for
// any other size (no type has it, or, for 2 alone, a new writer would have
// written the type explicitly).
[[nodiscard]] Result<DType> dtype_from_elem_bytes(std::int64_t elem_bytes, const std::string& source);

// One 64-bit word per type for canonical encodings (fingerprints, binary
// plan files): fp32 and bf16 keep the word older files hold (their element
// size, 4 and 2), so those plans keep their fingerprints; fp16 is 2 | 1 << 8.
[[nodiscard]] constexpr std::uint64_t dtype_code(DType t) {
  return t == DType::kF32 ? 4u : t == DType::kBF16 ? 2u : (2u | (1u << 8));
}
// Inverse of dtype_code; false for a word no type has.
[[nodiscard]] constexpr bool dtype_from_code(std::uint64_t code, DType& out) {
  if (code == 4u) out = DType::kF32;
  else if (code == 2u) out = DType::kBF16;
  else if (code == (2u | (1u << 8))) out = DType::kF16;
  else return false;
  return true;
}

// ---- scalar conversions ------------------------------------------------------

[[nodiscard]] inline std::uint16_t bf16_from_f32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
[[nodiscard]] inline float f32_from_bf16(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; overflow
// rounds to infinity, tiny values to subnormals or signed zero.
[[nodiscard]] inline std::uint16_t f16_from_f32(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (a < 0x38800000u) {
    // Subnormal or zero in binary16: value = m * 2^-24.
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
    const std::uint32_t e = a >> 23;
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14 + (113 - e) - 1 ... shift so that result is m * 2^-24
    std::uint32_t m = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  // Normal: rebias the exponent (127 -> 15) and round 23 -> 10 mantissa bits.
  std::uint32_t v = a - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (v >> 13));
}
[[nodiscard]] inline float f32_from_f16(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  std::uint32_t u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {
    // Subnormal: normalise.
    std::uint32_t ex = 113;
    while ((m & 0x400u) == 0) {
      m <<= 1;
      --ex;
    }
    u = sign | (ex << 23) | ((m & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Element i of a buffer of type t, as fp32; and the reverse (rounding).
[[nodiscard]] inline float load_as_f32(const void* base, DType t, std::int64_t i) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, static_cast<const unsigned char*>(base) + 4 * i, 4);
    return f;
  }
  std::uint16_t b;
  std::memcpy(&b, static_cast<const unsigned char*>(base) + 2 * i, 2);
  return t == DType::kBF16 ? f32_from_bf16(b) : f32_from_f16(b);
}
inline void store_from_f32(void* base, DType t, std::int64_t i, float x) {
  if (t == DType::kF32) {
    std::memcpy(static_cast<unsigned char*>(base) + 4 * i, &x, 4);
    return;
  }
  const std::uint16_t b = t == DType::kBF16 ? bf16_from_f32(x) : f16_from_f32(x);
  std::memcpy(static_cast<unsigned char*>(base) + 2 * i, &b, 2);
}
// n elements at once, element for element equal to store_from_f32 /
// load_as_f32; written as plain loops the compiler vectorises (the
// executor converts whole home tensors on every call).
void store_all_from_f32(const float* in, std::int64_t n, DType t, void* out);
void load_all_as_f32(const void* in, std::int64_t n, DType t, float* out);

// x rounded to type t and back (the value a t buffer would hold).
[[nodiscard]] inline float round_to(DType t, float x) {
  if (t == DType::kBF16) return f32_from_bf16(bf16_from_f32(x));
  if (t == DType::kF16) return f32_from_f16(f16_from_f32(x));
  return x;
}

}  // namespace libra
