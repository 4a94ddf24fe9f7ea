// libra/plan.hpp: SH-Tiles, TAP placement, the exchange plan, pipeline
// chunks and the immutable Plan object with its fingerprint and files.
//
// One Plan describes one pool (P slots, W = P * CP workers) for one
// iteration: every SH-Tile (slot x query block x head shard), the worker it
// runs on, the exact list of token ranges every worker sends to every other
// worker (Q, KV and O), the per-pair byte matrix and the per-chunk split for
// the pipeliner. Mode `tap` follows ../shared/spec/planning-contract.md (sections 4-8)
// to the letter; `ulysses` and `tap-split` are separately named modes and
// `dedup_per_kv_head` a separately named option (see docs/tiles.md).
//
//   libra::PlanConfig cfg;
//   cfg.seq_len = 1 << 20; cfg.cp = 8; cfg.block_size = 8192; cfg.head_shards = 8;
//   cfg.shape = {.heads_q = 32, .heads_kv = 4, .head_dim = 128, .dtype = libra::DType::kBF16};
//   cfg.chunks = 4;
//   libra::Result<libra::Plan> plan = libra::make_plan(pool, cfg);   // pool: P packed sequences
//   if (!plan.ok()) return plan.error();
//   for (const libra::Tile& t : plan->tiles()) use(t.worker, t.begin, t.end);
//   for (const libra::Transfer& x : plan->transfers(src, dst)) send(x);
//   libra::Status s = libra::save_plan(*plan, "plan.bin");            // or "plan.json"
//   libra::Result<libra::Plan> again = libra::load_plan("plan.bin");  // same fingerprint()
//
// Conventions used throughout:
//   - worker r = slot * cp + cp_rank; token x of slot p resides on worker
//     p * cp + x / (seq_len / cp), all heads (the default contiguous home
//     layout; PlanConfig::home_layout and HomeMap give the general rule).
//   - query head i uses KV head i / (heads_q / heads_kv).
//   - "flops" are the integer form of the contract: query heads x causal
//     (query, key) pairs. Real forward FLOPs = 4 * head_dim * flops
//     (libra::forward_flops).
//   - byte counts are exact int64; Q/O bytes per token per head =
//     head_dim * elem_bytes() (the size of shape.dtype), KV bytes per token per KV head =
//     2 * head_dim * elem_bytes() (K and V).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "libra/dtype.hpp"
#include "libra/status.hpp"
#include "libra/workload.hpp"

