// libra/backend.hpp: the attention-kernel seam of the executors.
//
// Defines `libra::AttentionBackend`: varlen causal attention forward and
// backward on strided views (pointer, strides, element type, device tag)
// with caller-owned workspace, and make_cpu_backend, the Highway CPU kernel
// (libra/kernel.hpp) behind it. The executors call nothing else to compute,
// so a GPU kernel is one more implementation of this class (see "Adding a
// backend" in docs/architecture.md).
//
// Conventions (those of libra/kernel.hpp): a view covers `heads`
// consecutive heads of a row-major [rows, heads, head_dim] tensor whose rows
// are `row_stride` elements apart; query fragment f holds the sample-local
// queries [a, e) at rows q_row.. of Q (O, LSE, dO, dQ) and the sample's keys
// 0 .. e-1 at rows kv_row.. of K (V, dK, dV); query head i uses KV head
// i / (q.heads / k.heads); a window w lets query q see keys max(0, q-w+1)..q.
// LSE is fp32 with head_dim 1. Backward writes dQ and ADDS into dK and dV.
//
//   std::unique_ptr<libra::AttentionBackend> be = libra::make_cpu_backend();
//   libra::AttentionForward f{q, k, v, o, lse, fragments};
//   std::vector<std::byte> ws(be->forward_workspace_bytes(f));
//   libra::Status s = be->forward(f, ws);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>

#include "libra/dtype.hpp"
#include "libra/status.hpp"
#include "libra/tensor_view.hpp"
#include "libra/workload.hpp"

namespace libra {

struct AttentionForward {
  ConstView q, k, v;
  View o, lse;
  std::span<const QueryFragment> fragments;
  std::int64_t window = kFullCausal;
  int threads = 1;  // CPU threads the call may use
};

struct AttentionBackward {
  ConstView q, k, v, o, d_o, lse;
  View dq, dk, dv;  // dq written; dk, dv added to
  std::span<const QueryFragment> fragments;
  std::int64_t window = kFullCausal;
  int threads = 1;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  [[nodiscard]] virtual Device device() const = 0;
  // Whether Q/K/V/O/dO of this type are accepted (an error says why not).
  [[nodiscard]] virtual Status supports(DType dtype) const = 0;
  // Bytes of workspace the caller must pass to a call with these arguments.
  [[nodiscard]] virtual std::size_t forward_workspace_bytes(const AttentionForward& args) const = 0;
  [[nodiscard]] virtual std::size_t backward_workspace_bytes(const AttentionBackward& args) const = 0;
  [[nodiscard]] virtual Status forward(const AttentionForward& args, std::span<std::byte> workspace) = 0;
  [[nodiscard]] virtual Status backward(const AttentionBackward& args, std::span<std::byte> workspace) = 0;
};

// The Highway CPU kernel. It asks for no workspace: its packed panels live
// in per-thread scratch that it grows and keeps itself (kernel.hpp).
[[nodiscard]] std::unique_ptr<AttentionBackend> make_cpu_backend();

// The backends that can be made by name (`libra exec --backend NAME`), one
// line each in src/exec/registry.cpp: a new backend is its own files and
// that line.
struct BackendEntry {
  const char* name;  // "cpu"
  const char* what;  // for --help
  std::unique_ptr<AttentionBackend> (*make)();
};
[[nodiscard]] std::span<const BackendEntry> attention_backends();
// The registered backend `name`; the error lists the registered names.
[[nodiscard]] Result<std::unique_ptr<AttentionBackend>> make_backend(std::string_view name);

}  // namespace libra
