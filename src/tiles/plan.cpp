// The plan builder (tiles -> fragments, KV groups, exchange, chunks,
// fingerprint) and the Plan accessors.
#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "tiles/plan_internal.hpp"

namespace libra {

namespace detail {

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

constexpr std::uint64_t kMagicWord = 0x4e4c50415242494cULL;  // "LIBRAPLN" little-endian

// Q/O or KV bytes of `tokens` tokens of `heads` heads.
std::int64_t qo_bytes(const Geometry& g, std::int64_t tokens, std::int32_t heads) {
  return tokens * heads * g.head_dim * g.elem_bytes;
}
std::int64_t kv_bytes(const Geometry& g, std::int64_t tokens, std::int32_t heads) {
  return 2 * tokens * heads * g.head_dim * g.elem_bytes;
}

// std::popcount, inline: the portable build (no -mpopcnt) turns
// std::popcount into a call into libgcc, once per fragment here.
int bit_count(std::uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ULL;
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
}

// Sets bit `i` (>= 0) of a bitset.
void set_bit(std::uint64_t* bits, std::int32_t i) {
  const auto u = static_cast<std::uint32_t>(i);
  bits[u / 64] |= std::uint64_t{1} << (u % 64);
}

// Per dedup key k (the same for every sample): the key and KV heads of its
// groups, and the query heads of a shard that uses them (for the chunk rule).
struct KeyHeads {
  std::vector<KvGroup> group;
  std::vector<HeadRange> rep_shard_heads;
};
KeyHeads key_heads(const Geometry& g) {
  KeyHeads h{std::vector<KvGroup>(static_cast<std::size_t>(g.keys_per_sample)),
             std::vector<HeadRange>(static_cast<std::size_t>(g.keys_per_sample))};
  for (int k = 0; k < g.keys_per_sample; ++k) {
    KvGroup& grp = h.group[static_cast<std::size_t>(k)];
    if (g.dedup_per_kv_head && g.shards > g.heads_kv) {
      grp.key = k;
      grp.kv_heads = {k, k + 1};
      h.rep_shard_heads[static_cast<std::size_t>(k)] = g.shard_heads(k * g.group_size / g.head_width);
    } else {
      grp.key = g.dedup_per_kv_head ? g.shard_kv_heads(k).begin : k;
      grp.kv_heads = g.shard_kv_heads(k);
      h.rep_shard_heads[static_cast<std::size_t>(k)] = g.shard_heads(k);
    }
  }
  return h;
}

// Plan::chunk_kv_heads of a plan with this configuration.
HeadRange chunk_kv_heads_of(const PlanConfig& config, HeadRange shard_heads, HeadRange kv_heads, int m) {
  const std::int32_t group = config.shape.heads_q / config.shape.heads_kv;
  // A KV head travels with the chunk holding the first of its query heads
  // that lies in this shard.
  auto chunk_of = [&](std::int32_t k) {
    const std::int32_t at = std::max(k * group, shard_heads.begin) - shard_heads.begin;
    int c = 0;
    while (c + 1 < config.chunks &&
           chunk_head_offset(shard_heads.size(), config.chunks, config.chunk_split, c + 1) <= at) {
      ++c;
    }
    return c;
  };
  std::int32_t begin = kv_heads.end, end = kv_heads.end;
  for (std::int32_t k = kv_heads.begin; k < kv_heads.end; ++k) {
    const std::int32_t c = chunk_of(k);
    if (c == m && begin == kv_heads.end) begin = k;
    if (c > m) {
      end = k;
      break;
    }
  }
  if (begin == kv_heads.end) return {kv_heads.end, kv_heads.end};
  return {begin, end};
}

std::string tile_name(const PlacedRows& r) {
  return "tile (slot " + str(r.slot) + ", block " + str(r.block) + ", shard " + str(r.shard) + ")";
}

}  // namespace

namespace {

// The canonical words in order, each handed to `put`: the binary file
// stores them and the fingerprint hashes them as they come. The prefix is
// everything before the tiles' words, which follow four per tile.
template <class Put>
void for_each_canonical_prefix_word(const PlanConfig& c, std::span<const PackedSequence> pool, std::size_t tiles,
                                    Put&& put) {
  auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  put(kMagicWord);
  put(plan_format_version(c));
  put(u(c.seq_len));
  put(u(c.cp));
  put(u(c.block_size));
  put(u(c.head_shards));
  put(u(c.shape.heads_q));
  put(u(c.shape.heads_kv));
  put(u(c.shape.head_dim));
  put(dtype_code(c.shape.dtype));
  put(u(c.shape.window));
  put(std::bit_cast<std::uint64_t>(c.tau));
  put(u(c.chunks));
  put(static_cast<std::uint64_t>(c.mode));
  put(c.dedup_per_kv_head ? 1U : 0U);
  if (plan_format_version(c) >= 2) put(static_cast<std::uint64_t>(c.home_layout));
  if (plan_format_version(c) >= 3) put(c.kv_prefix ? 1U : 0U);
  if (plan_format_version(c) >= 4) put(static_cast<std::uint64_t>(c.chunk_split));
  if (plan_stores_topology(c)) {
    // tap-topo places by the topology and every other mode relays and
    // reports bytes by it, so a plan with a topology of its own hashes it;
    // a plan of another mode on the default topology keeps the words (and
    // fingerprint) it always had.
    put(u(c.topology.gpus_per_node));
    put(u(c.topology.nodes_per_supernode));
    put(std::bit_cast<std::uint64_t>(c.topology.intra_node_gbps));
    put(std::bit_cast<std::uint64_t>(c.topology.inter_node_gbps));
    put(std::bit_cast<std::uint64_t>(c.topology.inter_supernode_gbps));
    put(std::bit_cast<std::uint64_t>(c.topology.congestion_per_node));
  }
  put(pool.size());
  for (const PackedSequence& s : pool) {
    put(s.size());
    for (std::int64_t l : s) put(u(l));
  }
  put(tiles);
}
template <class Put>
void put_tile_words(std::int32_t slot, std::int32_t block, std::int32_t shard, std::int32_t worker,
                    std::int64_t begin, std::int64_t end, Put&& put) {
  auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  put(u(slot) << 32 | u(block));
  put(u(shard) << 32 | u(worker));
  put(u(begin));
  put(u(end));
}
template <class Put>
void for_each_canonical_word(const PlanConfig& c, std::span<const PackedSequence> pool,
                             std::span<const Tile> tiles, Put&& put) {
  for_each_canonical_prefix_word(c, pool, tiles.size(), put);
  for (const Tile& t : tiles) put_tile_words(t.slot, t.block, t.shard, t.worker, t.begin, t.end, put);
}

// FNV-1a over 64-bit words with a shift after each multiply so that high
// input bits reach the low output bits; splitmix64's finaliser at the end.
class WordHash {
 public:
  void operator()(std::uint64_t x) {
    h_ ^= x;
    h_ *= 0x100000001b3ULL;
    h_ ^= h_ >> 29;
  }
  std::uint64_t value() const {
    std::uint64_t h = h_;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return h;
  }

 private:
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

}  // namespace

std::vector<std::uint64_t> canonical_words(const PlanConfig& c, std::span<const PackedSequence> pool,
                                           std::span<const Tile> tiles) {
  std::vector<std::uint64_t> w;
  std::size_t samples = 0;
  for (const PackedSequence& s : pool) samples += s.size();
  w.reserve(24 + pool.size() + samples + 4 * tiles.size());
  for_each_canonical_word(c, pool, tiles, [&](std::uint64_t x) { w.push_back(x); });
  return w;
}

std::uint64_t hash_words(std::span<const std::uint64_t> words) {
  WordHash h;
  for (std::uint64_t x : words) h(x);
  return h.value();
}

void sort_rows(std::vector<PlacedRows>& rows) {
  if (!std::is_sorted(rows.begin(), rows.end(), rows_before)) std::sort(rows.begin(), rows.end(), rows_before);
}

Status check_rows(const Geometry& g, std::vector<PlacedRows>& rows, const std::string& source) {
  const int W = g.workers;
  std::vector<std::int32_t> slot_blocks(static_cast<std::size_t>(g.pool_size));
  for (int p = 0; p < g.pool_size; ++p) slot_blocks[static_cast<std::size_t>(p)] = g.blocks(p);
  for (const PlacedRows& r : rows) {
    if (r.slot < 0 || r.slot >= g.pool_size || r.shard < 0 || r.shard >= g.shards || r.block < 0 ||
        r.block >= slot_blocks[static_cast<std::size_t>(r.slot)]) {
      return invalid_input(source + ": tile (slot " + str(r.slot) + ", block " + str(r.block) + ", shard " +
                           str(r.shard) + ") does not exist for this pool and configuration");
    }
    if (r.worker < 0 || r.worker >= W) {
      return invalid_input(source + ": " + tile_name(r) + ": worker " + str(r.worker) + " is not in [0, " +
                           str(W) + ")");
    }
  }
  sort_rows(rows);
  std::size_t i = 0;
  for (int p = 0; p < g.pool_size; ++p) {
    for (std::int32_t b = 0; b < slot_blocks[static_cast<std::size_t>(p)]; ++b) {
      const std::int64_t bb = b * g.block_size;
      const std::int64_t be = std::min(bb + g.block_size, g.tokens[static_cast<std::size_t>(p)]);
      for (int s = 0; s < g.shards; ++s) {
        const PlacedRows want{p, b, s, bb, be, 0};
        std::int64_t at = bb;
        while (i < rows.size() && rows[i].slot == p && rows[i].block == b && rows[i].shard == s) {
          if (rows[i].begin != at || rows[i].end <= rows[i].begin || rows[i].end > be) {
            return invalid_input(source + ": " + tile_name(want) + ": piece rows [" + str(rows[i].begin) + ", " +
                                 str(rows[i].end) + ") do not continue the block's rows [" + str(bb) + ", " +
                                 str(be) + ") at " + str(at));
          }
          at = rows[i].end;
          ++i;
        }
        if (at != be) {
          return invalid_input(source + ": " + tile_name(want) + ": rows [" + str(at) + ", " + str(be) +
                               ") are not covered by any tile");
        }
      }
    }
  }
  if (rows.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max() / 2)) {
    return invalid_input(source + ": too many tiles");
  }
  return {};
}

namespace {

// Per head shard: its query heads, its KV heads and its dedup key.
struct ShardInfo {
  HeadRange heads, kv_heads;
  std::int32_t key = 0;
};

std::vector<ShardInfo> shard_infos(const Geometry& g) {
  std::vector<ShardInfo> shards(static_cast<std::size_t>(g.shards));
  for (int s = 0; s < g.shards; ++s) shards[static_cast<std::size_t>(s)] = {g.shard_heads(s), g.shard_kv_heads(s), g.key_index(s)};
  return shards;
}

// C_r as a worker-major bitset over the groups, set while the fragments
// are written and read back in bit order (read_group_lists).
struct HeldBits {
  std::size_t words = 0;  // per worker
  std::vector<std::uint64_t> bits;
  HeldBits(int workers, std::size_t groups) : words((groups + 63) / 64), bits(words * static_cast<std::size_t>(workers), 0) {}
  std::uint64_t* row(int r) { return bits.data() + static_cast<std::size_t>(r) * words; }
  const std::uint64_t* row(int r) const { return bits.data() + static_cast<std::size_t>(r) * words; }
};

std::shared_ptr<Plan::Data> plan_header(std::span<const PackedSequence> pool, const PlanConfig& config, const Geometry& g) {
  auto d = std::make_shared<Plan::Data>();
  d->config = config;
  d->pool.assign(pool.begin(), pool.end());
  d->pool_size = g.pool_size;
  d->num_workers = g.workers;
  d->head_width = g.head_width;
  return d;
}

// Another shard of the same rows holds the groups of the same n samples
// from `first` on, with its own key: C_r's bits for them.
inline void set_shard_groups(std::uint64_t* held, std::int32_t first, std::int32_t keys, std::int32_t key,
                             std::int32_t n) {
  for (std::int32_t k = 0, gid = first * keys + key; k < n; ++k, gid += keys) set_bit(held, gid);
}

// The same with the key-0 bits of a run's samples as (word, mask) pairs
// (RunMasks), made once per run of same-row tiles: with keys dividing 64 a
// sample's groups never straddle a word, so key k's bits are the masks
// shifted by k, a word at a time (a block's shards set theirs in one or two
// words each, not bit by bit).
class RunMasks {
 public:
  explicit RunMasks(std::int32_t keys) : keys_(keys), whole_(keys >= 1 && keys <= 64 && 64 % keys == 0) {}
  void reset(std::int32_t first, std::int32_t n) {
    first_ = first;
    n_ = n;
    if (!whole_) return;
    masks_.clear();
    std::uint32_t word = 0;
    std::uint64_t mask = 0;
    for (std::int32_t k = 0; k < n; ++k) {
      const auto u = static_cast<std::uint32_t>((first + k) * keys_);
      if (mask != 0 && u / 64 != word) {
        masks_.push_back({word, mask});
        mask = 0;
      }
      word = u / 64;
      mask |= std::uint64_t{1} << (u % 64);
    }
    if (mask != 0) masks_.push_back({word, mask});
  }
  void set(std::uint64_t* held, std::int32_t key) const {
    if (!whole_) {
      set_shard_groups(held, first_, keys_, key, n_);
      return;
    }
    for (const auto& [word, mask] : masks_) held[word] |= mask << key;
  }

