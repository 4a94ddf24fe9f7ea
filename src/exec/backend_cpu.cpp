// The CPU attention backend: the Highway kernel of libra/kernel.hpp behind
// the AttentionBackend interface.
#include <string>
#include <vector>

#include "libra/backend.hpp"
#include "libra/kernel.hpp"

namespace libra {

const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

namespace {

template <class Void>
Result<kernel::BasicTensor<Void>> tensor(const BasicView<Void>& v, const char* name) {
  if (v.device != Device::kCpu) {
    return invalid_input(std::string("cpu backend: tensor ") + name + " is on device " + device_name(v.device));
  }
  return kernel::BasicTensor<Void>{v.data, v.dtype, v.rows, v.heads, v.head_dim, v.row_stride};
}

void to_kernel(std::span<const QueryFragment> f, std::vector<kernel::Fragment>& out) {
  out.resize(f.size());
  for (std::size_t i = 0; i < f.size(); ++i) out[i] = {f[i].q_row, f[i].kv_row, f[i].sample_len, f[i].a, f[i].e};
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
    const kernel::Fragment kf{f.q_row, f.kv_row, f.sample_len, f.a, f.e};
    a.fragments = {&kf, 1};
    Status s = kernel::validate(a);
    if (!s.ok()) return invalid_input(std::string("cpu backend: dtype ") + dtype_name(dtype) + " is not supported by the kernel (" + s.message() + ")");
    return s;
  }
  std::size_t forward_workspace_bytes(const AttentionForward&) const override { return 0; }
  std::size_t backward_workspace_bytes(const AttentionBackward&) const override { return 0; }

  Status forward(const AttentionForward& x, std::span<std::byte>) override {
    kernel::ForwardArgs a;
    LIBRA_ASSIGN_OR_RETURN(a.q, tensor(x.q, "q"));
    LIBRA_ASSIGN_OR_RETURN(a.k, tensor(x.k, "k"));
    LIBRA_ASSIGN_OR_RETURN(a.v, tensor(x.v, "v"));
    LIBRA_ASSIGN_OR_RETURN(a.o, tensor(x.o, "o"));
    LIBRA_ASSIGN_OR_RETURN(a.lse, tensor(x.lse, "lse"));
    to_kernel(x.fragments, frags_);
    a.fragments = frags_;
    a.window = x.window;
    a.threads = x.threads;
    return kernel::attention_forward(a);
  }

  Status backward(const AttentionBackward& x, std::span<std::byte>) override {
    kernel::BackwardArgs a;
    LIBRA_ASSIGN_OR_RETURN(a.q, tensor(x.q, "q"));
    LIBRA_ASSIGN_OR_RETURN(a.k, tensor(x.k, "k"));
    LIBRA_ASSIGN_OR_RETURN(a.v, tensor(x.v, "v"));
    LIBRA_ASSIGN_OR_RETURN(a.o, tensor(x.o, "o"));
    LIBRA_ASSIGN_OR_RETURN(a.d_o, tensor(x.d_o, "d_o"));
    LIBRA_ASSIGN_OR_RETURN(a.lse, tensor(x.lse, "lse"));
    LIBRA_ASSIGN_OR_RETURN(a.dq, tensor(x.dq, "dq"));
    LIBRA_ASSIGN_OR_RETURN(a.dk, tensor(x.dk, "dk"));
    LIBRA_ASSIGN_OR_RETURN(a.dv, tensor(x.dv, "dv"));
    to_kernel(x.fragments, frags_);
    a.fragments = frags_;
    a.window = x.window;
    a.threads = x.threads;
    return kernel::attention_backward(a);
  }

 private:
  std::string name_ = "cpu (Highway " + kernel::simd_target() + ")";
  std::vector<kernel::Fragment> frags_;
};

}  // namespace

std::unique_ptr<AttentionBackend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace libra
