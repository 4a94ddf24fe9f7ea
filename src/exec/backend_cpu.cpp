// The CPU attention backend: the Highway kernel of libra/kernel.hpp behind
// the AttentionBackend interface.
#include <initializer_list>
#include <string>
#include <utility>

#include "libra/backend.hpp"
#include "libra/kernel.hpp"

namespace libra {

namespace {

// The kernel takes the views as they are; it only needs them in host memory.
Status on_cpu(std::initializer_list<std::pair<const char*, Device>> views) {
  for (auto [name, device] : views) {
    if (device != Device::kCpu) {
      return invalid_input(std::string("cpu backend: tensor ") + name + " is on device " + device_name(device));
    }
  }
  return Status();
}

class CpuBackend final : public AttentionBackend {
 public:
  std::string_view name() const override { return name_; }
  Device device() const override { return Device::kCpu; }

  // Asks the kernel's own argument checks with a one-element call, so the
  // answer follows whatever types the kernel accepts.
  Status supports(DType dtype) const override {
    static const unsigned char buf[64] = {};
    unsigned char out[64];
    float lse[4];
    const QueryFragment f{0, 0, 1, 0, 1};
    kernel::ForwardArgs a;
    a.q = {buf, dtype, 1, 1, 1, 1};
    a.k = a.q;
    a.v = a.q;
    a.o = {out, dtype, 1, 1, 1, 1};
    a.lse = {lse, DType::kF32, 1, 1, 1, 1};
    a.fragments = {&f, 1};
    Status s = kernel::validate(a);
    if (!s.ok()) return invalid_input(std::string("cpu backend: dtype ") + dtype_name(dtype) + " is not supported by the kernel (" + s.message() + ")");
    return s;
  }
  std::size_t forward_workspace_bytes(const AttentionForward&) const override { return 0; }
  std::size_t backward_workspace_bytes(const AttentionBackward&) const override { return 0; }

  Status forward(const AttentionForward& x, std::span<std::byte>) override {
    LIBRA_TRY(on_cpu({{"q", x.q.device}, {"k", x.k.device}, {"v", x.v.device}, {"o", x.o.device}, {"lse", x.lse.device}}));
    return kernel::attention_forward({.q = x.q, .k = x.k, .v = x.v, .o = x.o, .lse = x.lse, .fragments = x.fragments,
                                      .window = x.window, .threads = x.threads});
  }

  Status backward(const AttentionBackward& x, std::span<std::byte>) override {
    LIBRA_TRY(on_cpu({{"q", x.q.device}, {"k", x.k.device}, {"v", x.v.device}, {"o", x.o.device}, {"d_o", x.d_o.device},
                      {"lse", x.lse.device}, {"dq", x.dq.device}, {"dk", x.dk.device}, {"dv", x.dv.device}}));
    return kernel::attention_backward({.q = x.q, .k = x.k, .v = x.v, .o = x.o, .d_o = x.d_o, .lse = x.lse, .dq = x.dq,
                                       .dk = x.dk, .dv = x.dv, .fragments = x.fragments, .window = x.window,
                                       .threads = x.threads});
  }

 private:
  std::string name_ = "cpu (Highway " + kernel::simd_target() + ")";
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace libra