namespace libra {

struct AttentionShape {
  int heads_q = 0;     // h_q
  int heads_kv = 0;    // h_kv, divides h_q
  int head_dim = 0;    // d
  DType dtype = DType::kBF16;  // element type of Q, K, V, O, dO (LSE and gradients travel in fp32)
  std::int64_t window = kFullCausal;  // sliding-window width w; kFullCausal = plain causal
  std::int64_t elem_bytes() const { return dtype_bytes(dtype); }  // e
};

enum class PlanMode : std::uint8_t {
  kTap = 0,       // paper Algorithm 2, exactly as the planning contract states
  kUlysses = 1,   // baseline: slot p's CP group computes its own sequence, split by heads
  kTapSplit = 2,  // TAP that cuts a tile along its query rows when no worker has headroom
  kTapTopo = 3,   // within tau of balance, least slowest-worker transfer time on PlanConfig::topology
};

// "tap", "ulysses", "tap-split", "tap-topo".
[[nodiscard]] std::string_view plan_mode_name(PlanMode mode);
[[nodiscard]] Result<PlanMode> parse_plan_mode(std::string_view name);

// How a slot's packed sequence of L rows is split over its CP ranks: which
// rank holds packed row x and where in that rank's home buffer (L/CP rows).
enum class HomeLayout : std::uint8_t {
  kContiguous = 0,  // rank c holds rows [c L/CP, (c+1) L/CP), in order (the contract's layout)
  kZigzag = 1,      // 2 CP chunks of L/(2 CP) rows; rank c holds chunks c and 2CP-1-c, in that
                    // order (Megatron / TransformerEngine load-balanced CP)
};

// "contiguous", "zigzag".
[[nodiscard]] std::string_view home_layout_name(HomeLayout layout);
[[nodiscard]] Result<HomeLayout> parse_home_layout(std::string_view name);

// Packed row x of a slot at home: CP rank `rank`, row `row` of its home
// buffer; packed rows [x, run_end) follow it in order at home rows row, row
// + 1, ... of the same rank (the run is maximal).
struct HomeSpot {
  int rank = 0;
  std::int64_t row = 0;
  std::int64_t run_end = 0;
};

// The one mapping between packed rows and home rows that the planners, the
// schedule, the harness and the bindings use. Assumes a valid configuration
// (validate_plan_config: 2 CP divides L for zigzag).
class HomeMap {
 public:
  HomeMap(std::int64_t seq_len, int cp, HomeLayout layout) : seq_len_(seq_len), cp_(cp), layout_(layout) {}
  std::int64_t rows() const { return seq_len_ / cp_; }  // home rows per rank
  // 0 <= x < seq_len.
  HomeSpot locate(std::int64_t x) const {
    if (layout_ == HomeLayout::kContiguous) {
      const std::int64_t n = rows();
      const int c = static_cast<int>(x / n);
      return {c, x - c * n, (c + 1) * n};
    }
    const std::int64_t n = seq_len_ / (2 * cp_);
    const std::int64_t k = x / n;
    // Chunks CP-1 and CP both belong to rank CP-1 and sit side by side in
    // the packed sequence and at home: one run.
    const std::int64_t end = (k == cp_ - 1 || k == cp_) ? (cp_ + 1) * n : (k + 1) * n;
    if (k < cp_) return {static_cast<int>(k), x - k * n, end};
    return {static_cast<int>(2 * cp_ - 1 - k), n + x - k * n, end};
  }
  // The packed row at home row i of CP rank c (the inverse of locate).
  std::int64_t packed_row(int c, std::int64_t i) const {
    if (layout_ == HomeLayout::kContiguous) return c * rows() + i;
    const std::int64_t n = seq_len_ / (2 * cp_);
    return i < n ? c * n + i : (2 * cp_ - 1 - c) * n + (i - n);
  }

