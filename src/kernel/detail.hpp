// Internal: the work decomposition shared by the driver (attention.cpp) and
// the SIMD task bodies (attention_simd.cpp, compiled once per Highway target).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "libra/kernel.hpp"

namespace libra::kernel::detail {

// Query rows and keys per block. 64 x 64 keeps a block's scores (16 KiB),
// its packed K^T tile (32 KiB at d = 128) and the output accumulator in L1/L2.
inline constexpr std::int64_t kBq = 64;
inline constexpr std::int64_t kBk = 64;
// Packed head dimensions are padded to a multiple of the widest vector.
inline constexpr std::int64_t kPadTo = 16;

inline std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

// First key visible to query position q under window w (kFullCausal-safe).
inline std::int64_t first_key(std::int64_t q, std::int64_t w) { return w > q ? 0 : q - w + 1; }
// Last query position that sees key j under window w, capped at cap.
inline std::int64_t last_query(std::int64_t j, std::int64_t w, std::int64_t cap) {
  return (w - 1 >= cap - j) ? cap : j + w - 1;
}

// Fragments that share their K/V rows (same kv_row): one packed key range.
struct Group {
  std::int64_t kv_row = 0;
  std::int64_t len = 0;        // keys 0 .. len-1 (max e of its fragments)
  std::int64_t nblocks = 0;    // ceil(len / kBk)
  std::int64_t block_off = 0;  // first packed block of this group
  std::vector<std::int32_t> frags;
};

struct FwdTask {
  std::int32_t frag = 0;
  std::int32_t head = 0;   // query head within the KV head's group
  std::int64_t i0 = 0;     // fragment-local first row
  std::int64_t m = 0;      // rows
  std::int64_t cost = 0;
};

struct BwdTask {
  std::int32_t group = 0;
  std::int64_t jb = 0;  // key block within the group
  std::int64_t cost = 0;
};

// Everything a forward task reads, for one KV head g.
struct FwdCtx {
  ForwardArgs args;
  std::int64_t d = 0, dp = 0, hg = 0, g = 0;
  float scale = 1.0f;
  const std::vector<Group>* groups = nullptr;
  const std::vector<std::int32_t>* frag_group = nullptr;
  const float* kt = nullptr;  // [block][dp][kBk]
  const float* v = nullptr;   // [block * kBk][dp], non-finite values as 0
  // By block: bit j set when value row j of the block was not finite (its
  // viewers' outputs are NaN; packed as 0 so masked rows stay finite).
  const std::uint64_t* v_bad = nullptr;
};

// Scratch per thread for a forward task.
inline std::int64_t fwd_scratch_floats(std::int64_t dp) { return 2 * kBq * dp + kBq * kBk + 3 * kBq; }

struct BwdCtx {
  BackwardArgs args;
  std::int64_t d = 0, dp = 0, hg = 0, g = 0, rows = 0;
  float scale = 1.0f;
  const std::vector<Group>* groups = nullptr;
  const float* kt = nullptr;     // [block][dp][kBk]
  const float* vt = nullptr;     // [block][dp][kBk]
  const float* kr = nullptr;     // [block * kBk][dp]
  // By block: bit j set when key row j of the block was not finite (packed
  // as 0): dQ of every query that sees it is NaN, as 0 * Inf is.
  const std::uint64_t* k_bad = nullptr;
  const float* qp = nullptr;     // [hg][rows][dp], pre-scaled by scale (as the forward packs Q)
  const float* dop = nullptr;    // [hg][rows][dp]
  const float* lse = nullptr;    // [hg][rows]
  const float* delta = nullptr;  // [hg][rows]: rowsum(dO * O)
};

inline std::int64_t bwd_scratch_floats(std::int64_t dp) { return 2 * kBq * kBk + 2 * kBk * dp; }

// SIMD task bodies (dynamic dispatch to the best Highway target).
void forward_task(const FwdCtx& cx, const FwdTask& t, float* scratch);
// dq_acc: this thread's [hg][rows][dp] dQ accumulator (unscaled).
void backward_task(const BwdCtx& cx, const BwdTask& t, float* scratch, float* dq_acc);
const char* best_target_name();
// Restricts dispatch to `name` and worse targets (see set_simd_target).
Status restrict_targets(std::string_view name);
// Runs `iters` iterations of the target's FMA chains; returns the FLOPs of
// one iteration (and a sink value so the loop is not optimised away).
std::int64_t fma_loop(std::int64_t iters, float* sink);

// Element access for packing (scalar, any dtype): fp32, bf16 and fp16 all
// widen to fp32, and every product accumulates in fp32.
inline float load_elem(const void* base, DType t, std::int64_t offset) { return load_as_f32(base, t, offset); }
inline void store_elem(void* base, DType t, std::int64_t offset, float x) { store_from_f32(base, t, offset, x); }
template <class Void>
inline std::int64_t elem_offset(const BasicTensor<Void>& t, std::int64_t row, std::int64_t head) {
  return row * t.row_stride + head * t.head_dim;
}

}  // namespace libra::kernel::detail
