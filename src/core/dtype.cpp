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

}  // namespace libra