 private:
  std::int64_t seq_len_;
  int cp_;
  HomeLayout layout_;
};

// How the M pipeline chunks cut a tile's w query heads (contract section 8
// fixes the equal cut; the tapered one is libra's own).
enum class ChunkSplit : std::uint8_t {
  kEqual = 0,    // w / M heads each; M divides w
  kTapered = 1,  // the first and the last chunk about half as wide as the
                 // others; 3 <= M <= w. Chunk 0's dispatch and chunk M-1's
                 // return are the transfers no compute hides, so they carry
                 // less; the middle chunks' transfers hide under more compute.
};

// "equal", "tapered".
[[nodiscard]] std::string_view chunk_split_name(ChunkSplit split);
[[nodiscard]] Result<ChunkSplit> parse_chunk_split(std::string_view name);

// The first head, counted from the tile's first, of pipeline chunk m in
// [0, chunks] of a tile `width` heads wide (m = chunks gives width). Equal:
// m * width / chunks. Tapered: the two end chunks are e = max(1,
// round(width / (2 (chunks - 1)))) wide and the middle ones share the rest,
// the earlier ones one head wider where it does not divide: width 8 in 4
// chunks is 1, 3, 3, 1; 8 in 3 is 2, 4, 2; 16 in 4 is 3, 5, 5, 3. The caller
// has validated (validate_plan_config).
[[nodiscard]] constexpr std::int32_t chunk_head_offset(std::int32_t width, int chunks, ChunkSplit split, int m) {
  if (m <= 0) return 0;
  if (m >= chunks) return width;
  if (split == ChunkSplit::kEqual) return m * (width / chunks);
  const std::int32_t ends = std::max(1, (width + chunks - 1) / (2 * (chunks - 1)));
  const std::int32_t middles = chunks - 2;
  const std::int32_t rest = width - 2 * ends;
  const std::int32_t base = rest / middles, wider = rest % middles;
  return ends + (m - 1) * base + std::min(m - 1, wider);
}

// Where the pool's workers sit and how fast the tiers between them are:
// worker r runs on GPU r of a pool aligned to node boundaries, GPUs numbered
// node-major (node = r / gpus_per_node) and nodes supernode-major. Bandwidths
// are per GPU and direction, GB/s. The defaults are the simulator's h200
// profile (libra::Interconnect, cost_model.hpp); only tap-topo places by it,
// and every mode reports its bytes by tier with it (Plan::tier_bytes).
struct PlanTopology {
  int gpus_per_node = 8;
  int nodes_per_supernode = 4;
  double intra_node_gbps = 360;
  double inter_node_gbps = 45;
  double inter_supernode_gbps = 7.5;
  double congestion_per_node = 0.5;  // NIC share 1 / (1 + c (nodes - 2)) when the pool spans > 2 nodes
  friend bool operator==(const PlanTopology&, const PlanTopology&) = default;
};

struct PlanConfig {
  std::int64_t seq_len = 0;     // L, packed length of every slot
  int cp = 0;                   // CP workers per slot
  std::int64_t block_size = 0;  // B, query rows per SH-Tile
  int head_shards = 0;          // H, query-head shards per block
  AttentionShape shape;
  double tau = 0.03;            // load slack of the soft target C
  int chunks = 1;               // M, pipeline chunks; divides the heads of a tile (equal split)
  // How the chunks cut a tile's heads (chunk_head_offset). Tapered plans are
  // file format version 4.
  ChunkSplit chunk_split = ChunkSplit::kEqual;
  PlanMode mode = PlanMode::kTap;
  // Deduplicate KV fetches per (slot, sample, KV head range) instead of the
  // contract's (slot, sample, head shard). Identical traffic when H <= h_kv;
  // removes the duplicate fetches of a shared KV head when H > h_kv.
  bool dedup_per_kv_head = false;
  // Which CP rank holds which rows of a slot (HomeMap). Zigzag needs 2 CP |
  // L and B | L/(2 CP), so that no tile's rows cross a chunk.
  HomeLayout home_layout = HomeLayout::kContiguous;
  HomeMap home_map() const { return {seq_len, cp, home_layout}; }
  // Send each worker only the causal prefix of a sample's K/V that its tiles
  // read: keys [sample start, last query row it computes], instead of the
  // whole sample the contract's group names (section 6.1). Same tiles, same
  // fragments, fewer KV bytes (and dK/dV returns); Plan::kv_span gives the
  // rows. Off by default: the contract's exchange accounting is the
  // whole-sample one. Plans with it are file format version 3.
  bool kv_prefix = false;
  // tap-topo places by it (and it is part of such a plan's fingerprint and
  // files); other modes only report bytes by tier with it.
  PlanTopology topology;
};

// Bytes of worker r by where they travel (contract section 7 bytes, split
// by PlanConfig::topology): `kept` is what its tiles read without a transfer
// (Q/O of tiles on their home, KV tokens resident on r); the rest is what
// it sends (send_*) and receives (recv_*) inside its node and across nodes
// (cross_* includes cross_supernode_*).
struct TierBytes {
  std::int64_t kept = 0;
  std::int64_t send_intra_node = 0, send_cross_node = 0, send_cross_supernode = 0;
  std::int64_t recv_intra_node = 0, recv_cross_node = 0, recv_cross_supernode = 0;
};

// Checks every divisibility and range rule of the configuration alone
// (contract sections 4, 5, 8). make_plan calls it; the CLI may call it
// before reading a pool.
[[nodiscard]] Status validate_plan_config(const PlanConfig& config);
// The zigzag layout's own rule, the part of validate_plan_config that the
// layout adds: 2 cp divides seq_len and block_size divides seq_len / (2 cp)
// (positive values; errors as validate_plan_config words them).
[[nodiscard]] Status check_zigzag_homes(std::int64_t seq_len, int cp, std::int64_t block_size);

// A half-open range of heads or tokens.
struct HeadRange {
  std::int32_t begin = 0, end = 0;
  std::int32_t size() const { return end - begin; }
  friend bool operator==(const HeadRange&, const HeadRange&) = default;
};

// One SH-Tile (or, in tap-split mode, one piece of one).
struct Tile {
  std::int32_t id = 0;      // index in Plan::tiles(); tap: (slot, block, shard) lexicographic
  std::int32_t slot = 0;    // p
  std::int32_t block = 0;   // b: query rows of the block are [b*B, min((b+1)*B, T))
  std::int32_t shard = 0;   // h (ulysses: the CP rank whose head group this is)
  std::int32_t piece = 0;   // tap-split: index of this piece within (slot, block, shard); else 0
  std::int64_t begin = 0;   // query rows: packed positions [begin, end) of the slot
  std::int64_t end = 0;
  HeadRange heads;          // query heads of the shard
  HeadRange kv_heads;       // KV heads those query heads use
  std::int64_t flops = 0;   // f_t = heads.size() * causal pairs of the rows
  std::int32_t home = 0;    // q(t): worker holding the rows' Q and receiving O
  std::int32_t worker = 0;  // sigma(t): worker computing the tile
  std::int32_t fragment_begin = 0;  // the tile's fragments: Plan::fragments()[fragment_begin, fragment_end)
  std::int32_t fragment_end = 0;
};

// The part of a tile that lies inside one sample: what one varlen-attention
// call computes. Queries are the sample-local rows [a, e) (packed positions
// sample_start + a ..), keys the sample-local positions [key_begin, e)
// (key_begin = 0 for full causal, max(0, a - window + 1) with a window);
// query head i attends with KV head i / (h_q / h_kv).
struct Fragment {
  std::int32_t tile = 0;
  std::int32_t slot = 0;
  std::int32_t sample = 0;        // j, index in the slot's packed sequence
  std::int32_t group = 0;         // index in Plan::groups(): where the worker finds the sample's K/V
  std::int64_t sample_start = 0;  // o_j, packed position of the sample's first token
  std::int64_t sample_length = 0; // l_j
  std::int64_t a = 0, e = 0;      // sample-local query rows
  std::int64_t key_begin = 0;     // sample-local first key any of the rows attends to
};

// A KV dedup unit: the K/V of one sample for a range of KV heads. A worker
// that computes any fragment of the group holds the whole sample's K/V for
// those heads (fetched once, contract sections 6.1 and 7).
struct KvGroup {
  std::int32_t slot = 0;
  std::int32_t sample = 0;
  std::int32_t key = 0;      // dedup key: the head shard (contract) or the first KV head (dedup_per_kv_head)
  HeadRange kv_heads;
  std::int64_t begin = 0;    // packed token range of the sample
  std::int64_t end = 0;
};

enum class TransferKind : std::uint8_t { kQ = 0, kKv = 1, kO = 2 };

// One contiguous message payload: token range x head range of one slot.
// Q:  rows of a tile, query heads, home -> worker (backward: dO the same way).
// KV: tokens of a sample, KV heads (K and V), resident worker -> worker that
//     committed the group. Backward runs it in reverse: dst sends the dK/dV
//     partial sums of the same range and heads back to src, which adds them.
// O:  rows of a tile, query heads, worker -> home (backward: dQ the same way).
struct Transfer {
  TransferKind kind = TransferKind::kQ;
  std::int32_t src = 0;
  std::int32_t dst = 0;
  std::int32_t slot = 0;
  std::int64_t begin = 0;    // packed token range in the slot
  std::int64_t end = 0;
  HeadRange heads;           // query heads (Q, O) or KV heads (KV)
  std::int32_t tile = -1;    // Q/O: the tile; KV: -1
  std::int32_t group = -1;   // KV: the group; Q/O: -1
  std::int64_t bytes = 0;    // tokens x heads x head_dim x elem_bytes (x 2 for KV)
  // Pipeline chunks in which dst reads the payload. Chunk lists
  // (chunk_transfers): Q/O items first = last = their chunk m; a KV item
  // arrives with the chunk of its first use (first_use == m, always) and its
  // dK/dV partial is complete after last_use (Plan::kv_use of its heads).
  // Whole-iteration lists (transfers): 0 and M - 1.
  std::int32_t first_use = 0;
  std::int32_t last_use = 0;
};

// The chunks in which a worker's tiles read one KV head of one group:
// [first, last]; last < first when they never do.
struct ChunkUse {
  std::int32_t first = 0;
  std::int32_t last = -1;
  bool used() const { return last >= first; }
};

// The newest plan file format this libra reads and writes. Version 2 is
// version 1 plus the home layout; version 3 is version 2 plus kv_prefix;
// version 4 is version 3 plus chunk_split (written only when tapered). A
// plan is written in the oldest version that holds it, so a plan with the
// default contiguous layout and no KV prefix is version 1, byte for byte
// what earlier libra wrote (same fingerprint, readable by older readers).
// docs/plan-format.md.
// Version 5 is version 4 plus the topology, for a plan of a mode other
// than tap-topo (whose plans always store it) on a topology other than the
// default one (relays and bytes by tier follow it).
inline constexpr std::uint32_t kPlanFormatVersion = 5;
[[nodiscard]] constexpr std::uint32_t plan_format_version(const PlanConfig& c) {
  if (c.mode != PlanMode::kTapTopo && !(c.topology == PlanTopology{})) return 5U;
  if (c.chunk_split != ChunkSplit::kEqual) return 4U;
  if (c.kv_prefix) return 3U;
  return c.home_layout == HomeLayout::kContiguous ? 1U : 2U;
}

// Whether a plan's canonical words, files and fingerprint hold its
// topology: tap-topo plans always, others from version 5 on.
[[nodiscard]] constexpr bool plan_stores_topology(const PlanConfig& c) {
  return c.mode == PlanMode::kTapTopo || plan_format_version(c) >= 5;
}

// A half-open range of packed token positions of one slot.
struct TokenSpan {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  friend bool operator==(const TokenSpan&, const TokenSpan&) = default;
};

// The immutable result of planning one pool. Copies share the same data.
// Every list is in a fixed, documented order so that all ranks that build or
// load the same plan see the same bytes (check with fingerprint()). The
// exchange (transfers, chunk lists, byte matrices, bytes by tier, comm_bytes)
// is derived by the first call to any of its accessors, once per plan and
// safely from concurrent threads; make_plan itself does not build it.
class Plan {
 public:
  struct Data;  // defined in src/tiles; opaque to users
  Plan() = delete;
  explicit Plan(std::shared_ptr<const Data> data) : d_(std::move(data)) {}

