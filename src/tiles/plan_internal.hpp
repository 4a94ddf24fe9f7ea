// Internal to the tiles stage: the Plan's data, the pool geometry shared by
// the placers and the plan builder, and the canonical encoding behind the
// fingerprint and the binary file.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>
#include <span>
#include <string>
#include <vector>

#include "libra/plan.hpp"

namespace libra {

namespace detail {
// Items written once each, in any order, right after allocation: unlike a
// vector, nothing value-initialises the megabytes about to be overwritten.
// T is an implicit-lifetime type (an aggregate of scalars), so its fields may
// also be assigned one by one; every field of every item before it is read.
// share() hands out the same items without copying them (a re-chunked plan
// reads its base plan's tiles): only for arrays no longer written.
template <class T>
class RawArray {
 public:
  RawArray() = default;
  explicit RawArray(std::size_t n) : size_(n) {
    T* items = static_cast<T*>(std::malloc((n > 0 ? n : 1) * sizeof(T)));
    if (!items) throw std::bad_alloc();
    items_ = std::shared_ptr<T>(items, Free{});
  }
  // Moved, or shared on purpose (share()): never copied by accident.
  RawArray(const RawArray&) = delete;
  RawArray& operator=(const RawArray&) = delete;
  RawArray(RawArray&&) noexcept = default;
  RawArray& operator=(RawArray&&) noexcept = default;
  ~RawArray() = default;
  RawArray share() const {
    RawArray out;
    out.items_ = items_;
    out.size_ = size_;
    return out;
  }
  // Every index in [0, size) exactly once before the items are read.
  void put(std::size_t i, const T& x) { ::new (static_cast<void*>(items_.get() + i)) T(x); }
  T& operator[](std::size_t i) { return items_.get()[i]; }
  const T& operator[](std::size_t i) const { return items_.get()[i]; }
  T* data() { return items_.get(); }
  const T* data() const { return items_.get(); }
  std::size_t size() const { return size_; }
  // Keeps the first n items (n <= size()); the storage is not given back.
  void truncate(std::size_t n) { size_ = n < size_ ? n : size_; }
  const T* begin() const { return items_.get(); }
  const T* end() const { return items_.get() + size_; }
  operator std::span<const T>() const { return {items_.get(), size_}; }