 private:
  std::int32_t keys_;
  bool whole_;
  std::int32_t first_ = 0, n_ = 0;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> masks_;
};

// The fragments of rows `r` (tile `id`, dedup key `key`), one per sample
// from `first` on that the rows reach; returns their count and adds their
// causal pairs to `pairs`.
inline std::int32_t write_sample_fragments(const Geometry& g, const PlacedRows& r, std::int32_t id, std::int32_t key,
                                           std::int32_t first, Fragment* out, std::int64_t& pairs) {
  // Through locals: a store into a fragment could alias the fields read.
  const std::int32_t keys = g.keys_per_sample;
  const std::int32_t base = g.sample_base[static_cast<std::size_t>(r.slot)];
  const std::int32_t stop = g.sample_base[static_cast<std::size_t>(r.slot) + 1];
  const std::int64_t* const starts = g.starts.data();
  const std::int64_t* const lengths = g.lengths.data();
  const std::int64_t window = g.window;
  std::int32_t n = 0;
  for (std::int32_t j = first; j < stop && starts[j] < r.end; ++j, ++n) {
    Fragment f;
    f.tile = id;
    f.slot = r.slot;
    f.sample = j - base;
    f.group = j * keys + key;
    f.sample_start = starts[j];
    f.sample_length = lengths[j];
    f.a = std::max(r.begin, f.sample_start) - f.sample_start;
    f.e = std::min(r.end, f.sample_start + f.sample_length) - f.sample_start;
    f.key_begin = window == kFullCausal ? 0 : std::max<std::int64_t>(0, f.a - window + 1);
    pairs += g.pairs(j, f.a, f.e);
    ::new (static_cast<void*>(out + n)) Fragment(f);
  }
  return n;
}

// 2. Tiles and fragments in one pass, with the compute-list counts, the
//    loads and C_r. Consecutive tiles with the same rows (the shards of
//    a tap block) share their samples, FLOPs and home: the rows are looked
//    up once and their fragments written once (Plan::Data::row_fragments);
//    the next shard only marks its own groups. Storage for them is
//    allocated once, for at most one per tile plus one per sample start
//    inside a tile's rows (a start lies inside at most one piece of each
//    (block, shard)), and then trimmed.
void write_tiles(Plan::Data& d, const Geometry& g, std::span<const ShardInfo> shards, std::span<const PlacedRows> rows,
                 HeldBits& held) {
  d.tiles = RawArray<Tile>(rows.size());
  d.worker_tile_offsets.assign(static_cast<std::size_t>(g.workers) + 1, 0);
  d.worker_flops.assign(static_cast<std::size_t>(g.workers), 0);
  RawArray<Fragment> fragments(rows.size() + static_cast<std::size_t>(g.sample_base.back()) * static_cast<std::size_t>(g.shards));
  // Through locals only: a store into a tile or fragment could otherwise
  // alias every field this loop reads (one reload per field per fragment).
  Tile* const tiles = d.tiles.data();
  Fragment* const frags = fragments.data();
  std::uint64_t* const held_bits = held.bits.data();
  const std::size_t words = held.words;
  const std::int32_t keys = g.keys_per_sample;
  RunMasks run_masks(keys);
  std::size_t* const tile_counts = d.worker_tile_offsets.data() + 1;
  std::int64_t* const loads = d.worker_flops.data();
  PlacedRows prev{-1, -1, -1, -1, -1, -1};
  std::int32_t piece = 0, home = 0, first = 0, n = 0;
  std::int64_t flops = 0;
  std::size_t count = 0, written = 0;  // every tile's fragments so far; the runs' (written)
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const PlacedRows r = rows[i];
    const auto id = static_cast<std::int32_t>(i);
    const ShardInfo& shard = shards[static_cast<std::size_t>(r.shard)];
    std::uint64_t* const row = held_bits + static_cast<std::size_t>(r.worker) * words;
    // The pieces of a (slot, block, shard) continue one another from the
    // block's first row, so piece 0 is the one that starts there.
    const bool block_start = r.begin == r.block * g.block_size;
    piece = block_start ? 0 : piece + 1;
    if (prev.slot == r.slot && prev.begin == r.begin && prev.end == r.end) {
      run_masks.set(row, shard.key);
    } else {
      // A block's first piece starts at the block (every tile but a
      // tap-split piece): its first sample is in a table.
      first = block_start ? g.block_sample(r.slot, r.block) : g.sample_at(r.slot, r.begin);
      home = g.home(r.slot, r.begin);
      std::int64_t pairs = 0;
      n = write_sample_fragments(g, r, id, shard.key, first, frags + written, pairs);
      run_masks.reset(first, n);
      run_masks.set(row, shard.key);
      flops = pairs * g.head_width;
      written += static_cast<std::size_t>(n);
    }
    ::new (static_cast<void*>(tiles + i)) Tile{.id = id,
                                               .slot = r.slot,
                                               .block = r.block,
                                               .shard = r.shard,
                                               .piece = piece,
                                               .begin = r.begin,
                                               .end = r.end,
                                               .heads = shard.heads,
                                               .kv_heads = shard.kv_heads,
                                               .flops = flops,
                                               .home = home,
                                               .worker = r.worker,
                                               .fragment_begin = static_cast<std::int32_t>(count),
                                               .fragment_end = static_cast<std::int32_t>(count) + n};
    ++tile_counts[r.worker];
    loads[r.worker] += flops;
    count += static_cast<std::size_t>(n);
    prev = r;
  }
  fragments.truncate(written);
  d.row_fragments = std::move(fragments);
}

// 3. KV groups, densely numbered (global sample, key): group j * keys + k
//    is sample j's K/V for key k's heads.
void write_groups(Plan::Data& d, const Geometry& g, std::span<const KvGroup> key_group) {
  d.groups = RawArray<KvGroup>(static_cast<std::size_t>(g.sample_base.back()) * key_group.size());
  // Through locals: a store into a group could alias the tables read.
  KvGroup* out = d.groups.data();
  const KvGroup* const key_grp = key_group.data();
  const std::size_t keys = key_group.size();
  for (int p = 0; p < g.pool_size; ++p) {
    const std::int32_t base = g.sample_base[static_cast<std::size_t>(p)];
    const std::int32_t stop = g.sample_base[static_cast<std::size_t>(p) + 1];
    for (std::int32_t j = base; j < stop; ++j) {
      const std::int64_t begin = g.starts[static_cast<std::size_t>(j)];
      const std::int64_t end = begin + g.lengths[static_cast<std::size_t>(j)];
      // Field by field (a key's table gives only its key and KV heads): no
      // copy of the whole table entry through the stack.
      for (std::size_t k = 0; k < keys; ++k) {
        ::new (static_cast<void*>(out++)) KvGroup{.slot = p,
                                                  .sample = j - base,
                                                  .key = key_grp[k].key,
                                                  .kv_heads = key_grp[k].kv_heads,
                                                  .begin = begin,
                                                  .end = end};
      }
    }
  }
}

// 4. Compute list offsets (from the counts of the tile pass; the lists on
//    first use: list_worker_tiles) and the imbalance.
void write_compute_lists(Plan::Data& d) {
  const std::size_t W = d.worker_flops.size();
  for (std::size_t r = 0; r < W; ++r) d.worker_tile_offsets[r + 1] += d.worker_tile_offsets[r];
  std::int64_t total_flops = 0, max_flops = 0;
  for (std::int64_t f : d.worker_flops) {
    total_flops += f;
    max_flops = std::max(max_flops, f);
  }
  const double mean = static_cast<double>(total_flops) / static_cast<double>(W);
  d.imbalance = mean > 0 ? static_cast<double>(max_flops) / mean - 1.0 : 0.0;
}

// Where (worker, group) sits in worker_group_ids, without a search: per
// worker and bitset word, the index of the word's first set bit.
class EntryIndex {
 public:
  EntryIndex(const HeldBits& held, std::size_t size) : held_(held), rank_(size) {}
  void set(std::size_t word, std::size_t at) { rank_[word] = at; }
  // kHw: counted by the CPU's popcount instruction, for callers built for
  // it (record_entries_popcnt); else by bit_count.
  template <bool kHw = false>
  std::size_t at(int r, std::int32_t gid) const {
    const std::size_t at = static_cast<std::size_t>(r) * held_.words + static_cast<std::size_t>(gid) / 64;
    const std::uint64_t below = held_.bits[at] & ((std::uint64_t{1} << (gid % 64)) - 1);
    if constexpr (kHw) {
      return rank_[at] + static_cast<std::size_t>(__builtin_popcountll(below));
    } else {
      return rank_[at] + static_cast<std::size_t>(bit_count(below));
    }
  }
  std::size_t operator()(int r, std::int32_t gid) const { return at(r, gid); }