  const PlanConfig& config() const;
  int pool_size() const;    // P
  int num_workers() const;  // W = P * cp
  int head_width() const;   // query heads per tile: h_q/H (ulysses: h_q/cp)
  std::span<const PackedSequence> pool() const;

  // Tiles ordered by id: (slot, block, shard, piece) lexicographic.
  std::span<const Tile> tiles() const;
  std::span<const Fragment> fragments() const;  // grouped by tile, in sample order
  std::span<const KvGroup> groups() const;      // by (slot, sample, key)

  // Compute list of worker r: ids of its tiles, increasing.
  std::span<const std::int32_t> worker_tiles(int r) const;
  // C_r: ids of the groups worker r holds, increasing (local or fetched).
  std::span<const std::int32_t> worker_groups(int r) const;
  // The chunks in which worker r's tiles read KV head k of group g (through
  // the chunk's query heads i with i / (h_q / h_kv) = k), recorded when the
  // plan is built: the exchange sends each KV head with the chunk of its
  // first use, and its dK/dV may go home after its last. Never used (for a
  // group r does not hold, or a head outside the group): !used().
  ChunkUse kv_use(int r, std::int32_t group, std::int32_t kv_head) const;
  // The tokens of group g's sample whose K/V worker r holds: the whole
  // sample [g.begin, g.end), or with PlanConfig::kv_prefix the causal prefix
  // [g.begin, sample start + the largest e of r's fragments of g). Every KV
  // transfer item to r lies inside it. Empty when r does not hold g.
  TokenSpan kv_span(int r, std::int32_t group) const;

