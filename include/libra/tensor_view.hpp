// libra/tensor_view.hpp: the strided tensor view and query fragment shared
// by the attention seam (libra/backend.hpp) and the CPU kernel
// (libra/kernel.hpp), so a view passes from one to the other unchanged.
//
// Defines `libra::BasicView` (`View`, `ConstView`): heads [0, heads) of a
// row-major [rows, heads, head_dim] tensor whose element (t, h, c) is at
// element offset t * row_stride + h * head_dim + c from data, its element
// type and the device its memory lives on; and `libra::QueryFragment`, one
// sample's queries of a varlen call.
//
//   std::vector<float> q(rows * 8 * 64);
//   libra::ConstView all{q.data(), libra::DType::kF32, rows, 8, 64, 8 * 64};
//   libra::ConstView two = all.heads_slice(2, 2);   // heads 2 and 3, no copy
#pragma once

#include <cstdint>
#include <type_traits>

#include "libra/dtype.hpp"

namespace libra {

// Where a view's memory lives. Backends reject views of another device.
enum class Device : std::uint8_t { kCpu = 0, kCuda = 1 };
[[nodiscard]] inline const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

template <class Void>
struct BasicView {
  Void* data = nullptr;
  DType dtype = DType::kF32;
  std::int64_t rows = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t row_stride = 0;  // in elements, >= heads * head_dim
  Device device = Device::kCpu;

  // Heads [first, first + count) of the same buffer, no copy. An
  // out-of-range request yields a null view, which the kernel rejects.
  [[nodiscard]] BasicView heads_slice(std::int64_t first, std::int64_t count) const {
    return slice(first, count, heads, head_dim, &BasicView::heads);
  }
  // Rows [first, first + count), no copy (a null view if out of range).
  [[nodiscard]] BasicView rows_slice(std::int64_t first, std::int64_t count) const {
    return slice(first, count, rows, row_stride, &BasicView::rows);
  }
  operator BasicView<const void>() const  // NOLINT: a writable view is also readable
    requires(!std::is_const_v<Void>)
  {
    return {data, dtype, rows, heads, head_dim, row_stride, device};
  }

 private:
  BasicView slice(std::int64_t first, std::int64_t count, std::int64_t size, std::int64_t step,
                  std::int64_t BasicView::*extent) const {
    BasicView s = *this;
    if (first < 0 || count < 0 || first > size - count || data == nullptr) {
      s.data = nullptr;
      return s;
    }
    using Byte = std::conditional_t<std::is_const_v<Void>, const unsigned char, unsigned char>;
    s.data = static_cast<Byte*>(data) + first * step * dtype_bytes(dtype);
    s.*extent = count;
    return s;
  }
};
using ConstView = BasicView<const void>;
using View = BasicView<void>;

// One query fragment of a varlen call: the sample-local queries [a, e) of
// a sample of length sample_len (0 <= a <= e <= sample_len; a == e is an
// empty no-op), at rows q_row.. of Q (O, LSE, dO, dQ); the sample's keys
// 0 .. e-1 at rows kv_row.. of K (V, dK, dV).
struct QueryFragment {
  std::int64_t q_row = 0, kv_row = 0, sample_len = 0, a = 0, e = 0;
};

}  // namespace libra