 private:
  const HeldBits& held_;
  RawArray<std::size_t> rank_;  // every entry written when used
};

// 5. C_r: the groups of each worker's fragments, each once, increasing,
//    read back from the bitset (an entry per group and worker, so at most
//    one per fragment). With `entries`, the index of each entry too.
EntryIndex read_group_lists(Plan::Data& d, const HeldBits& held, bool entries) {
  const int W = d.num_workers;
  EntryIndex index(held, entries ? held.bits.size() : 0);
  // At most one entry per fragment of every tile.
  RawArray<std::int32_t> ids(d.tiles.size() > 0 ? static_cast<std::size_t>(d.tiles[d.tiles.size() - 1].fragment_end) : 0);
  std::int32_t* const out = ids.data();
  std::size_t at = 0;
  d.worker_group_offsets.assign(static_cast<std::size_t>(W) + 1, 0);
  for (int r = 0; r < W; ++r) {
    const std::uint64_t* const row = held.row(r);
    for (std::size_t k = 0; k < held.words; ++k) {
      if (entries) index.set(static_cast<std::size_t>(r) * held.words + k, at);
      for (std::uint64_t w = row[k]; w != 0; w &= w - 1) {
        out[at++] = static_cast<std::int32_t>(k * 64 + static_cast<std::size_t>(std::countr_zero(w)));
      }
    }
    d.worker_group_offsets[static_cast<std::size_t>(r) + 1] = at;
  }
  ids.truncate(at);
  d.worker_group_ids = std::move(ids);
  return index;
}

// 5b. First and last chunk of every (shard, KV head of its key): chunk m of
//     a tile reads the KV heads of its query heads heads.begin +
//     [chunk_head_offset(m), chunk_head_offset(m + 1)) in every group of its
//     fragments, so which chunks read which KV head depends only on the
//     shard. `stride` KV heads a shard.
struct ShardUses {
  std::vector<ChunkUse> uses;  // [shard * stride + KV head - the key's first]
  std::int32_t stride = 0;
};

ShardUses shard_chunk_uses(const Geometry& g, const PlanConfig& config, std::span<const ShardInfo> shards,
                           std::span<const KvGroup> key_group) {
  const int M = config.chunks;
  auto offset = [&](int m) { return chunk_head_offset(g.head_width, M, config.chunk_split, m); };
  ShardUses out;
  for (const KvGroup& k : key_group) out.stride = std::max(out.stride, k.kv_heads.size());
  out.uses.resize(static_cast<std::size_t>(g.shards) * static_cast<std::size_t>(out.stride));
  for (int s = 0; s < g.shards; ++s) {
    const ShardInfo& shard = shards[static_cast<std::size_t>(s)];
    const HeadRange kv = key_group[static_cast<std::size_t>(shard.key)].kv_heads;
    for (int m = 0; m < M; ++m) {
      const std::int32_t q0 = shard.heads.begin + offset(m), q1 = shard.heads.begin + offset(m + 1);
      const std::int32_t k0 = std::max(kv.begin, q0 / g.group_size);
      const std::int32_t k1 = std::min(kv.end, (q1 - 1) / g.group_size + 1);
      for (std::int32_t kh = k0; kh < k1; ++kh) {
        ChunkUse& u = out.uses[static_cast<std::size_t>(s) * static_cast<std::size_t>(out.stride) +
                               static_cast<std::size_t>(kh - kv.begin)];
        if (!u.used()) u = {m, m};
        u.first = std::min(u.first, m);
        u.last = std::max(u.last, m);
      }
    }
  }
  return out;
}

// Each key one shard's: the shard tables are every entry's
// (Plan::Data::kv_uses_by_key). Otherwise every entry gets a table of its
// own, filled by record_entries. Returns the shard tables.
const ChunkUse* store_kv_uses(Plan::Data& d, ShardUses& shard, bool key_is_shard) {
  d.kv_use_stride = shard.stride;
  d.kv_uses_by_key = key_is_shard;
  if (key_is_shard) {
    d.kv_uses = std::move(shard.uses);
    return d.kv_uses.data();
  }
  d.kv_use_offsets.reserve(d.worker_group_ids.size() + 1);
  d.kv_use_offsets.push_back(0);
  for (const std::int32_t gid : d.worker_group_ids) {
    d.kv_use_offsets.push_back(d.kv_use_offsets.back() +
                               static_cast<std::size_t>(d.groups[static_cast<std::size_t>(gid)].kv_heads.size()));
  }
  d.kv_uses.assign(d.kv_use_offsets.back(), ChunkUse{});
  return shard.uses.data();
}

// An entry's table widened by a shard's: every KV head used by either.
void merge_uses(ChunkUse* into, const ChunkUse* shard, std::size_t heads) {
  for (std::size_t i = 0; i < heads; ++i) {
    if (!shard[i].used()) continue;
    ChunkUse& u = into[i];
    if (!u.used()) {
      u = shard[i];
    } else {
      u.first = std::min(u.first, shard[i].first);
      u.last = std::max(u.last, shard[i].last);
    }
  }
}

// What tile t adds to the groups of its rows' run's fragments (the run's
// first tile's, `f` one of them): the difference of the two shards' keys.
std::int32_t key_shift(const Plan::Data& d, std::span<const ShardInfo> shards, const Tile& t, const Fragment& f) {
  return shards[static_cast<std::size_t>(t.shard)].key -
         shards[static_cast<std::size_t>(d.tiles[static_cast<std::size_t>(f.tile)].shard)].key;
}

// 5c. Per entry of worker_group_ids, from every fragment: with kv_prefix,
//     the causal prefix of the sample the worker holds (up to its last
//     query row: a query reads no later key; Plan::Data::kv_span_end); when
//     keys merge shards, the chunks that read each KV head.
struct EntryArgs {
  std::span<const ShardInfo> shards;
  const EntryIndex& entry;
  const ChunkUse* shard_uses;
  std::int32_t stride;
  bool key_is_shard;
  bool spans = true;
  std::uint64_t* entry_shards = nullptr;
};

// record_entries, kHw: finding each fragment's entry with the CPU's
// popcount instruction (EntryIndex::at).
template <bool kHw>
[[gnu::always_inline]] inline void record_entries_with(Plan::Data& d, const EntryArgs& a) {
  const bool prefix = d.config.kv_prefix && a.spans;
  if (prefix) {
    d.kv_span_end = RawArray<std::int64_t>(d.worker_group_ids.size());
    std::fill_n(d.kv_span_end.data(), d.kv_span_end.size(), std::int64_t{0});
  }
  const bool key_is_shard = a.key_is_shard;
  std::uint64_t* const entry_shards = a.entry_shards;
  for_each_tile_fragments(d, [&](const Tile& t, const Fragment* frags) {
    const std::int32_t n = t.fragment_end - t.fragment_begin;
    if (n == 0) return;
    const ChunkUse* su = a.shard_uses + static_cast<std::size_t>(t.shard) * static_cast<std::size_t>(a.stride);
    const std::int32_t shift = key_shift(d, a.shards, t, frags[0]);
    for (std::int32_t k = 0; k < n; ++k) {
      const Fragment& frag = frags[k];
      const std::size_t at = a.entry.template at<kHw>(t.worker, frag.group + shift);
      if (prefix) {
        std::int64_t& span_end = d.kv_span_end[at];
        span_end = std::max(span_end, frag.sample_start + frag.e);
      }
      if (key_is_shard) continue;
      if (entry_shards != nullptr) entry_shards[at] |= std::uint64_t{1} << t.shard;
      const std::size_t first = d.kv_use_offsets[at];
      merge_uses(d.kv_uses.data() + first, su, d.kv_use_offsets[at + 1] - first);
    }
  });
}

// The portable x86-64 build has no popcount instruction (bit_count is a
// dozen instructions, a third of this walk): this copy is built for CPUs
// that have it, and record_entries takes it where the CPU does. flatten:
// every call inside (the walk, its lambda, EntryIndex::at) is inlined, so
// all of it is built for the instruction.
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define LIBRA_POPCNT_COPY 1
[[gnu::target("popcnt"), gnu::flatten]] void record_entries_popcnt(Plan::Data& d, const EntryArgs& a) {
  record_entries_with<true>(d, a);
}
#endif

void record_entries(Plan::Data& d, const EntryArgs& a) {
#ifdef LIBRA_POPCNT_COPY
  if (__builtin_cpu_supports("popcnt")) {
    record_entries_popcnt(d, a);
    return;
  }
#endif
  record_entries_with<false>(d, a);
}

// record_entries' K/V uses from the shards that read each entry
// (entry_shards): the same unions, as merging is order-free.
void merge_entry_uses(Plan::Data& d, const ChunkUse* shard_uses, std::int32_t stride) {
  for (std::size_t at = 0; at < d.entry_shards.size(); ++at) {
    const std::size_t first = d.kv_use_offsets[at], heads = d.kv_use_offsets[at + 1] - first;
    for (std::uint64_t w = d.entry_shards[at]; w != 0; w &= w - 1) {
      const auto s = static_cast<std::size_t>(std::countr_zero(w));
      merge_uses(d.kv_uses.data() + first, shard_uses + s * static_cast<std::size_t>(stride), heads);
    }
  }
}

// The held bits and entry index of a built plan, read back from its group
// lists (a re-chunked plan's entries are its base plan's).
HeldBits held_of(const Plan::Data& d, const Geometry& g) {
  HeldBits held(g.workers, static_cast<std::size_t>(g.sample_base.back()) * static_cast<std::size_t>(g.keys_per_sample));
  for (int r = 0; r < g.workers; ++r) {
    std::uint64_t* const row = held.row(r);
    for (std::size_t i = d.worker_group_offsets[static_cast<std::size_t>(r)];
         i < d.worker_group_offsets[static_cast<std::size_t>(r) + 1]; ++i) {
      set_bit(row, d.worker_group_ids[i]);
    }
  }
  return held;
}
EntryIndex index_of(const Plan::Data& d, const HeldBits& held) {
  EntryIndex index(held, held.bits.size());
  for (int r = 0; r < d.num_workers; ++r) {
    std::size_t at = d.worker_group_offsets[static_cast<std::size_t>(r)];
    const std::uint64_t* const row = held.row(r);
    for (std::size_t k = 0; k < held.words; ++k) {
      index.set(static_cast<std::size_t>(r) * held.words + k, at);
      at += static_cast<std::size_t>(bit_count(row[k]));
    }
  }
  return index;
}

}  // namespace