 private:
  static_assert(std::is_trivially_destructible_v<T> && std::is_trivially_copyable_v<T>);
  struct Free {
    void operator()(T* p) const noexcept { std::free(p); }
  };
  std::shared_ptr<T> items_;
  std::size_t size_ = 0;
};
using TransferArray = RawArray<Transfer>;
struct Geometry;
}  // namespace detail

struct Plan::Data {
  PlanConfig config;
  std::vector<PackedSequence> pool;
  int pool_size = 0;
  int num_workers = 0;
  int head_width = 0;
  detail::RawArray<Tile> tiles;
  // The fragments of the first tile of every run of consecutive tiles with
  // the same rows (a block's S shards read the same samples): each tile's
  // own (Plan::fragments, its tile id and groups) are spelled out from them
  // on first use (detail::spell_fragments, under fragments_once), as the
  // simulator reads none of them. Readers inside src/tiles walk these
  // (detail::for_each_tile_fragments).
  detail::RawArray<Fragment> row_fragments;
  mutable std::once_flag fragments_once;
  mutable detail::RawArray<Fragment> fragments;
  detail::RawArray<KvGroup> groups;
  std::vector<std::size_t> worker_tile_offsets;  // W + 1
  // Listed on first use (Plan::worker_tiles: detail::list_worker_tiles,
  // under worker_tiles_once): the simulator reads none of them.
  mutable std::once_flag worker_tiles_once;
  mutable detail::RawArray<std::int32_t> worker_tile_ids;
  std::vector<std::size_t> worker_group_offsets;  // W + 1
  detail::RawArray<std::int32_t> worker_group_ids;
  // The chunks that read each KV head of each entry of worker_group_ids
  // (Plan::kv_use), in head order: with kv_uses_by_key, every entry of a
  // group of dedup key k reads as its key's table, kv_uses[k * kv_use_stride
  // ..] (each key is one shard's, so the uses depend on the key alone);
  // otherwise entry i's own, from kv_uses[kv_use_offsets[i]].
  bool kv_uses_by_key = true;
  std::int32_t kv_use_stride = 0;
  std::vector<std::size_t> kv_use_offsets;
  std::vector<ChunkUse> kv_uses;
  // With kv_prefix, per entry of worker_group_ids: the end of the causal
  // prefix the worker holds (Plan::kv_span); without, empty (the whole sample).
  detail::RawArray<std::int64_t> kv_span_end;
  // Without kv_uses_by_key and with at most 64 shards, per entry of
  // worker_group_ids: the shards whose tiles read it (bit s), so that a
  // re-chunking merges their tables without walking the fragments again.
  detail::RawArray<std::uint64_t> entry_shards;
  const ChunkUse* uses_of(std::size_t entry, std::int32_t key) const {
    return kv_uses_by_key ? kv_uses.data() + static_cast<std::size_t>(key) * static_cast<std::size_t>(kv_use_stride)
                          : kv_uses.data() + kv_use_offsets[entry];
  }
  std::int64_t span_end(std::size_t entry, std::int32_t group) const {
    return config.kv_prefix ? kv_span_end[entry] : groups[static_cast<std::size_t>(group)].end;
  }
  std::vector<std::int64_t> worker_flops;
  double imbalance = 0;
  // The exchange (builder sections 6 and 7b) is derived from the fields
  // above and `geometry` on first use: Plan's exchange accessors call
  // detail::derive_exchange once, under exchange_once, so make_plan does not
  // pay for megabytes of transfer lists a caller may never read, and plans
  // shared across threads derive it once. Mutable: written once, before
  // exchange_ready is set, and only read after.
  std::shared_ptr<const detail::Geometry> geometry;
  mutable std::once_flag exchange_once;
  mutable std::atomic<bool> exchange_ready{false};
  mutable std::int64_t comm_bytes = 0;
  mutable std::vector<std::int64_t> byte_matrix;          // W * W
  mutable std::vector<Transfer> transfers;
  mutable std::vector<std::size_t> transfer_offsets;      // W * W + 1, bucket src * W + dst
  mutable detail::TransferArray chunk_transfers;
  mutable std::vector<std::size_t> chunk_offsets;         // M * W * W + 1, bucket (m * W + src) * W + dst
  mutable std::vector<std::int64_t> chunk_byte_matrix;    // M * W * W
  mutable std::vector<TierBytes> tier_bytes;              // W
  mutable int busiest_receiver = 0;
  mutable std::int64_t max_recv_cross_node = 0;
  // The fingerprint is hashed on first use (Plan::fingerprint), under
  // fingerprint_once: the simulator builds and prices ~150,000 plans a run
  // and reads none of their fingerprints.
  mutable std::once_flag fingerprint_once;
  mutable std::uint64_t fingerprint = 0;
};

namespace detail {

// Plain-causal pairs of the sample-local rows [a, e): (a + 1) + ... + e,
// unchecked, for counts the caller knows to be in range (causal_pairs
// checks). n and s have opposite parity, so one of them halves exactly.
inline std::int64_t plain_causal_pairs(std::int64_t a, std::int64_t e) {
  const std::int64_t n = e - a, s = e + a + 1;
  return n % 2 == 0 ? n / 2 * s : s / 2 * n;
}

// Everything the placers and the builder derive from (pool, config) once.
struct Geometry {
  int pool_size = 0;    // P
  int cp = 0;
  int workers = 0;      // W
  int shards = 0;       // S: head shards of a block (H; ulysses: cp)
  int head_width = 0;   // query heads per tile, h_q / S
  int group_size = 0;   // query heads per KV head, h_q / h_kv
  int heads_kv = 0;
  int keys_per_sample = 0;  // dedup keys per sample
  bool dedup_per_kv_head = false;
  std::int64_t seq_len = 0;
  std::int64_t shard_len = 0;  // L / cp: tokens resident per worker
  HomeMap map{1, 1, HomeLayout::kContiguous};  // which worker holds which rows
  std::int64_t block_size = 0;
  std::int64_t head_dim = 0;
  std::int64_t elem_bytes = 0;
  std::int64_t window = 0;
  std::vector<std::int64_t> tokens;       // T_p
  std::vector<std::int32_t> sample_base;  // P + 1: global index of slot p's first sample
  std::vector<std::int64_t> starts;       // per global sample: o_j in its slot
  std::vector<std::int64_t> lengths;      // per global sample: l_j
  std::vector<std::int64_t> whole_pairs;  // per global sample: causal pairs of all its rows
  // Every sample's tokens by home run (one run per CP rank in the
  // contiguous layout; zigzag may give a rank two): the placers and the
  // builder read them instead of locating rows one by one.
  struct Run {
    std::int64_t begin, end;  // packed rows
    std::int32_t rank;        // CP rank holding them (worker p * cp + rank)
  };
  std::vector<Run> runs;
  std::vector<std::int32_t> run_base;  // per global sample + 1: its first run
  // The sample holding the first row of every block (global index), found
  // once: block b of slot p is entry block_base[p] + b.
  std::vector<std::int32_t> block_base;  // P + 1
  std::vector<std::int32_t> block_first;
  std::int32_t block_sample(int p, std::int32_t b) const {
    return block_first[static_cast<std::size_t>(block_base[static_cast<std::size_t>(p)] + b)];
  }
  std::span<const Run> sample_runs(std::int32_t j) const {
    const std::int32_t* at = run_base.data() + j;
    return {runs.data() + at[0], static_cast<std::size_t>(at[1] - at[0])};
  }