  std::span<const std::int64_t> worker_flops() const;  // load_r
  double imbalance() const;                            // max_r load_r / mean_r load_r - 1
  std::int64_t comm_bytes() const;                     // total exchanged bytes (contract 7)
  // W x W, row-major [src * W + dst]; the diagonal is 0.
  std::span<const std::int64_t> byte_matrix() const;
  std::int64_t bytes(int src, int dst) const;
  std::int64_t send_bytes(int r) const;  // row sum
  std::int64_t recv_bytes(int r) const;  // column sum
  // Per worker, by tier (PlanConfig::topology).
  std::span<const TierBytes> tier_bytes() const;
  // The worker that receives the most bytes (lowest id on ties), and the
  // largest cross-node bytes any worker receives.
  int busiest_receiver() const;
  std::int64_t max_recv_cross_node() const;

  // Transfers from src to dst, ready for an all-to-all-v: Q items by tile
  // id, then KV items by (group id, begin), then O items by tile id. Their
  // bytes sum to bytes(src, dst).
  std::span<const Transfer> transfers(int src, int dst) const;
  std::span<const Transfer> all_transfers() const;  // ordered by (src, dst), then as above

  // Pipeline chunks (contract section 8), m in [0, chunks).
  // Query heads of chunk m of a tile: heads.begin + [chunk_head_offset(m),
  // chunk_head_offset(m + 1)) for w = head_width() (equal: [m*w/M, (m+1)*w/M)).
  HeadRange chunk_heads(const Tile& tile, int m) const;
  // KV heads that arrive with chunk m of a group fetched for a tile of this
  // head shard: those whose first using query head lies in chunk m.
  HeadRange chunk_kv_heads(HeadRange shard_heads, HeadRange kv_heads, int m) const;
  // Chunk m's transfers from src to dst: the items of transfers(src, dst)
  // restricted to chunk m's heads, in the same order; KV items with no KV
  // head in chunk m are left out.
  std::span<const Transfer> chunk_transfers(int m, int src, int dst) const;
  // Chunk m's bytes from src to dst.
  std::int64_t chunk_bytes(int m, int src, int dst) const;