Plan build_plan(std::span<const PackedSequence> pool, const PlanConfig& config, Geometry geo,
                std::span<const PlacedRows> rows) {
  const Geometry& g = geo;
  std::shared_ptr<Plan::Data> d = plan_header(pool, config, g);
  const std::vector<ShardInfo> shards = shard_infos(g);
  HeldBits held(g.workers, static_cast<std::size_t>(g.sample_base.back()) * static_cast<std::size_t>(g.keys_per_sample));
  write_tiles(*d, g, shards, rows, held);
  const std::vector<KvGroup> key_group = key_heads(g).group;  // key and KV heads per key
  write_groups(*d, g, key_group);
  write_compute_lists(*d);
  // Key k is shard k's alone unless dedup_per_kv_head merges shards: then a
  // worker's uses of a group are its own (5c), else its key's shard's table.
  const bool key_is_shard = !(g.dedup_per_kv_head && g.shards > g.heads_kv);
  const bool need_entries = !key_is_shard || config.kv_prefix;
  const EntryIndex entries = read_group_lists(*d, held, need_entries);
  ShardUses shard_uses = shard_chunk_uses(g, config, shards, key_group);
  const ChunkUse* shard_table = store_kv_uses(*d, shard_uses, key_is_shard);
  std::uint64_t* entry_shards = nullptr;
  if (!key_is_shard && g.shards <= 64) {
    d->entry_shards = RawArray<std::uint64_t>(d->worker_group_ids.size());
    entry_shards = d->entry_shards.data();
    std::fill_n(entry_shards, d->entry_shards.size(), std::uint64_t{0});
  }
  if (need_entries) record_entries(*d, {shards, entries, shard_table, shard_uses.stride, key_is_shard, true, entry_shards});
  // 8. The fingerprint and the exchange are derived from the plan on first
  //    use (Plan::fingerprint, derive_exchange).
  d->geometry = std::make_shared<const Geometry>(std::move(geo));
  return Plan(std::move(d));
}

namespace {

// build_plan(pool, config, geometry, rows of `base`) without placing
// anything again: nothing but the K/V chunk uses and the fingerprint
// depends on the chunking, so the rest is the base plan's: its item arrays
// shared (no plan writes them after its build), the small per-worker lists
// copied, the geometry shared. Keys that merge shards take each entry's uses
// from its fragments again (record_entries), through the base's entries.
// The fingerprint is hashed on first use (Plan::fingerprint).
Plan rechunk_data(const Plan::Data& base, const PlanConfig& config) {
  const Geometry& g = *base.geometry;
  std::shared_ptr<Plan::Data> d = plan_header(base.pool, config, g);
  d->tiles = base.tiles.share();
  d->row_fragments = base.row_fragments.share();
  d->groups = base.groups.share();
  d->worker_tile_offsets = base.worker_tile_offsets;
  d->worker_group_offsets = base.worker_group_offsets;
  d->worker_group_ids = base.worker_group_ids.share();
  d->kv_span_end = base.kv_span_end.share();
  d->worker_flops = base.worker_flops;
  d->imbalance = base.imbalance;
  const std::vector<ShardInfo> shards = shard_infos(g);
  const std::vector<KvGroup> key_group = key_heads(g).group;
  const bool key_is_shard = !(g.dedup_per_kv_head && g.shards > g.heads_kv);
  ShardUses shard_uses = shard_chunk_uses(g, config, shards, key_group);
  const ChunkUse* shard_table = store_kv_uses(*d, shard_uses, key_is_shard);
  if (!key_is_shard && base.entry_shards.size() == base.worker_group_ids.size()) {
    d->entry_shards = base.entry_shards.share();
    merge_entry_uses(*d, shard_table, shard_uses.stride);
  } else if (!key_is_shard) {
    const HeldBits held = held_of(*d, g);
    const EntryIndex index = index_of(*d, held);
    record_entries(*d, {shards, index, shard_table, shard_uses.stride, false, /*spans=*/false});
  }
  d->geometry = base.geometry;
  return Plan(std::move(d));
}

// Sections 6 and 7b of the builder. Transfers and their chunks: a bucket
// (src, dst) lists Q items (by tile), then KV items (by group of dst, then
// begin), then O items (by tile); chunk m's bucket lists the same items
// restricted to chunk m's heads, KV items without a head in chunk m left
// out. A KV group sends one item per home run of its sample (the rows of
// an item are consecutive in the sender's home buffer); the runs are the
// same for every key of a sample (Geometry::runs). The items are first
// sorted into their buckets as small indices (a counting sort keeps the
// generation order), so that both lists are written front to back.

// The query heads of chunk m of a tile, from its first: [at[m], at[m + 1]).
std::vector<std::int32_t> chunk_head_table(const Geometry& g, const PlanConfig& config) {
  const int M = config.chunks;
  std::vector<std::int32_t> at(static_cast<std::size_t>(M) + 1);
  for (int m = 0; m <= M; ++m) at[static_cast<std::size_t>(m)] = chunk_head_offset(g.head_width, M, config.chunk_split, m);
  return at;
}

// KV heads of chunk m for each dedup key (they depend on nothing else):
// [key * M + m].
std::vector<HeadRange> chunk_kv_table(const Geometry& g, const PlanConfig& config, const KeyHeads& keys) {
  const auto M = static_cast<std::size_t>(config.chunks);
  std::vector<HeadRange> out(static_cast<std::size_t>(g.keys_per_sample) * M);
  for (std::size_t k = 0; k < static_cast<std::size_t>(g.keys_per_sample); ++k) {
    for (std::size_t m = 0; m < M; ++m) {
      out[k * M + m] = chunk_kv_heads_of(config, keys.rep_shard_heads[k], keys.group[k].kv_heads, static_cast<int>(m));
    }
  }
  return out;
}

// A KV item: one home run of a group's sample that worker `to` fetches.
struct KvItem {
  std::int32_t entry;  // in worker_group_ids
  std::int32_t key;
  std::int32_t run;    // in g.runs
};

// The items of every (src, dst) bucket b = src * W + dst, in generation
// order: bucket b's Q items are q_ids[q_at[b] .. q_at[b + 1]), and so on.
struct BucketItems {
  std::vector<std::size_t> q_at, kv_at, o_at;  // W * W + 1 offsets
  std::vector<std::int32_t> q_ids, o_ids;      // tile ids
  std::vector<KvItem> kv;
};

// One home run of a group that a worker holds, as the exchange sees it.
struct HeldRun {
  int to = 0;               // the worker holding the group
  std::size_t entry = 0;    // in worker_group_ids
  const KvGroup* group = nullptr;
  std::int32_t key = 0;     // the group's dedup key
  std::int32_t run = 0;     // in g.runs
  int from = 0;             // the worker whose home holds the run
  std::int64_t span_end = 0;  // the end of the tokens `to` holds (Plan::kv_span)
};

// Every home run each worker holds of each of its groups, in order.
template <class Visit>
void for_each_held_run(const Plan::Data& d, const Geometry& g, Visit&& visit) {
  for (int r = 0; r < g.workers; ++r) {
    for (std::size_t k = d.worker_group_offsets[static_cast<std::size_t>(r)]; k < d.worker_group_offsets[static_cast<std::size_t>(r) + 1]; ++k) {
      const std::int32_t gid = d.worker_group_ids[k];
      const KvGroup& grp = d.groups[static_cast<std::size_t>(gid)];
      const std::int64_t span_end = d.span_end(k, gid);
      const std::int32_t j = g.sample_base[static_cast<std::size_t>(grp.slot)] + grp.sample;
      const std::int32_t key = gid - j * g.keys_per_sample;
      for (std::int32_t u = g.run_base[static_cast<std::size_t>(j)]; u < g.run_base[static_cast<std::size_t>(j) + 1]; ++u) {
        const Geometry::Run& run = g.runs[static_cast<std::size_t>(u)];
        if (run.begin >= span_end) break;
        visit(HeldRun{r, k, &grp, key, u, grp.slot * g.cp + run.rank, span_end});
      }
    }
  }
}

// Bucket counts as offsets; what stays on its worker counted as kept
// bytes (Q and O of tiles at home, K/V of runs at home).
void count_items(const Plan::Data& d, const Geometry& g, BucketItems& items) {
  const auto W = static_cast<std::size_t>(g.workers);
  items.q_at.assign(W * W + 1, 0);
  items.kv_at.assign(W * W + 1, 0);
  items.o_at.assign(W * W + 1, 0);
  for (const Tile& t : d.tiles) {
    if (t.worker == t.home) {
      d.tier_bytes[static_cast<std::size_t>(t.worker)].kept += 2 * qo_bytes(g, t.end - t.begin, t.heads.size());
      continue;
    }
    ++items.q_at[static_cast<std::size_t>(t.home) * W + static_cast<std::size_t>(t.worker) + 1];
    ++items.o_at[static_cast<std::size_t>(t.worker) * W + static_cast<std::size_t>(t.home) + 1];
  }
  for_each_held_run(d, g, [&](const HeldRun& h) {
    if (h.from != h.to) {
      ++items.kv_at[static_cast<std::size_t>(h.from) * W + static_cast<std::size_t>(h.to) + 1];
      return;
    }
    const Geometry::Run& run = g.runs[static_cast<std::size_t>(h.run)];
    d.tier_bytes[static_cast<std::size_t>(h.to)].kept +=
        kv_bytes(g, std::min(run.end, h.span_end) - run.begin, h.group->kv_heads.size());
  });
  for (std::size_t b = 0; b < W * W; ++b) {
    items.q_at[b + 1] += items.q_at[b];
    items.kv_at[b + 1] += items.kv_at[b];
    items.o_at[b + 1] += items.o_at[b];
  }
}

// The items, each in its bucket (count_items gave the offsets).
void fill_items(const Plan::Data& d, const Geometry& g, BucketItems& items) {
  const auto W = static_cast<std::size_t>(g.workers);
  items.q_ids.resize(items.q_at[W * W]);
  items.o_ids.resize(items.o_at[W * W]);
  items.kv.resize(items.kv_at[W * W]);
  std::vector<std::size_t> qi(items.q_at.begin(), items.q_at.end() - 1), ki(items.kv_at.begin(), items.kv_at.end() - 1),
      oi(items.o_at.begin(), items.o_at.end() - 1);
  for (const Tile& t : d.tiles) {
    if (t.worker == t.home) continue;
    items.q_ids[qi[static_cast<std::size_t>(t.home) * W + static_cast<std::size_t>(t.worker)]++] = t.id;
    items.o_ids[oi[static_cast<std::size_t>(t.worker) * W + static_cast<std::size_t>(t.home)]++] = t.id;
  }
  for_each_held_run(d, g, [&](const HeldRun& h) {
    if (h.from == h.to) return;
    items.kv[ki[static_cast<std::size_t>(h.from) * W + static_cast<std::size_t>(h.to)]++] = {
        static_cast<std::int32_t>(h.entry), h.key, h.run};
  });
}

// The lists' offsets: every bucket's items, and per chunk its Q and O items
// and the KV items with a head in the chunk.
void size_lists(const Plan::Data& d, const BucketItems& items, std::span<const HeadRange> chunk_kv, int M) {
  const std::size_t W2 = items.q_at.size() - 1;
  d.transfer_offsets.assign(W2 + 1, 0);
  d.chunk_offsets.assign(static_cast<std::size_t>(M) * W2 + 1, 0);
  for (std::size_t b = 0; b < W2; ++b) {
    const std::size_t qo = (items.q_at[b + 1] - items.q_at[b]) + (items.o_at[b + 1] - items.o_at[b]);
    d.transfer_offsets[b + 1] = d.transfer_offsets[b] + qo + (items.kv_at[b + 1] - items.kv_at[b]);
    for (int m = 0; m < M; ++m) d.chunk_offsets[static_cast<std::size_t>(m) * W2 + b + 1] = qo;
    for (std::size_t i = items.kv_at[b]; i < items.kv_at[b + 1]; ++i) {
      const HeadRange* heads = &chunk_kv[static_cast<std::size_t>(items.kv[i].key) * static_cast<std::size_t>(M)];
      for (int m = 0; m < M; ++m) {
        if (heads[m].size() > 0) ++d.chunk_offsets[static_cast<std::size_t>(m) * W2 + b + 1];
      }
    }
  }
  for (std::size_t i = 0; i < static_cast<std::size_t>(M) * W2; ++i) d.chunk_offsets[i + 1] += d.chunk_offsets[i];
}

// Writes each bucket's items into the whole-iteration list, the chunk
// lists and the byte matrices.
class BucketWriter {
 public:
  BucketWriter(const Plan::Data& d, const Geometry& g, std::span<const std::int32_t> chunk_at_head,
               std::span<const HeadRange> chunk_kv, std::span<const KvGroup> key_group)
      : d_(d), g_(g), M_(d.config.chunks), W2_(static_cast<std::size_t>(g.workers) * static_cast<std::size_t>(g.workers)),
        chunk_at_head_(chunk_at_head), chunk_kv_(chunk_kv), key_group_(key_group), chunk_at_(static_cast<std::size_t>(M_)) {}