  HeadRange shard_heads(int s) const { return {s * head_width, (s + 1) * head_width}; }
  HeadRange shard_kv_heads(int s) const {
    return {s * head_width / group_size, ((s + 1) * head_width - 1) / group_size + 1};
  }
  // Dense index of the dedup key of shard s of a sample: the shard, or with
  // dedup_per_kv_head the shard's KV head range (several shards share one
  // when S > h_kv).
  int key_index(int s) const {
    return (dedup_per_kv_head && shards > heads_kv) ? shard_kv_heads(s).begin : s;
  }
  std::int32_t group_id(std::int32_t global_sample, int s) const {
    return global_sample * keys_per_sample + key_index(s);
  }
  std::int64_t kv_bytes_per_token(int s) const {
    return 2 * static_cast<std::int64_t>(shard_kv_heads(s).size()) * head_dim * elem_bytes;
  }
  std::int64_t qo_bytes_per_row() const { return head_width * head_dim * elem_bytes; }
  // Worker holding row `row` of slot p (a tile's Q home: its first row's).
  std::int32_t home(int p, std::int64_t row) const {
    return static_cast<std::int32_t>(p * cp + map.locate(row).rank);
  }
  // Tokens of [o, o + l) in slot p that reside on worker r.
  std::int64_t local_tokens(int r, int p, std::int64_t o, std::int64_t l) const {
    if (r / cp != p) return 0;
    std::int64_t n = 0;
    for (std::int64_t x = o; x < o + l;) {
      const HomeSpot h = map.locate(x);
      const std::int64_t y = h.run_end < o + l ? h.run_end : o + l;
      if (h.rank == r % cp) n += y - x;
      x = y;
    }
    return n;
  }
  std::int32_t blocks(int p) const {
    return static_cast<std::int32_t>((tokens[p] + block_size - 1) / block_size);
  }
  // Global index of the sample holding row x of slot p (x < T_p).
  std::int32_t sample_at(int p, std::int64_t x) const;
  // Integer FLOPs (heads x causal pairs) of rows [begin, end) of slot p;
  // `first` is sample_at(p, begin).
  std::int64_t rows_flops(int p, std::int64_t begin, std::int64_t end) const {
    return rows_flops(p, begin, end, sample_at(p, begin));
  }
  std::int64_t rows_flops(int p, std::int64_t begin, std::int64_t end, std::int32_t first) const;
  // Causal pairs of the sample-local rows [a, e) of global sample j: most
  // pieces are whole samples, whose count make_geometry kept.
  std::int64_t pairs(std::int32_t j, std::int64_t a, std::int64_t e) const {
    if (a == 0 && e == lengths[static_cast<std::size_t>(j)]) return whole_pairs[static_cast<std::size_t>(j)];
    // No more than the whole sample's count, which make_geometry found in range.
    if (window == kFullCausal) return plain_causal_pairs(a, e);
    return causal_pairs(a, e, window).value();
  }
};

// Validates the configuration and the pool and derives the geometry.
[[nodiscard]] Result<Geometry> make_geometry(std::span<const PackedSequence> pool, const PlanConfig& config);

// Query rows [begin, end) of block `block`, shard `shard` of slot `slot`,
// computed on `worker`: the input the builder turns into a Plan.
struct PlacedRows {
  std::int32_t slot = 0;
  std::int32_t block = 0;
  std::int32_t shard = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int32_t worker = 0;
};

// Tile placement per mode: one PlacedRows per tile (piece), in
// (slot, block, shard, begin) order.
[[nodiscard]] Result<std::vector<PlacedRows>> place_tiles(const Geometry& geo, const PlanConfig& config);

// The contract's soft target C: (1 + tau) times the mean load of `total`
// FLOPs over `workers` (section 6; tap-split keeps TAP where it meets C).
inline double tap_capacity(std::int64_t total, int workers, double tau) {
  return (1.0 + tau) * static_cast<double>(total) / static_cast<double>(workers);
}

// Whether make_plan(pool, config) gives the tiles of `tap` (a kTap plan) on
// the same workers with the same exchange, so that one plan and its prices
// serve both: the same pool, every setting plain TAP and the builder read
// the same (a dedup_per_kv_head that merges no shards and renames no KV key
// reads as off), and config asks for tap, or for tap-split where tap's
// placement meets C (tap-split then keeps it: place_tiles). The plans
// differ only in their config words (the fingerprint).
//   if (detail::same_tap_plan(tap_plan, pool, plus_config)) price tap_plan for both;
[[nodiscard]] bool same_tap_plan(const Plan& tap, std::span<const PackedSequence> pool, const PlanConfig& config);
// The settings part of same_tap_plan, before any plan is made: whether
// config (tap or tap-split) can make the plan `tap_config` (tap) makes of
// the same pool.
[[nodiscard]] bool same_tap_inputs(const PlanConfig& tap_config, const PlanConfig& config);

// Plain TAP's placement one tile at a time, in TAP's order (tiles.cpp),
// so that tap-topo can stop it once it cannot win:
//   std::int32_t tile; int worker;
//   while (steps.next(tile, worker)) ...  // tile: a base tile id
class TapSteps {
 public:
  virtual ~TapSteps() = default;
  // Places the next tile; false when every tile is placed.
  virtual bool next(std::int32_t& tile, int& worker) = 0;
};

// tap-topo's placer (topo.cpp): the tiles `base` (one per (slot, block,
// shard), flops beside) placed within the contract's capacity C where it
// can, least slowest-worker transfer time on config.topology.
// `tap` places the same tiles by plain TAP, the last candidate; it is
// stepped only as far as that candidate can still win.
[[nodiscard]] std::vector<PlacedRows> place_topo(const Geometry& geo, const PlanConfig& config,
                                                 std::span<const PlacedRows> base,
                                                 std::span<const std::int64_t> flops, double capacity,
                                                 TapSteps& tap);
// Whether place_topo's later candidates stop once they cannot win (true;
// the tests compare against every candidate run to its end).
extern std::atomic<bool> topo_stops_early;
// Whether candidate B starts from candidate A's home pass where the byte
// sums are exact, redoing only the homes that keep other tiles (true; the
// tests compare against every candidate made from scratch).
extern std::atomic<bool> topo_shares_home_pass;
// Tier of the link between workers a and b: 0 same node, 1 same supernode, 2 across.
inline int topo_tier(const PlanTopology& t, int a, int b) {
  const int na = a / t.gpus_per_node, nb = b / t.gpus_per_node;
  if (na == nb) return 0;
  return na / t.nodes_per_supernode == nb / t.nodes_per_supernode ? 1 : 2;
}

// (slot, block, shard, begin) order, and sorting rows into it.
inline bool rows_before(const PlacedRows& a, const PlacedRows& b) {
  if (a.slot != b.slot) return a.slot < b.slot;
  if (a.block != b.block) return a.block < b.block;
  if (a.shard != b.shard) return a.shard < b.shard;
  return a.begin < b.begin;
}
void sort_rows(std::vector<PlacedRows>& rows);
// Checks that `rows` name existing tiles and workers and cut every (slot,
// block, shard) into consecutive pieces covering the block exactly, sorting
// them on the way: what build_plan needs of rows from outside (a plan
// file). `source` names the input in error messages.
[[nodiscard]] Status check_rows(const Geometry& geo, std::vector<PlacedRows>& rows, const std::string& source);
// Derives the plan from rows that check_rows accepts, in its order (the
// exchange on first use: derive_exchange). The plan keeps `geo` (so callers
// move it in).
[[nodiscard]] Plan build_plan(std::span<const PackedSequence> pool, const PlanConfig& config, Geometry geo,
                              std::span<const PlacedRows> rows);

// Every tile of `d` in order with the fragments of its rows' run
// (Plan::Data::row_fragments): the tile's own but for their tile id and, for
// another shard, their groups (shifted by the difference of the keys).
//   for_each_tile_fragments(d, [&](const Tile& t, const Fragment* f) { ... f[0 .. n) ... });
template <class Visit>
void for_each_tile_fragments(const Plan::Data& d, Visit&& visit) {
  const Fragment* at = d.row_fragments.data();
  const Tile* prev = nullptr;
  for (const Tile& t : d.tiles) {
    // build_plan's rule: a tile with its predecessor's rows copies its fragments.
    if (prev != nullptr && !(prev->slot == t.slot && prev->begin == t.begin && prev->end == t.end)) {
      at += prev->fragment_end - prev->fragment_begin;
    }
    visit(t, at);
    prev = &t;
  }
}
// Fills Plan::Data::worker_tile_ids from the tiles and the offsets;
// Plan::worker_tiles calls it once (Plan::Data::worker_tiles_once).
void list_worker_tiles(const Plan::Data& d);
// Fills Plan::Data::fragments from the row runs; Plan::fragments calls it
// once (Plan::Data::fragments_once).
void spell_fragments(const Plan::Data& d);

// Fills the exchange of a plan build_plan made; Plan's exchange accessors
// call it once (Plan::Data::exchange_once).
void derive_exchange(const Plan::Data& data);

// What the simulator prices of a plan's exchange, summed straight from the
// built plan: no transfer lists, so far cheaper than derive_exchange. Only
// the pairs that can carry anything are kept (a pool of 16 replicas touches
// 5-7% of its W x W pairs), per chunk m and pair j at [m * pairs.size() + j].
//   auto s = exchange_sums(plan.data_as_built());
//   // chunk m's Q bytes from worker a to b (pair j = s.find(a * W + b) >= 0):
//   //   s.qo_row_heads[m * s.pairs.size() + j] * s.head_dim * s.elem_bytes
struct ExchangeSums {
  int workers = 0, chunks = 1;
  std::int64_t head_dim = 0, elem_bytes = 0;
  // src * W + dst, increasing: either direction of a pair with a Q/O or K/V
  // item (the sums are zero off them); reverse[j]: the index of pair j's
  // (dst, src), which is always a pair too.
  std::vector<std::uint32_t> pairs, reverse;
  std::vector<std::uint32_t> src, dst;  // per pair: its workers (no division per use)
  // Tiles away from home, home -> worker: rows x the chunk's query heads
  // (their Q go there, their O come back the other way).
  std::vector<std::int64_t> qo_row_heads;
  // K/V items (Transfer, kind kKv): tokens x the chunk's KV heads.
  std::vector<std::int64_t> kv_token_heads;
  // dK/dV partials, worker -> source: the rows of each (worker, source,
  // first row, KV head) place once, in the chunk of its last use (the
  // longest rows and latest chunk of the groups that share it).
  std::vector<std::int64_t> dkv_rows;
  std::vector<std::int64_t> bytes;  // per pair: Plan::byte_matrix's entry
  // The index of pair src * W + dst, or -1 where nothing is exchanged.
  std::ptrdiff_t find(std::uint32_t pair) const;
  // One chunk's values of `per_pair` (qo_row_heads, ...; m = 0 for bytes)
  // as a dense W x W matrix [src * W + dst], zero off the pairs.
  std::vector<std::int64_t> dense(const std::vector<std::int64_t>& per_pair, int m) const;
};
[[nodiscard]] ExchangeSums exchange_sums(const Plan::Data& d);

// What of exchange_sums does not depend on the chunking: the pairs, their
// bytes and Q/O rows, and every K/V fetch (pair, rows, key, entry). Every
// chunking of the same tiles (rechunk_plan) has the same, so a pool's
// shapes sum their chunks from one (the sweep's PoolPrices).
//   const ExchangeLayout l = exchange_layout(base.data_as_built());
//   ExchangeSums s = exchange_sums(rechunked.data_as_built(), l);
struct ExchangeLayout {
  int workers = 0;
  std::size_t groups = 0, entries = 0;  // the plan's, to check a chunking against
  std::vector<std::uint32_t> pairs, reverse, src, dst;  // as ExchangeSums'
  std::vector<std::int64_t> bytes, qo_rows;   // per pair
  // One home run a worker fetches (pair from -> to, back to -> from) and its
  // fetches [first, last) of `fetches`: the groups that read rows of it.
  struct Run {
    std::uint32_t pair, back, first, last;
  };
  struct Fetch {
    std::int64_t rows;
    std::int32_t key;    // dedup key within the sample
    std::uint32_t entry;  // in worker_group_ids
  };
  std::vector<Run> runs;
  std::vector<Fetch> fetches;
  // Where a key's K/V chunk uses are the key's (Plan::Data::kv_uses_by_key)
  // and a sample has at most 64 keys, the fetches summed over what no
  // chunking changes: per (pair, key) with any, the rows fetched (pair by
  // pair); per (run, KV head its keys hold), the pair back, the keys of the
  // run's fetches that hold it (bit k) and their longest rows. exchange_sums
  // prices a chunking from these where each key's chunks hold all its KV
  // heads, else walks the fetches.
  bool by_key = false;
  struct KeyRows {
    std::uint32_t pair;
    std::int32_t key;
    std::int64_t rows;
  };
  struct DkvCell {
    std::uint32_t back;
    std::int32_t kv_head;
    std::uint64_t keys;
    std::int64_t rows;
  };
  std::vector<KeyRows> key_rows;
  std::vector<DkvCell> dkv_cells;
};
[[nodiscard]] ExchangeLayout exchange_layout(const Plan::Data& d);
// The sums of plan `d`, whose tiles and groups are the layout's (throws
// std::logic_error where its group counts differ). dkv false: dkv_rows is
// left empty (only the backward returns read it; a price with no backward
// part, PriceReuse::backward, has none to make).
[[nodiscard]] ExchangeSums exchange_sums(const Plan::Data& d, const ExchangeLayout& layout, bool dkv = true);

// The canonical little-endian 64-bit word encoding of a plan's defining
// content (config, pool, tiles with placement). The fingerprint hashes it and
// the binary file stores it.
[[nodiscard]] std::vector<std::uint64_t> canonical_words(const PlanConfig& config,
                                                         std::span<const PackedSequence> pool,
                                                         std::span<const Tile> tiles);
[[nodiscard]] std::uint64_t hash_words(std::span<const std::uint64_t> words);

}  // namespace detail
}  // namespace libra
