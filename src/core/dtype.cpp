// Names of the element types and the mapping from format-1 element sizes.
#include "libra/dtype.hpp"

namespace libra {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "unknown";
}

Result<DType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "fp16" || name == "float16") return DType::kF16;
  return invalid_input("dtype '" + std::string(name) + "' is not one of fp32, bf16, fp16");
}

Result<DType> dtype_from_elem_bytes(std::int64_t elem_bytes, const std::string& source) {
  if (elem_bytes == 4) return DType::kF32;
  if (elem_bytes == 2) return DType::kBF16;
  return invalid_input(source + ": elem_bytes " + std::to_string(elem_bytes) +
                       " names no element type (4 is fp32, 2 is bf16); give \"dtype\" (fp32, bf16 or fp16) instead");
}

void store_all_from_f32(const float* in, std::int64_t n, DType t, void* out) {
  if (t == DType::kF32) {
    if (n > 0) std::memcpy(out, in, static_cast<std::size_t>(n) * 4);
    return;
  }
  auto* o = static_cast<std::uint16_t*>(out);
  if (t == DType::kF16) {
    for (std::int64_t i = 0; i < n; ++i) o[i] = f16_from_f32(in[i]);
    return;
  }
  // bf16_from_f32 without its branch, so that the loop vectorises.
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, in + i, 4);
    const std::uint32_t quiet = (u >> 16) | 0x40u, rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    o[i] = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

void load_all_as_f32(const void* in, std::int64_t n, DType t, float* out) {
  if (t == DType::kF32) {
    if (n > 0) std::memcpy(out, in, static_cast<std::size_t>(n) * 4);
    return;
  }
  const auto* b = static_cast<const std::uint16_t*>(in);
  if (t == DType::kF16) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = f32_from_f16(b[i]);
    return;
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(b[i]) << 16;
    std::memcpy(out + i, &u, 4);
  }
}

}  // namespace libra