  void write(std::size_t b, const BucketItems& items) {
    b_ = b;
    for (int m = 0; m < M_; ++m) chunk_at_[static_cast<std::size_t>(m)] = d_.chunk_offsets[static_cast<std::size_t>(m) * W2_ + b];
    for (std::size_t i = items.q_at[b]; i < items.q_at[b + 1]; ++i) put_qo(TransferKind::kQ, tile(items.q_ids[i]));
    for (std::size_t i = items.kv_at[b]; i < items.kv_at[b + 1]; ++i) put_kv(items.kv[i]);
    for (std::size_t i = items.o_at[b]; i < items.o_at[b + 1]; ++i) put_qo(TransferKind::kO, tile(items.o_ids[i]));
    d_.comm_bytes += d_.byte_matrix[b];
  }

 private:
  const Tile& tile(std::int32_t id) const { return d_.tiles[static_cast<std::size_t>(id)]; }
  void put_whole(const Transfer& x) {
    d_.transfers.push_back(x);
    d_.byte_matrix[b_] += x.bytes;
  }
  // A tile's Q (home -> worker) or O (worker -> home), whole and per chunk.
  void put_qo(TransferKind kind, const Tile& t) {
    const bool q = kind == TransferKind::kQ;
    const int M = M_;
    const Transfer x{kind, q ? t.home : t.worker, q ? t.worker : t.home, t.slot, t.begin, t.end, t.heads, t.id, -1,
                     qo_bytes(g_, t.end - t.begin, t.heads.size()), 0, M - 1};
    put_whole(x);
    // Through locals: a stored item could alias the members.
    const std::int64_t tokens_bytes = qo_bytes(g_, x.end - x.begin, 1);
    const std::int32_t* const at_head = chunk_at_head_.data();
    std::int64_t* const chunk_bytes = d_.chunk_byte_matrix.data() + b_;
    std::size_t* const chunk_at = chunk_at_.data();
    const std::size_t W2 = W2_;
    for (int m = 0; m < M; ++m) {
      Transfer c = x;
      c.heads = {x.heads.begin + at_head[m], x.heads.begin + at_head[m + 1]};
      c.bytes = tokens_bytes * c.heads.size();
      c.first_use = c.last_use = m;
      chunk_bytes[static_cast<std::size_t>(m) * W2] += c.bytes;
      d_.chunk_transfers.put(chunk_at[m]++, c);
    }
  }
  // A KV item, whole and in every chunk with a head of its key; a chunk
  // item's uses span its heads' (Plan::kv_use).
  void put_kv(const KvItem& item) {
    const int M = M_;
    const Geometry::Run& run = g_.runs[static_cast<std::size_t>(item.run)];
    const std::int32_t gid = d_.worker_group_ids[static_cast<std::size_t>(item.entry)];
    const HeadRange kv = key_group_[static_cast<std::size_t>(item.key)].kv_heads;
    const std::int32_t slot = d_.groups[static_cast<std::size_t>(gid)].slot;
    const std::int64_t end = std::min(run.end, d_.span_end(static_cast<std::size_t>(item.entry), gid));
    const Transfer x{TransferKind::kKv, slot * g_.cp + run.rank, static_cast<std::int32_t>(b_ % static_cast<std::size_t>(g_.workers)),
                     slot, run.begin, end, kv, -1, gid, kv_bytes(g_, end - run.begin, kv.size()), 0, M - 1};
    put_whole(x);
    // Through locals: a stored item could alias the members.
    const std::int64_t head_bytes = kv_bytes(g_, x.end - x.begin, 1);
    const ChunkUse* uses = d_.uses_of(static_cast<std::size_t>(item.entry), item.key);
    const HeadRange* heads = &chunk_kv_[static_cast<std::size_t>(item.key) * static_cast<std::size_t>(M)];
    std::int64_t* const chunk_bytes = d_.chunk_byte_matrix.data() + b_;
    std::size_t* const chunk_at = chunk_at_.data();
    const std::size_t W2 = W2_;
    for (int m = 0; m < M; ++m) {
      if (heads[m].size() == 0) continue;
      Transfer c = x;
      c.heads = heads[m];
      c.bytes = head_bytes * c.heads.size();
      c.first_use = M;
      c.last_use = -1;
      for (std::int32_t kh = c.heads.begin; kh < c.heads.end; ++kh) {
        const ChunkUse u = uses[kh - kv.begin];
        if (!u.used()) continue;
        c.first_use = std::min(c.first_use, u.first);
        c.last_use = std::max(c.last_use, u.last);
      }
      chunk_bytes[static_cast<std::size_t>(m) * W2] += c.bytes;
      d_.chunk_transfers.put(chunk_at[m]++, c);
    }
  }

  const Plan::Data& d_;
  const Geometry& g_;
  int M_;
  std::size_t W2_;
  std::span<const std::int32_t> chunk_at_head_;
  std::span<const HeadRange> chunk_kv_;
  std::span<const KvGroup> key_group_;
  std::vector<std::size_t> chunk_at_;  // the next place in each chunk's bucket b_
  std::size_t b_ = 0;
};

// 7b. Bytes by tier: the byte matrix split by where each pair of workers
//     sits (what stays was counted with the transfers).
void split_by_tier(const Plan::Data& d) {
  const int W = d.num_workers;
  for (int r = 0; r < W; ++r) {
    for (int dst = 0; dst < W; ++dst) {
      const std::int64_t b = d.byte_matrix[static_cast<std::size_t>(r) * static_cast<std::size_t>(W) + static_cast<std::size_t>(dst)];
      if (b == 0) continue;
      TierBytes& snd = d.tier_bytes[static_cast<std::size_t>(r)];
      TierBytes& rcv = d.tier_bytes[static_cast<std::size_t>(dst)];
      switch (topo_tier(d.config.topology, r, dst)) {
        case 0:
          snd.send_intra_node += b;
          rcv.recv_intra_node += b;
          break;
        case 2:
          snd.send_cross_supernode += b;
          rcv.recv_cross_supernode += b;
          [[fallthrough]];
        default:
          snd.send_cross_node += b;
          rcv.recv_cross_node += b;
      }
    }
  }
}

// The worker that receives the most bytes (lowest id on ties), and the
// largest cross-node bytes any worker receives.
void find_busiest(const Plan::Data& d) {
  std::int64_t best = -1;
  for (int r = 0; r < d.num_workers; ++r) {
    const TierBytes& x = d.tier_bytes[static_cast<std::size_t>(r)];
    const std::int64_t recv = x.recv_intra_node + x.recv_cross_node;
    if (recv > best) {
      best = recv;
      d.busiest_receiver = r;
    }
    d.max_recv_cross_node = std::max(d.max_recv_cross_node, x.recv_cross_node);
  }
}

}  // namespace

void list_worker_tiles(const Plan::Data& d) {
  RawArray<std::int32_t> ids(d.tiles.size());  // every tile's id once, below
  std::vector<std::size_t> at(d.worker_tile_offsets.begin(), d.worker_tile_offsets.end() - 1);
  for (const Tile& t : d.tiles) ids[at[static_cast<std::size_t>(t.worker)]++] = t.id;
  d.worker_tile_ids = std::move(ids);
}

void spell_fragments(const Plan::Data& d) {
  const std::vector<ShardInfo> shards = shard_infos(*d.geometry);
  RawArray<Fragment> out(d.tiles.size() > 0 ? static_cast<std::size_t>(d.tiles[d.tiles.size() - 1].fragment_end) : 0);
  for_each_tile_fragments(d, [&](const Tile& t, const Fragment* frags) {
    const std::int32_t n = t.fragment_end - t.fragment_begin;
    if (n == 0) return;
    const std::int32_t shift = key_shift(d, shards, t, frags[0]);
    for (std::int32_t k = 0; k < n; ++k) {
      Fragment f = frags[k];
      f.tile = t.id;
      f.group += shift;
      out.put(static_cast<std::size_t>(t.fragment_begin + k), f);
    }
  });
  d.fragments = std::move(out);
}

