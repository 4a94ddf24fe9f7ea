// python/src/kernel.cpp: the CPU attention kernel on caller-owned memory (libra/kernel.hpp).
#include "binding.hpp"

#include <cmath>
#include <optional>
#include <tuple>

#include "libra/kernel.hpp"

namespace libra_py {

namespace {

// Kernel views: (data_ptr, dtype, rows, heads, head_dim, row_stride).
using View = std::tuple<std::uintptr_t, std::string, I64, I64, I64, I64>;

// libra.torch's CPU backend hands fp32 and bf16 views only.
libra::kernel::DType kernel_dtype(const std::string& name) {
  libra::Result<libra::DType> t = libra::parse_dtype(name);
  if (!t.ok() || *t == libra::DType::kF16) bad("kernel dtype " + name + ": must be fp32 or bf16");
  return *t;
}

// The kernel reads softmax_scale 0 as "1 / sqrt(head_dim)"; here None says that, and a real 0 (legal
// math: uniform attention) is refused rather than silently replaced (libra.torch.attention honours 0
// without calling the kernel with it).
float kernel_scale(std::optional<float> s) {
  if (!s) return 0.0f;
  if (*s == 0.0f || !std::isfinite(*s)) {
    bad("kernel softmax_scale " + std::string(py::str(py::float_(*s))) +
        ": must be finite and nonzero (None for 1/sqrt(head_dim))");
  }
  return *s;
}

libra::kernel::Tensor view(const View& v) {
  const auto& [ptr, dtype, rows, heads, head_dim, stride] = v;
  return {reinterpret_cast<void*>(ptr), kernel_dtype(dtype), rows, heads, head_dim, stride};
}

std::vector<libra::kernel::Fragment> kernel_fragments(const py::array_t<I64, py::array::c_style>& a) {
  if (a.ndim() != 2 || a.shape(1) != 5) bad("kernel fragments: must be an int64 array of shape [n, 5]");
  std::vector<libra::kernel::Fragment> out(static_cast<std::size_t>(a.shape(0)));
  auto r = a.unchecked<2>();
  for (py::ssize_t i = 0; i < a.shape(0); ++i) out[static_cast<std::size_t>(i)] = {r(i, 0), r(i, 1), r(i, 2), r(i, 3), r(i, 4)};
  return out;
}

}  // namespace

void bind_kernel(py::module_& m) {
  // ---- CPU attention kernel on caller-owned memory (torch tensors' data_ptr()).
  // Views are (data_ptr, dtype, rows, heads, head_dim, row_stride); fragments
  // an int64 [n, 5] array of (q_row, kv_row, sample_len, a, e). The caller
  // keeps the memory alive; libra.torch does.
  // Both passes take the same mask, scale and threads, and run without the GIL.
  auto run = [](auto& args, I64 window, std::optional<float> scale, int threads, auto pass) {
    args.window = window;
    args.softmax_scale = kernel_scale(scale);
    args.threads = threads;
    libra::Status s = [&] {
      py::gil_scoped_release release;
      return pass(args);
    }();
    check(s);
  };
  m.def(
      "kernel_forward",
      [run](const View& q, const View& k, const View& v, const View& o, const View& lse,
         const py::array_t<I64, py::array::c_style>& fragments, I64 window, std::optional<float> scale, int threads) {
        std::vector<libra::kernel::Fragment> frags = kernel_fragments(fragments);
        libra::kernel::ForwardArgs a{view(q), view(k), view(v), view(o), view(lse), frags};
        run(a, window, scale, threads, [](const libra::kernel::ForwardArgs& x) { return libra::kernel::attention_forward(x); });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("lse"), py::arg("fragments"),
      py::arg("window") = libra::kFullCausal, py::arg("softmax_scale") = py::none(), py::arg("threads") = 1);
  m.def(
      "kernel_backward",
      [run](const View& q, const View& k, const View& v, const View& o, const View& d_o, const View& lse,
         const View& dq, const View& dk, const View& dv, const py::array_t<I64, py::array::c_style>& fragments,
         I64 window, std::optional<float> scale, int threads) {
        std::vector<libra::kernel::Fragment> frags = kernel_fragments(fragments);
        libra::kernel::BackwardArgs a{view(q), view(k), view(v), view(o), view(d_o), view(lse),
                                      view(dq), view(dk), view(dv), frags};
        run(a, window, scale, threads, [](const libra::kernel::BackwardArgs& x) { return libra::kernel::attention_backward(x); });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("o"), py::arg("d_o"), py::arg("lse"), py::arg("dq"),
      py::arg("dk"), py::arg("dv"), py::arg("fragments"), py::arg("window") = libra::kFullCausal,
      py::arg("softmax_scale") = py::none(), py::arg("threads") = 1);
  m.def("simd_target", &libra::kernel::simd_target);
}

}  // namespace libra_py