  // Stable 64-bit hash of the plan's defining content (format version,
  // config, pool, every tile with its placement); everything else is a
  // deterministic function of it. Identical across runs and machines.
  std::uint64_t fingerprint() const;

  // Everything the plan holds, its exchange derived (as by the first
  // exchange accessor).
  const Data& data() const;
  // The same without deriving the exchange: its fields may be unset (for
  // src/tiles' own readers that need only what build_plan made).
  const Data& data_as_built() const;

 private:
  std::shared_ptr<const Data> d_;
};

// Plans one pool: pool.size() = P slots, each a packed sequence of at most
// seq_len tokens. Pure and deterministic.
[[nodiscard]] Result<Plan> make_plan(std::span<const PackedSequence> pool, const PlanConfig& config);
// The same tiles on the same workers with `chunks` pipeline chunks (M only
// splits each tile's heads into chunks; no mode's placement reads it), so
// rechunk_plan(make_plan(pool, c), m) equals make_plan(pool, c with chunks m),
// fingerprint and all, without placing again. Errors: as make_plan's for the
// new config (m must divide the heads of a tile; tapered: 3 <= m <= them).
[[nodiscard]] Result<Plan> rechunk_plan(const Plan& plan, int chunks);
// The same with the chunks cut by `split` (the plan's own cut above).
[[nodiscard]] Result<Plan> rechunk_plan(const Plan& plan, int chunks, ChunkSplit split);

// Plan files. JSON (for people) holds the config, the pool, every tile with
// its placement and the summaries (worker_flops, imbalance, comm_bytes,
// byte_matrix); the binary form (for programs) holds the defining content
// only. Both carry kPlanFormatVersion and the fingerprint; loading
// re-derives the exchange and chunks, and rejects a file of another version,
// an inconsistent tile set, summaries that disagree with the tiles, or a
// fingerprint that does not match the content.
enum class PlanFileFormat { kJson, kBinary };

[[nodiscard]] std::string plan_to_json(const Plan& plan, int indent = 1);
[[nodiscard]] std::string plan_to_binary(const Plan& plan);
// `source` names the input in error messages.
[[nodiscard]] Result<Plan> plan_from_json(std::string_view text, const std::string& source = "plan");
[[nodiscard]] Result<Plan> plan_from_binary(std::string_view bytes, const std::string& source = "plan");

// Format from the extension: ".json" -> JSON, anything else binary.
[[nodiscard]] PlanFileFormat plan_format_for_path(const std::string& path);
// Written with write_file_atomic.
[[nodiscard]] Status save_plan(const Plan& plan, const std::string& path);
[[nodiscard]] Status save_plan(const Plan& plan, const std::string& path, PlanFileFormat format);
// Format detected from the content (binary magic "LIBRAPLN" or JSON).
[[nodiscard]] Result<Plan> load_plan(const std::string& path);

}  // namespace libra