// Sections 6 and 7b of the builder: the transfers, chunk lists, byte
// matrices and bytes by tier of a built plan (Plan::Data's exchange).
void derive_exchange(const Plan::Data& data) {
  // Writes only the exchange's fields (mutable), once, before any reader
  // sees exchange_ready; everything else it reads was fixed by build_plan.
  const Plan::Data& d = data;
  const Geometry& g = *d.geometry;
  const int M = d.config.chunks;
  const std::size_t W2 = static_cast<std::size_t>(g.workers) * static_cast<std::size_t>(g.workers);
  const std::vector<std::int32_t> chunk_at_head = chunk_head_table(g, d.config);
  const KeyHeads keys = key_heads(g);
  const std::vector<HeadRange> chunk_kv = chunk_kv_table(g, d.config, keys);
  // A derivation that threw (out of memory) may have left partial sums.
  d.comm_bytes = 0;
  d.max_recv_cross_node = 0;
  d.transfers.clear();
  d.tier_bytes.assign(static_cast<std::size_t>(g.workers), TierBytes{});
  BucketItems items;
  count_items(d, g, items);
  fill_items(d, g, items);
  size_lists(d, items, chunk_kv, M);
  d.transfers.reserve(d.transfer_offsets[W2]);
  d.chunk_transfers = TransferArray(d.chunk_offsets.back());
  d.byte_matrix.assign(W2, 0);
  d.chunk_byte_matrix.assign(static_cast<std::size_t>(M) * W2, 0);
  BucketWriter writer(d, g, chunk_at_head, chunk_kv, keys.group);
  for (std::size_t b = 0; b < W2; ++b) writer.write(b, items);
  split_by_tier(d);
  find_busiest(d);
}

namespace {

// exchange_layout's pairs: a bitset over the W x W pairs (cleared per plan,
// W * W / 8 bytes, where dense sums zeroed 3 M W * W int64), and each
// marked pair's index. The index array is the thread's and never cleared:
// only marked pairs are looked up, and number() writes every one of them.
struct PairIndex {
  std::size_t W;
  std::vector<std::uint64_t> marked;
  std::vector<std::int32_t>& at;

  explicit PairIndex(std::size_t workers) : W(workers), marked(W * W / 64 + 1, 0), at(scratch()) {
    if (at.size() < W * W) at.resize(W * W);
  }
  static std::vector<std::int32_t>& scratch() {
    thread_local std::vector<std::int32_t> v;
    return v;
  }
  // Both directions: what goes one way (Q, K/V) comes back the other.
  void mark(std::size_t a, std::size_t b) {
    const std::size_t p = a * W + b, q = b * W + a;
    marked[p / 64] |= std::uint64_t{1} << (p % 64);
    marked[q / 64] |= std::uint64_t{1} << (q % 64);
  }
  // The marked pairs in increasing order, numbered; each one's reverse.
  void number(ExchangeLayout& out) {
    std::vector<std::uint32_t>& pairs = out.pairs;
    for (std::size_t k = 0; k < marked.size(); ++k) {
      for (std::uint64_t bits = marked[k]; bits != 0; bits &= bits - 1) {
        const std::size_t p = k * 64 + static_cast<std::size_t>(std::countr_zero(bits));
        at[p] = static_cast<std::int32_t>(pairs.size());
        pairs.push_back(static_cast<std::uint32_t>(p));
      }
    }
    out.reverse.resize(pairs.size());
    out.src.resize(pairs.size());
    out.dst.resize(pairs.size());
    for (std::size_t j = 0; j < pairs.size(); ++j) {
      const std::size_t s = pairs[j] / W, t = pairs[j] % W;
      out.reverse[j] = static_cast<std::uint32_t>(at[t * W + s]);
      out.src[j] = static_cast<std::uint32_t>(s);
      out.dst[j] = static_cast<std::uint32_t>(t);
    }
  }
  std::uint32_t operator()(std::size_t a, std::size_t b) const { return static_cast<std::uint32_t>(at[a * W + b]); }
  std::uint32_t operator()(std::size_t pair) const { return static_cast<std::uint32_t>(at[pair]); }
};

// One worker's groups of one sample (global index j): entries [e0, e1) of
// worker_group_ids.
struct SampleGroups {
  int to;
  std::int32_t j;
  std::size_t e0, e1;
};

// Every worker's groups, sample by sample (a worker's groups are sorted by
// id, so a sample's keys are consecutive), into the thread's list (reused
// across plans); with the bounds of the layout's runs and fetches (every
// run of a sample, for each of its groups).
std::span<const SampleGroups> sample_groups(const Plan::Data& d, const Geometry& g, std::size_t& most_runs,
                                            std::size_t& most_fetches) {
  thread_local std::vector<SampleGroups> out;
  out.clear();
  most_runs = most_fetches = 0;
  for (int r = 0; r < g.workers; ++r) {
    const std::size_t e1 = d.worker_group_offsets[static_cast<std::size_t>(r) + 1];
    for (std::size_t e = d.worker_group_offsets[static_cast<std::size_t>(r)]; e < e1;) {
      // Group ids are j * keys_per_sample + key: the sample's end without a division.
      const KvGroup& grp0 = d.groups[static_cast<std::size_t>(d.worker_group_ids[e])];
      const std::int32_t j = g.sample_base[static_cast<std::size_t>(grp0.slot)] + grp0.sample;
      const std::int32_t next = (j + 1) * g.keys_per_sample;
      std::size_t f = e + 1;
      while (f < e1 && d.worker_group_ids[f] < next) ++f;
      const std::size_t runs = g.sample_runs(j).size();
      most_runs += runs;
      most_fetches += runs * (f - e);
      out.push_back({r, j, e, f});
      e = f;
    }
  }
  return out;
}

// The layout's K/V fetches of one worker's groups of one sample: per home
// run other workers hold, the rows each group reads of it (up to its span's
// end). Made in the pass that marks the pairs, so each run names its pair
// as from * W + to (numbered later) and its K/V bytes are kept in run_bytes
// until then.
void add_fetches(const Plan::Data& d, const Geometry& g, std::span<const std::int64_t> key_row_bytes,
                 PairIndex& index, const SampleGroups& s, ExchangeLayout& out, std::vector<std::int64_t>& run_bytes) {
  const KvGroup& grp0 = d.groups[static_cast<std::size_t>(d.worker_group_ids[s.e0])];
  for (const Geometry::Run& run : g.sample_runs(s.j)) {
    const int from = grp0.slot * g.cp + run.rank;
    if (from == s.to) continue;
    index.mark(static_cast<std::size_t>(from), static_cast<std::size_t>(s.to));
    const auto first = static_cast<std::uint32_t>(out.fetches.size());
    std::int64_t bytes = 0;
    for (std::size_t e = s.e0; e < s.e1; ++e) {
      const std::int32_t gid = d.worker_group_ids[e];
      const std::int64_t end = std::min(run.end, d.span_end(e, gid));
      if (run.begin >= end) continue;
      const std::int64_t rows = end - run.begin;
      const std::int32_t key = gid - s.j * g.keys_per_sample;
      bytes += rows * key_row_bytes[static_cast<std::size_t>(key)];
      out.fetches.push_back({rows, key, static_cast<std::uint32_t>(e)});
    }
    const auto last = static_cast<std::uint32_t>(out.fetches.size());
    if (last == first) continue;
    const std::size_t pair = static_cast<std::size_t>(from) * index.W + static_cast<std::size_t>(s.to);
    out.runs.push_back({static_cast<std::uint32_t>(pair), 0, first, last});
    run_bytes.push_back(bytes);
  }
}

// The layout's fetches summed by key (ExchangeLayout::by_key), once its
// pairs are numbered: the rows per (pair, key), in a dense per-pair table
// read back in order, and per run the KV heads its fetches' keys hold.
void key_sums(ExchangeLayout& out, const KeyHeads& keys, std::size_t K, std::size_t heads_kv) {
  const std::size_t n = out.pairs.size();
  thread_local std::vector<std::int64_t> rows;
  rows.assign(n * K, 0);
  std::vector<std::uint64_t> cell_keys(heads_kv, 0);
  std::vector<std::int64_t> cell_rows(heads_kv, 0);
  // A run's cells are at most its fetches where each key holds one KV head
  // (the list is not copied as it grows).
  out.dkv_cells.reserve(out.fetches.size());
  for (const ExchangeLayout::Run& r : out.runs) {
    std::int32_t lo = std::numeric_limits<std::int32_t>::max(), hi = 0;
    for (std::uint32_t i = r.first; i < r.last; ++i) {
      const ExchangeLayout::Fetch& f = out.fetches[i];
      const auto k = static_cast<std::size_t>(f.key);
      rows[r.pair * K + k] += f.rows;
      const HeadRange h = keys.group[k].kv_heads;
      if (h.size() == 0) continue;
      lo = std::min(lo, h.begin);
      hi = std::max(hi, h.end);
      for (auto kh = static_cast<std::size_t>(h.begin); kh < static_cast<std::size_t>(h.end); ++kh) {
        cell_keys[kh] |= std::uint64_t{1} << k;
        cell_rows[kh] = std::max(cell_rows[kh], f.rows);
      }
    }
    for (auto kh = static_cast<std::size_t>(std::max(lo, 0)); kh < static_cast<std::size_t>(hi); ++kh) {
      if (cell_keys[kh] == 0) continue;
      out.dkv_cells.push_back({r.back, static_cast<std::int32_t>(kh), cell_keys[kh], cell_rows[kh]});
      cell_keys[kh] = 0;
      cell_rows[kh] = 0;
    }
  }
  out.key_rows.reserve(std::min(n * K, out.fetches.size()));
  for (std::size_t j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < K; ++k) {
      const std::int64_t v = rows[j * K + k];
      if (v != 0) out.key_rows.push_back({static_cast<std::uint32_t>(j), static_cast<std::int32_t>(k), v});
    }
  }
}

// What a key's fetches add whatever their rows, per chunking: the chunks
// it has KV heads in (m, how many), the KV heads any of them has [lo, hi),
// and each such head's last chunk (-1: none has it).
struct KeyChunks {
  std::vector<std::pair<std::uint32_t, std::int32_t>> chunks;
  std::vector<std::uint32_t> chunks_at;  // key k's: chunks[chunks_at[k], chunks_at[k + 1])
  std::vector<HeadRange> heads;          // per key
  std::vector<std::int32_t> last;        // key k's heads from last[last_at[k]]
  std::vector<std::uint32_t> last_at;

  KeyChunks(std::span<const HeadRange> chunk_kv, std::size_t keys, std::size_t M) {
    chunks_at.push_back(0);
    for (std::size_t k = 0; k < keys; ++k) {
      std::int32_t lo = std::numeric_limits<std::int32_t>::max(), hi = 0;
      for (std::size_t m = 0; m < M; ++m) {
        const HeadRange h = chunk_kv[k * M + m];
        if (h.size() == 0) continue;
        chunks.emplace_back(static_cast<std::uint32_t>(m), h.size());
        lo = std::min(lo, h.begin);
        hi = std::max(hi, h.end);
      }
      chunks_at.push_back(static_cast<std::uint32_t>(chunks.size()));
      heads.push_back(lo < hi ? HeadRange{lo, hi} : HeadRange{});
      last_at.push_back(static_cast<std::uint32_t>(last.size()));
      last.resize(last.size() + static_cast<std::size_t>(heads.back().size()), -1);
      for (std::size_t m = 0; m < M; ++m) {
        const HeadRange h = chunk_kv[k * M + m];
        for (std::int32_t kh = h.begin; kh < h.end; ++kh) {
          last[last_at.back() + static_cast<std::size_t>(kh - lo)] = static_cast<std::int32_t>(m);
        }
      }
    }
  }
};

// exchange_sums' K/V part of one chunking: per fetched run, its tokens x
// KV heads per chunk, and each (run, KV head) place of its dK/dV once, with
// the latest chunk and the longest rows of the groups sharing it (as phase
// pricing and src/schedule/schedule.cpp return them). A head's place is the
// largest over the chunks that have it of its last use, or of the chunk
// where unused: its last use, or its last such chunk (integer maxima and
// sums, in any order).
struct KvSums {
  const Plan::Data& d;
  const KeyHeads& keys;
  const KeyChunks& kc;
  ExchangeSums& out;
  // Per KV head of the run being summed: -1 and 0 between runs (each run
  // resets the heads it touched, [lo, hi): a key holds a shard's heads).
  std::vector<std::int32_t> cell_last;
  std::vector<std::int64_t> cell_rows;

  // kDkv false: the K/V tokens x heads alone (no dK/dV places).
  template <bool kDkv>
  void run(const ExchangeLayout::Run& r, std::span<const ExchangeLayout::Fetch> fetches) {
    const std::size_t n = out.pairs.size();
    std::int64_t* const kv_token_heads = out.kv_token_heads.data() + r.pair;
    std::int32_t lo = std::numeric_limits<std::int32_t>::max(), hi = 0;
    for (const ExchangeLayout::Fetch& f : fetches) {
      const auto k = static_cast<std::size_t>(f.key);
      for (std::size_t c = kc.chunks_at[k]; c < kc.chunks_at[k + 1]; ++c) {
        kv_token_heads[kc.chunks[c].first * n] += f.rows * kc.chunks[c].second;
      }
      if constexpr (!kDkv) continue;
      const HeadRange h = kc.heads[k];
      if (h.size() == 0) continue;
      lo = std::min(lo, h.begin);
      hi = std::max(hi, h.end);
      const HeadRange kv = keys.group[k].kv_heads;
      const ChunkUse* uses = d.uses_of(f.entry, f.key);
      const std::int32_t* last_chunk = kc.last.data() + kc.last_at[k] - h.begin;
      for (std::int32_t kh = h.begin; kh < h.end; ++kh) {
        if (last_chunk[kh] < 0) continue;
        const ChunkUse use = uses[kh - kv.begin];
        auto& last = cell_last[static_cast<std::size_t>(kh)];
        last = std::max(last, use.used() ? use.last : last_chunk[kh]);
        cell_rows[static_cast<std::size_t>(kh)] = std::max(cell_rows[static_cast<std::size_t>(kh)], f.rows);
      }
    }
    if constexpr (!kDkv) return;
    // The dK/dV go back: worker `to` to `from`.
    for (auto kh = static_cast<std::size_t>(std::max(lo, 0)); kh < static_cast<std::size_t>(hi); ++kh) {
      if (cell_last[kh] >= 0) out.dkv_rows[static_cast<std::size_t>(cell_last[kh]) * n + r.back] += cell_rows[kh];
      cell_last[kh] = -1;
      cell_rows[kh] = 0;
    }
  }
};

// exchange_sums' K/V part from the layout's sums by key, where each key's
// chunks hold all its KV heads (then KvSums reads every fetch's KV heads,
// each with its key's last use: the same integer sums and maxima, grouped).
// False, nothing added, where a key's chunks miss one of its KV heads.
bool sums_by_key(const Plan::Data& d, const ExchangeLayout& layout, const KeyHeads& keys, const KeyChunks& kc, bool dkv,
                 ExchangeSums& out) {
  const std::size_t K = keys.group.size(), H = static_cast<std::size_t>(d.geometry->heads_kv);
  // Per (key, KV head): the chunk of its dK/dV (KvSums' `last` of one fetch).
  std::vector<std::int32_t> last(K * H, -1);
  for (std::size_t k = 0; k < K; ++k) {
    const HeadRange kv = keys.group[k].kv_heads, h = kc.heads[k];
    if (h.size() != kv.size() || (kv.size() > 0 && h.begin != kv.begin)) return false;
    const ChunkUse* uses = d.uses_of(0, static_cast<std::int32_t>(k));
    for (std::int32_t kh = kv.begin; kh < kv.end; ++kh) {
      const std::int32_t chunk = kc.last[kc.last_at[k] + static_cast<std::size_t>(kh - kv.begin)];
      if (chunk < 0) return false;
      const ChunkUse use = uses[kh - kv.begin];
      last[k * H + static_cast<std::size_t>(kh)] = use.used() ? use.last : chunk;
    }
  }
  const std::size_t n = out.pairs.size();
  std::int64_t* const kv_token_heads = out.kv_token_heads.data();
  for (const ExchangeLayout::KeyRows& e : layout.key_rows) {
    const auto k = static_cast<std::size_t>(e.key);
    for (std::size_t c = kc.chunks_at[k]; c < kc.chunks_at[k + 1]; ++c) {
      kv_token_heads[kc.chunks[c].first * n + e.pair] += e.rows * kc.chunks[c].second;
    }
  }
  if (!dkv) return true;
  std::int64_t* const dkv_rows = out.dkv_rows.data();
  for (const ExchangeLayout::DkvCell& c : layout.dkv_cells) {
    std::int32_t at = -1;
    for (std::uint64_t w = c.keys; w != 0; w &= w - 1) {
      at = std::max(at, last[static_cast<std::size_t>(std::countr_zero(w)) * H + static_cast<std::size_t>(c.kv_head)]);
    }
    dkv_rows[static_cast<std::size_t>(at) * n + c.back] += c.rows;
  }
  return true;
}

}  // namespace

std::ptrdiff_t ExchangeSums::find(std::uint32_t pair) const {
  const auto it = std::lower_bound(pairs.begin(), pairs.end(), pair);
  return it != pairs.end() && *it == pair ? it - pairs.begin() : -1;
}

std::vector<std::int64_t> ExchangeSums::dense(const std::vector<std::int64_t>& per_pair, int m) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(workers) * static_cast<std::size_t>(workers), 0);
  for (std::size_t j = 0; j < pairs.size(); ++j) out[pairs[j]] = per_pair[static_cast<std::size_t>(m) * pairs.size() + j];
  return out;
}

ExchangeLayout exchange_layout(const Plan::Data& d) {
  const Geometry& g = *d.geometry;
  const auto W = static_cast<std::size_t>(g.workers);
  ExchangeLayout out;
  out.workers = g.workers;
  out.groups = d.groups.size();
  out.entries = d.worker_group_ids.size();
  // First the pairs (tiles away from home, runs fetched), then the sums.
  PairIndex index(W);
  // The tiles away from home, kept (the thread's list) for their bytes once
  // the pairs are numbered: the tiles are walked once.
  struct Away {
    std::uint32_t pair;
    std::int32_t heads;
    std::int64_t rows;
  };
  thread_local std::vector<Away> away;
  away.clear();
  for (const Tile& t : d.tiles) {
    if (t.worker == t.home) continue;
    index.mark(static_cast<std::size_t>(t.home), static_cast<std::size_t>(t.worker));
    away.push_back({static_cast<std::uint32_t>(static_cast<std::size_t>(t.home) * W + static_cast<std::size_t>(t.worker)),
                    t.heads.size(), t.end - t.begin});
  }
  // One pass over the samples: their runs' pairs and fetches together.
  // A key's K/V bytes per row (integer products: the same bytes).
  const KeyHeads keys = key_heads(g);
  std::vector<std::int64_t> key_row_bytes;
  for (const KvGroup& k : keys.group) key_row_bytes.push_back(kv_bytes(g, 1, k.kv_heads.size()));
  // The thread's (reused across plans: only this call reads it).
  thread_local std::vector<std::int64_t> run_bytes;
  run_bytes.clear();
  // At most every run of a sample for each of its groups: reserved, so the
  // lists are not copied as they grow.
  std::size_t most_runs = 0, most_fetches = 0;
  const std::span<const SampleGroups> samples = sample_groups(d, g, most_runs, most_fetches);
  out.runs.reserve(most_runs);
  run_bytes.reserve(most_runs);
  out.fetches.reserve(most_fetches);
  for (const SampleGroups& s : samples) add_fetches(d, g, key_row_bytes, index, s, out, run_bytes);
  index.number(out);
  out.bytes.assign(out.pairs.size(), 0);
  out.qo_rows.assign(out.pairs.size(), 0);
  for (const Away& t : away) {
    const std::uint32_t pair = index(t.pair);
    const std::int64_t qo = qo_bytes(g, t.rows, t.heads);
    out.bytes[pair] += qo;
    out.bytes[out.reverse[pair]] += qo;
    out.qo_rows[pair] += t.rows;
  }
  // The runs' pairs numbered (integer byte sums: their order is free).
  for (std::size_t i = 0; i < out.runs.size(); ++i) {
    ExchangeLayout::Run& r = out.runs[i];
    r.pair = index(r.pair);
    r.back = out.reverse[r.pair];
    out.bytes[r.pair] += run_bytes[i];
  }
  const auto K = static_cast<std::size_t>(g.keys_per_sample);
  out.by_key = d.kv_uses_by_key && K <= 64;
  if (out.by_key) key_sums(out, keys, K, static_cast<std::size_t>(g.heads_kv));
  return out;
}

ExchangeSums exchange_sums(const Plan::Data& d) { return exchange_sums(d, exchange_layout(d)); }

ExchangeSums exchange_sums(const Plan::Data& d, const ExchangeLayout& layout, bool dkv) {
  const Geometry& g = *d.geometry;
  if (layout.workers != g.workers || layout.groups != d.groups.size() || layout.entries != d.worker_group_ids.size()) {
    throw std::logic_error("exchange_sums: the layout is another plan's");
  }
  const auto M = static_cast<std::size_t>(d.config.chunks);
  const std::size_t n = layout.pairs.size();
  ExchangeSums out;
  out.workers = g.workers;
  out.chunks = d.config.chunks;
  out.head_dim = g.head_dim;
  out.elem_bytes = g.elem_bytes;
  out.pairs = layout.pairs;
  out.reverse = layout.reverse;
  out.src = layout.src;
  out.dst = layout.dst;
  out.bytes = layout.bytes;
  out.qo_row_heads.resize(M * n);
  out.kv_token_heads.assign(M * n, 0);
  if (dkv) out.dkv_rows.assign(M * n, 0);
  // Every tile has a shard's heads, so a pair's Q/O row-heads in chunk m
  // are its rows times the chunk's heads (integers: the same sums).
  const std::vector<std::int32_t> at = chunk_head_table(g, d.config);
  for (std::size_t m = 0; m < M; ++m) {
    // Through locals: the loop is not reloading the vectors and `at`.
    const std::int64_t heads = at[m + 1] - at[m];
    const std::int64_t* const rows = layout.qo_rows.data();
    std::int64_t* const into = out.qo_row_heads.data() + m * n;
    for (std::size_t j = 0; j < n; ++j) into[j] = rows[j] * heads;
  }
  const KeyHeads keys = key_heads(g);
  const std::vector<HeadRange> chunk_kv = chunk_kv_table(g, d.config, keys);
  const KeyChunks kc(chunk_kv, static_cast<std::size_t>(g.keys_per_sample), M);
  if (layout.by_key && d.kv_uses_by_key && sums_by_key(d, layout, keys, kc, dkv, out)) return out;
  KvSums kv{d, keys, kc, out, std::vector<std::int32_t>(static_cast<std::size_t>(g.heads_kv), -1),
            std::vector<std::int64_t>(static_cast<std::size_t>(g.heads_kv), 0)};
  const std::span<const ExchangeLayout::Fetch> fetches(layout.fetches);
  for (const ExchangeLayout::Run& r : layout.runs) {
    if (dkv) {
      kv.run<true>(r, fetches.subspan(r.first, r.last - r.first));
    } else {
      kv.run<false>(r, fetches.subspan(r.first, r.last - r.first));
    }
  }
  return out;
}

}  // namespace detail

Result<Plan> make_plan(std::span<const PackedSequence> pool, const PlanConfig& config) {
  LIBRA_ASSIGN_OR_RETURN(detail::Geometry geo, detail::make_geometry(pool, config));
  LIBRA_ASSIGN_OR_RETURN(std::vector<detail::PlacedRows> rows, detail::place_tiles(geo, config));
  // The placers cut every block exactly and return the rows in order (the
  // contract's tile-for-tile tests hold them to it); rows from outside go
  // through check_rows.
  assert(std::is_sorted(rows.begin(), rows.end(), detail::rows_before) && detail::check_rows(geo, rows, "plan").ok());
  return detail::build_plan(pool, config, std::move(geo), rows);
}

Result<Plan> rechunk_plan(const Plan& plan, int chunks) { return rechunk_plan(plan, chunks, plan.config().chunk_split); }

Result<Plan> rechunk_plan(const Plan& plan, int chunks, ChunkSplit split) {
  PlanConfig config = plan.config();
  config.chunks = chunks;
  config.chunk_split = split;
  // The geometry reads no chunk setting: the plan's own, once the new
  // chunking is checked (make_geometry's first step).
  LIBRA_TRY(validate_plan_config(config));
  return detail::rechunk_data(plan.data_as_built(), config);
}

// ---- accessors -------------------------------------------------------------

namespace {

// The plan's data with its exchange derived: the first caller derives it,
// concurrent callers wait for it, later ones pay one acquire load.
const Plan::Data& with_exchange(const Plan::Data& d) {
  if (!d.exchange_ready.load(std::memory_order_acquire)) {
    std::call_once(d.exchange_once, [&d] {
      detail::derive_exchange(d);
      d.exchange_ready.store(true, std::memory_order_release);
    });
  }
  return d;
}

}  // namespace

const Plan::Data& Plan::data() const { return with_exchange(*d_); }
const Plan::Data& Plan::data_as_built() const { return *d_; }
const PlanConfig& Plan::config() const { return d_->config; }
int Plan::pool_size() const { return d_->pool_size; }
int Plan::num_workers() const { return d_->num_workers; }
int Plan::head_width() const { return d_->head_width; }
std::span<const PackedSequence> Plan::pool() const { return d_->pool; }
std::span<const Tile> Plan::tiles() const { return d_->tiles; }
std::span<const Fragment> Plan::fragments() const {
  const Data& d = *d_;
  std::call_once(d.fragments_once, [&d] { detail::spell_fragments(d); });
  return {d.fragments.data(), d.fragments.size()};
}
std::span<const KvGroup> Plan::groups() const { return {d_->groups.data(), d_->groups.size()}; }

std::span<const std::int32_t> Plan::worker_tiles(int r) const {
  const Data& d = *d_;
  std::call_once(d.worker_tiles_once, [&d] { detail::list_worker_tiles(d); });
  const auto& o = d.worker_tile_offsets;
  return std::span<const std::int32_t>(d.worker_tile_ids).subspan(o[r], o[r + 1] - o[r]);
}
std::span<const std::int32_t> Plan::worker_groups(int r) const {
  const auto& o = d_->worker_group_offsets;
  return std::span<const std::int32_t>(d_->worker_group_ids.data() + o[r], o[r + 1] - o[r]);
}
std::span<const std::int64_t> Plan::worker_flops() const { return d_->worker_flops; }
double Plan::imbalance() const { return d_->imbalance; }
std::int64_t Plan::comm_bytes() const { return with_exchange(*d_).comm_bytes; }
std::span<const std::int64_t> Plan::byte_matrix() const { return with_exchange(*d_).byte_matrix; }
std::int64_t Plan::bytes(int src, int dst) const {
  return with_exchange(*d_).byte_matrix[static_cast<std::size_t>(src) * d_->num_workers + dst];
}
std::int64_t Plan::send_bytes(int r) const {
  const auto& m = with_exchange(*d_).byte_matrix;
  const std::size_t W = static_cast<std::size_t>(d_->num_workers);
  std::int64_t s = 0;
  for (std::size_t dst = 0; dst < W; ++dst) s += m[static_cast<std::size_t>(r) * W + dst];
  return s;
}
std::int64_t Plan::recv_bytes(int r) const {
  const auto& m = with_exchange(*d_).byte_matrix;
  const std::size_t W = static_cast<std::size_t>(d_->num_workers);
  std::int64_t s = 0;
  for (std::size_t src = 0; src < W; ++src) s += m[src * W + static_cast<std::size_t>(r)];
  return s;
}
std::span<const Transfer> Plan::transfers(int src, int dst) const {
  const Data& d = with_exchange(*d_);
  const std::size_t b = static_cast<std::size_t>(src) * d.num_workers + dst;
  const auto& o = d.transfer_offsets;
  return std::span<const Transfer>(d.transfers).subspan(o[b], o[b + 1] - o[b]);
}
std::span<const Transfer> Plan::all_transfers() const { return with_exchange(*d_).transfers; }
std::span<const TierBytes> Plan::tier_bytes() const { return with_exchange(*d_).tier_bytes; }
int Plan::busiest_receiver() const { return with_exchange(*d_).busiest_receiver; }
std::int64_t Plan::max_recv_cross_node() const { return with_exchange(*d_).max_recv_cross_node; }

ChunkUse Plan::kv_use(int r, std::int32_t group, std::int32_t kv_head) const {
  if (r < 0 || r >= d_->num_workers) return {};
  const auto ids = worker_groups(r);
  const auto it = std::lower_bound(ids.begin(), ids.end(), group);
  if (it == ids.end() || *it != group) return {};
  const KvGroup& g = d_->groups[static_cast<std::size_t>(group)];
  if (kv_head < g.kv_heads.begin || kv_head >= g.kv_heads.end) return {};
  const std::size_t k = d_->worker_group_offsets[static_cast<std::size_t>(r)] + static_cast<std::size_t>(it - ids.begin());
  const std::int32_t key = group % d_->geometry->keys_per_sample;
  return d_->uses_of(k, key)[kv_head - g.kv_heads.begin];
}

TokenSpan Plan::kv_span(int r, std::int32_t group) const {
  if (r < 0 || r >= d_->num_workers) return {};
  const auto ids = worker_groups(r);
  const auto it = std::lower_bound(ids.begin(), ids.end(), group);
  if (it == ids.end() || *it != group) return {};
  const std::size_t k = d_->worker_group_offsets[static_cast<std::size_t>(r)] + static_cast<std::size_t>(it - ids.begin());
  return {d_->groups[static_cast<std::size_t>(group)].begin, d_->span_end(k, group)};
}

HeadRange Plan::chunk_heads(const Tile& tile, int m) const {
  const PlanConfig& c = d_->config;
  const std::int32_t w = tile.heads.size();
  return {tile.heads.begin + chunk_head_offset(w, c.chunks, c.chunk_split, m),
          tile.heads.begin + chunk_head_offset(w, c.chunks, c.chunk_split, m + 1)};
}

HeadRange Plan::chunk_kv_heads(HeadRange shard_heads, HeadRange kv_heads, int m) const {
  return detail::chunk_kv_heads_of(d_->config, shard_heads, kv_heads, m);
}

std::span<const Transfer> Plan::chunk_transfers(int m, int src, int dst) const {
  const Data& d = with_exchange(*d_);
  const std::size_t W = static_cast<std::size_t>(d.num_workers);
  const std::size_t b = (static_cast<std::size_t>(m) * W + static_cast<std::size_t>(src)) * W + dst;
  const auto& o = d.chunk_offsets;
  return std::span<const Transfer>(d.chunk_transfers.data() + o[b], o[b + 1] - o[b]);
}
std::int64_t Plan::chunk_bytes(int m, int src, int dst) const {
  const Data& d = with_exchange(*d_);
  const std::size_t W = static_cast<std::size_t>(d.num_workers);
  return d.chunk_byte_matrix[(static_cast<std::size_t>(m) * W + static_cast<std::size_t>(src)) * W + dst];
}
std::uint64_t Plan::fingerprint() const {
  const Data& d = *d_;
  std::call_once(d.fingerprint_once, [&d] {
    detail::WordHash hash;
    detail::for_each_canonical_word(d.config, d.pool, std::span<const Tile>(d.tiles), hash);
    d.fingerprint = hash.value();
  });
  return d.fingerprint;
}

}  // namespace libra
