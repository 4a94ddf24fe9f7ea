// SH-Tiles and their placement: configuration checks, pool geometry, and
// the three placers (tap, ulysses, tap-split).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "libra/checked.hpp"
#include "tiles/plan_internal.hpp"

namespace libra {

std::string_view plan_mode_name(PlanMode mode) {
  switch (mode) {
    case PlanMode::kTap:
      return "tap";
    case PlanMode::kUlysses:
      return "ulysses";
    case PlanMode::kTapSplit:
      return "tap-split";
    case PlanMode::kTapTopo:
      return "tap-topo";
  }
  return "unknown";
}

Result<PlanMode> parse_plan_mode(std::string_view name) {
  for (PlanMode m : {PlanMode::kTap, PlanMode::kUlysses, PlanMode::kTapSplit, PlanMode::kTapTopo}) {
    if (name == plan_mode_name(m)) return m;
  }
  return invalid_input("plan mode '" + std::string(name) + "': must be one of tap, ulysses, tap-split, tap-topo");
}

std::string_view home_layout_name(HomeLayout layout) {
  switch (layout) {
    case HomeLayout::kContiguous:
      return "contiguous";
    case HomeLayout::kZigzag:
      return "zigzag";
  }
  return "unknown";
}

Result<HomeLayout> parse_home_layout(std::string_view name) {
  for (HomeLayout l : {HomeLayout::kContiguous, HomeLayout::kZigzag}) {
    if (name == home_layout_name(l)) return l;
  }
  return invalid_input("home layout '" + std::string(name) + "': must be contiguous or zigzag");
}

std::string_view chunk_split_name(ChunkSplit split) {
  switch (split) {
    case ChunkSplit::kEqual: return "equal";
    case ChunkSplit::kTapered: return "tapered";
  }
  return "unknown";
}

Result<ChunkSplit> parse_chunk_split(std::string_view name) {
  for (ChunkSplit c : {ChunkSplit::kEqual, ChunkSplit::kTapered}) {
    if (name == chunk_split_name(c)) return c;
  }
  return invalid_input("chunk split '" + std::string(name) + "': must be equal or tapered");
}

namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

Error config_error(const std::string& rule) { return invalid_input("plan config: " + rule); }

// Contract section 8's rule for the equal cut, the tapered cut's own
// otherwise; `width` is the heads of one tile (`what` names it).
Status check_chunk_cut(const PlanConfig& c, std::int32_t width, const std::string& what, const std::string& mode) {
  if (c.chunk_split == ChunkSplit::kEqual) {
    if (width % c.chunks != 0) return config_error(mode + "chunks " + str(c.chunks) + " must divide " + what + " = " + str(width));
    return Status{};
  }
  if (c.chunk_split != ChunkSplit::kTapered) {
    return config_error("unknown chunk split " + str(static_cast<int>(c.chunk_split)));
  }
  if (c.chunks < 3 || c.chunks > width) {
    return config_error(mode + "tapered chunks need 3 <= chunks <= " + what + " = " + str(width) + " (chunks is " +
                        str(c.chunks) + ")");
  }
  return Status{};
}

// Upper bounds on the pool: the byte matrix is W x W and the per-chunk
// transfer index M x W x W.
constexpr int kMaxWorkers = 1024;
constexpr std::int64_t kMaxChunkBuckets = std::int64_t{1} << 23;

}  // namespace

Status check_zigzag_homes(std::int64_t seq_len, int cp, std::int64_t block_size) {
  const std::int64_t two_cp = 2 * static_cast<std::int64_t>(cp);
  if (seq_len < 1 || cp < 1 || block_size < 1) {
    return config_error("home_layout zigzag: seq_len " + str(seq_len) + ", cp " + str(cp) + " and block_size " +
                        str(block_size) + " must be positive");
  }
  if (seq_len % two_cp != 0) {
    return config_error("home_layout zigzag: seq_len " + str(seq_len) + " must be divisible by 2 cp = " + str(two_cp));
  }
  if ((seq_len / two_cp) % block_size != 0) {
    return config_error("home_layout zigzag: seq_len / (2 cp) = " + str(seq_len / two_cp) +
                        " must be divisible by block_size " + str(block_size));
  }
  return {};
}

Status validate_plan_config(const PlanConfig& c) {
  const AttentionShape& s = c.shape;
  if (c.seq_len < 1) return config_error("seq_len " + str(c.seq_len) + " must be positive");
  if (c.cp < 1) return config_error("cp " + str(c.cp) + " must be positive");
  if (c.block_size < 1) return config_error("block_size " + str(c.block_size) + " must be positive");
  if (c.head_shards < 1) return config_error("head_shards " + str(c.head_shards) + " must be positive");
  if (s.heads_q < 1) return config_error("heads_q " + str(s.heads_q) + " must be positive");
  if (s.heads_kv < 1) return config_error("heads_kv " + str(s.heads_kv) + " must be positive");
  if (s.head_dim < 1) return config_error("head_dim " + str(s.head_dim) + " must be positive");
  if (static_cast<int>(s.dtype) > static_cast<int>(DType::kF16)) return config_error("dtype " + str(static_cast<int>(s.dtype)) + " is not fp32, bf16 or fp16");
  if (s.window < 1) return config_error("window " + str(s.window) + " must be positive");
  if (!std::isfinite(c.tau) || c.tau < 0) {
    return config_error("tau " + std::to_string(c.tau) + " must be a finite number >= 0");
  }
  if (c.chunks < 1) return config_error("chunks " + str(c.chunks) + " must be positive");
  if (s.heads_q % s.heads_kv != 0) {
    return config_error("heads_kv " + str(s.heads_kv) + " must divide heads_q " + str(s.heads_q));
  }
  if (c.seq_len % c.cp != 0) {
    return config_error("seq_len " + str(c.seq_len) + " must be divisible by cp " + str(c.cp));
  }
  if ((c.seq_len / c.cp) % c.block_size != 0) {
    return config_error("seq_len / cp = " + str(c.seq_len / c.cp) + " must be divisible by block_size " +
                        str(c.block_size));
  }
  if (s.heads_q % c.head_shards != 0) {
    return config_error("head_shards " + str(c.head_shards) + " must divide heads_q " + str(s.heads_q));
  }
  if (c.head_shards % s.heads_kv != 0 && s.heads_kv % c.head_shards != 0) {
    return config_error("head_shards " + str(c.head_shards) + " and heads_kv " + str(s.heads_kv) +
                        ": one must divide the other");
  }
  LIBRA_TRY(check_chunk_cut(c, s.heads_q / c.head_shards, "heads_q / head_shards", ""));
  if (c.home_layout == HomeLayout::kZigzag) {
    LIBRA_TRY(check_zigzag_homes(c.seq_len, c.cp, c.block_size));
  } else if (c.home_layout != HomeLayout::kContiguous) {
    return config_error("unknown home layout " + str(static_cast<int>(c.home_layout)));
  }
  if (c.mode == PlanMode::kUlysses) {
    if (s.heads_q % c.cp != 0) {
      return config_error("mode ulysses: cp " + str(c.cp) + " must divide heads_q " + str(s.heads_q));
    }
    if (c.cp % s.heads_kv != 0 && s.heads_kv % c.cp != 0) {
      return config_error("mode ulysses: cp " + str(c.cp) + " and heads_kv " + str(s.heads_kv) +
                          ": one must divide the other");
    }
    LIBRA_TRY(check_chunk_cut(c, s.heads_q / c.cp, "heads_q / cp", "mode ulysses: "));
  }
  if (c.mode != PlanMode::kTap && c.mode != PlanMode::kUlysses && c.mode != PlanMode::kTapSplit &&
      c.mode != PlanMode::kTapTopo) {
    return config_error("unknown plan mode " + str(static_cast<int>(c.mode)));
  }
  const PlanTopology& t = c.topology;
  if (t.gpus_per_node < 1) return config_error("topology gpus_per_node " + str(t.gpus_per_node) + " must be positive");
  if (t.nodes_per_supernode < 1) {
    return config_error("topology nodes_per_supernode " + str(t.nodes_per_supernode) + " must be positive");
  }
  for (auto [name, v] : {std::pair{"intra_node_gbps", t.intra_node_gbps}, std::pair{"inter_node_gbps", t.inter_node_gbps},
                         std::pair{"inter_supernode_gbps", t.inter_supernode_gbps}}) {
    if (!std::isfinite(v) || !(v > 0)) {
      return config_error(std::string("topology ") + name + " " + std::to_string(v) + " must be a finite number > 0");
    }
  }
  if (!std::isfinite(t.congestion_per_node) || t.congestion_per_node < 0) {
    return config_error("topology congestion_per_node " + std::to_string(t.congestion_per_node) +
                        " must be a finite number >= 0");
  }
  return {};
}

namespace detail {

std::int32_t Geometry::sample_at(int p, std::int64_t x) const {
  const auto first = starts.begin() + sample_base[p];
  const auto last = starts.begin() + sample_base[p + 1];
  return static_cast<std::int32_t>(std::upper_bound(first, last, x) - starts.begin() - 1);
}

std::int64_t Geometry::rows_flops(int p, std::int64_t begin, std::int64_t end, std::int32_t first) const {
  // make_geometry bounded the whole pool's FLOPs, so no partial sum overflows.
  std::int64_t pairs = 0;
  for (std::int32_t j = first; j < sample_base[p + 1] && starts[j] < end; ++j) {
    const std::int64_t o = starts[j];
    const std::int64_t lo = std::max(begin, o) - o;
    const std::int64_t hi = std::min(end, o + lengths[j]) - o;
    pairs += this->pairs(j, lo, hi);
  }
  return pairs * head_width;
}

namespace {

// The pool's size against the limits the plan's index types set.
Status check_pool_size(std::span<const PackedSequence> pool, const PlanConfig& config) {
  if (pool.empty()) return invalid_input("pool: empty; a pool needs at least one slot");
  const std::int64_t workers = static_cast<std::int64_t>(pool.size()) * config.cp;
  if (workers > kMaxWorkers) {
    return invalid_input("pool: " + str(static_cast<std::int64_t>(pool.size())) + " slots x cp " + str(config.cp) +
                         " = " + str(workers) + " workers; at most " + str(kMaxWorkers) + " are supported");
  }
  if (workers * workers * config.chunks > kMaxChunkBuckets) {
    return invalid_input("pool: chunks " + str(config.chunks) + " x " + str(workers) + "^2 worker pairs exceeds the "
                         "supported " + str(kMaxChunkBuckets) + " per-chunk transfer lists");
  }
  return Status();
}

// The geometry's sizes and shape, from the configuration alone.
Geometry geometry_shape(std::size_t slots, const PlanConfig& config) {
  Geometry g;
  g.pool_size = static_cast<int>(slots);
  g.cp = config.cp;
  g.workers = g.pool_size * config.cp;
  g.shards = config.mode == PlanMode::kUlysses ? config.cp : config.head_shards;
  g.head_width = config.shape.heads_q / g.shards;
  g.group_size = config.shape.heads_q / config.shape.heads_kv;
  g.heads_kv = config.shape.heads_kv;
  g.dedup_per_kv_head = config.dedup_per_kv_head;
  g.keys_per_sample = (config.dedup_per_kv_head && g.shards > g.heads_kv) ? g.heads_kv : g.shards;
  g.seq_len = config.seq_len;
  g.shard_len = config.seq_len / config.cp;
  g.map = config.home_map();
  g.block_size = config.block_size;
  g.head_dim = config.shape.head_dim;
  g.elem_bytes = config.shape.elem_bytes();
  g.window = config.shape.window;
  return g;
}

// What the pool holds in all, for the range checks.
struct PoolTotals {
  std::int64_t samples = 0, tokens = 0, pairs = 0;
};

// Slot p's samples: starts, lengths and pair counts, each checked.
Status add_slot(Geometry& g, const PackedSequence& seq, std::size_t p, PoolTotals& totals) {
  // Spelled only for an error (this runs once per slot of every plan).
  auto where = [p] { return "pool slot " + str(static_cast<std::int64_t>(p)); };
  if (seq.empty()) return invalid_input(where() + ": packed sequence is empty; every slot needs a sample");
  std::int64_t t = 0;
  for (std::size_t j = 0; j < seq.size(); ++j) {
    const std::int64_t l = seq[j];
    if (l <= 0) {
      return invalid_input(where() + ", sample " + str(static_cast<std::int64_t>(j)) + ": length " + str(l) +
                           " must be positive");
    }
    if (l > g.seq_len - t) {
      return invalid_input(where() + ": sequence is longer than seq_len " + str(g.seq_len) + " (exceeded at sample " +
                           str(static_cast<std::int64_t>(j)) + ")");
    }
    g.starts.push_back(t);
    g.lengths.push_back(l);
    // The whole sample's causal pairs, checked; the usual case (plain causal
    // and l < 2^31: l (l + 1) / 2 cannot overflow) without a Result.
    std::int64_t pairs = 0;
    if (g.window == kFullCausal && l < (std::int64_t{1} << 31)) {
      pairs = plain_causal_pairs(0, l);
    } else {
      const Result<std::int64_t> checked = causal_pairs(0, l, g.window);
      if (!checked.ok()) return invalid_input(where() + ": " + checked.error().message());
      pairs = *checked;
    }
    auto sum = checked_add(totals.pairs, pairs);
    if (!sum) return invalid_input(where() + ": causal pair count of the pool exceeds the 64-bit range");
    totals.pairs = *sum;
    g.whole_pairs.push_back(pairs);
    t += l;
  }
  totals.samples += static_cast<std::int64_t>(seq.size());
  if (totals.samples * g.keys_per_sample > std::numeric_limits<std::int32_t>::max()) {
    return invalid_input(where() + ": too many samples in the pool (KV groups exceed 2^31 - 1)");
  }
  g.tokens.push_back(t);
  totals.tokens += t;
  g.sample_base.push_back(static_cast<std::int32_t>(totals.samples));
  return Status();
}

Result<PoolTotals> add_samples(Geometry& g, std::span<const PackedSequence> pool) {
  std::size_t samples = 0;
  for (const PackedSequence& seq : pool) samples += seq.size();
  g.starts.reserve(samples);
  g.lengths.reserve(samples);
  g.whole_pairs.reserve(samples);
  g.run_base.reserve(samples + 1);
  g.tokens.reserve(pool.size());
  g.sample_base.reserve(pool.size() + 1);
  g.sample_base.push_back(0);
  PoolTotals totals;
  for (std::size_t p = 0; p < pool.size(); ++p) LIBRA_TRY(add_slot(g, pool[p], p, totals));
  return totals;
}

// The sample holding each block's first row, slot by slot.
void index_blocks(Geometry& g, std::int64_t total_tokens) {
  g.block_base.reserve(static_cast<std::size_t>(g.pool_size) + 1);
  g.block_base.push_back(0);
  g.block_first.reserve(static_cast<std::size_t>(total_tokens / g.block_size) + static_cast<std::size_t>(g.pool_size));
  for (int p = 0; p < g.pool_size; ++p) {
    std::int32_t j = g.sample_base[static_cast<std::size_t>(p)];
    const std::int32_t stop = g.sample_base[static_cast<std::size_t>(p) + 1];
    const std::int64_t tokens = g.tokens[static_cast<std::size_t>(p)];
    for (std::int64_t x = 0; x < tokens; x += g.block_size) {
      while (j + 1 < stop && g.starts[static_cast<std::size_t>(j) + 1] <= x) ++j;
      g.block_first.push_back(j);
    }
    g.block_base.push_back(static_cast<std::int32_t>(g.block_first.size()));
  }
}

// Each sample's home runs: (rows, CP rank) pieces in order. A slot's
// samples tile its rows in order, so the home run holding one sample's end
// holds the next one's start: rows are located (two divisions) only where a
// run ends, about 2 CP times a slot, not once per sample.
void index_runs(Geometry& g) {
  // Every sample has a run, and each home run boundary inside a slot adds one.
  g.runs.reserve(g.starts.size() + static_cast<std::size_t>(g.pool_size) * 2 * static_cast<std::size_t>(g.cp));
  g.run_base.push_back(0);
  for (int p = 0; p < g.pool_size; ++p) {
    HomeSpot h;  // run_end 0: located at the slot's first row
    const auto stop_j = static_cast<std::size_t>(g.sample_base[static_cast<std::size_t>(p) + 1]);
    for (auto j = static_cast<std::size_t>(g.sample_base[static_cast<std::size_t>(p)]); j < stop_j; ++j) {
      const std::int64_t stop = g.starts[j] + g.lengths[j];
      for (std::int64_t x = g.starts[j]; x < stop;) {
        if (x >= h.run_end) h = g.map.locate(x);
        const std::int64_t y = std::min(stop, h.run_end);
        g.runs.push_back({x, y, h.rank});
        x = y;
      }
      g.run_base.push_back(static_cast<std::int32_t>(g.runs.size()));
    }
  }
}

// Every FLOP and byte count the planners compute is bounded by these
// totals, so the hot loops can use plain int64 arithmetic.
Status check_totals(const Geometry& g, const PlanConfig& config, const PoolTotals& totals) {
  if (!checked_mul(totals.pairs, config.shape.heads_q)) {
    return invalid_input("pool: total attention FLOPs exceed the 64-bit range");
  }
  const long double kv_bound = static_cast<long double>(g.workers) * static_cast<long double>(totals.tokens) *
                               g.keys_per_sample * 2.0L * g.heads_kv * g.head_dim * g.elem_bytes;
  const long double qo_bound = 2.0L * static_cast<long double>(totals.tokens) * config.shape.heads_q * g.head_dim *
                               g.elem_bytes;
  if (kv_bound + qo_bound > static_cast<long double>(std::numeric_limits<std::int64_t>::max() / 4)) {
    return invalid_input("pool: exchange byte counts may exceed the 64-bit range for this configuration");
  }
  std::int64_t tiles = 0;
  for (int p = 0; p < g.pool_size; ++p) tiles += static_cast<std::int64_t>(g.blocks(p)) * g.shards;
  if (tiles > std::numeric_limits<std::int32_t>::max() / 2) {
    return invalid_input("pool: " + str(tiles) + " tiles; at most 2^30 are supported");
  }
  return Status();
}

}  // namespace

Result<Geometry> make_geometry(std::span<const PackedSequence> pool, const PlanConfig& config) {
  LIBRA_TRY(validate_plan_config(config));
  LIBRA_TRY(check_pool_size(pool, config));
  Geometry g = geometry_shape(pool.size(), config);
  LIBRA_ASSIGN_OR_RETURN(const PoolTotals totals, add_samples(g, pool));
  index_blocks(g, totals.tokens);
  index_runs(g);
  LIBRA_TRY(check_totals(g, config, totals));
  return g;
}

namespace {

std::int64_t largest_at_most(double c) {
  if (!(c < 9.2e18)) return std::numeric_limits<std::int64_t>::max();
  auto x = static_cast<std::int64_t>(std::floor(c));
  while (static_cast<double>(x) > c) --x;
  while (static_cast<double>(x + 1) <= c) ++x;
  return x;
}

// TAP's running state: loads and the committed KV groups C_r as a bitset
// (group-major, so a tile's groups are tested for all workers close together).
class Placer {
 public:
  Placer(const Geometry& geo, double capacity)
      : geo_(geo),
        capacity_(capacity),
        words_((static_cast<std::size_t>(geo.workers) + 63) / 64),
        loads_(static_cast<std::size_t>(geo.workers), 0),
        committed_(static_cast<std::size_t>(geo.sample_base.back()) * geo.keys_per_sample * words_, 0),
        saved_(static_cast<std::size_t>(geo.workers), 0),
        leaves_(std::bit_ceil(static_cast<std::size_t>(geo.workers))),
        tree_(geo.workers > kScanWorkers),
        least_(tree_ ? 2 * leaves_ : 0,
               Least{std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int32_t>::max()}),
        limit_(largest_at_most(capacity)),
        home_runs_(geo.runs.size()) {
    // Per shard (they cost divisions): the dedup key and the KV bytes per token.
    for (int s = 0; s < geo.shards; ++s) {
      shard_key_.push_back(geo.key_index(s));
      shard_vkv_.push_back(geo.kv_bytes_per_token(s));
    }
    if (!tree_) {
      for (int r = 0; r < geo.workers; r += kRunWorkers) run_least_.push_back(r);  // every load is 0
    }
    for (int p = 0; p < geo.pool_size; ++p) {
      const auto slot_base = static_cast<std::uint32_t>(p * geo.cp);
      const std::int32_t stop = geo.run_base[static_cast<std::size_t>(geo.sample_base[static_cast<std::size_t>(p) + 1])];
      for (std::int32_t u = geo.run_base[static_cast<std::size_t>(geo.sample_base[static_cast<std::size_t>(p)])]; u < stop; ++u) {
        const Geometry::Run& run = geo.runs[static_cast<std::size_t>(u)];
        home_runs_.put(static_cast<std::size_t>(u), {slot_base + static_cast<std::uint32_t>(run.rank), run.end - run.begin});
      }
    }
    if (tree_) {
      for (std::size_t i = 0; i < static_cast<std::size_t>(geo.workers); ++i) {
        least_[leaves_ + i] = {0, static_cast<std::int32_t>(i)};
      }
      for (std::size_t i = leaves_ - 1; i >= 1; --i) least_[i] = lesser(least_[2 * i], least_[2 * i + 1]);
    }
    touched_.resize(static_cast<std::size_t>(geo.workers) + 1);
    kept_.resize(static_cast<std::size_t>(geo.workers) + 1);
  }

  struct Choice {
    int worker = -1;  // best in the headroom set, or -1 if it is empty
    int fallback = 0; // minimum of (load, dcomm, r)
  };

  // Loads the fragments of rows [begin, end) of (p, s) and evaluates every
  // worker for a tile of `flops` with Q-home `home`. A worker's dcomm is
  // "every group at full size, plus Q and O" (the base) minus what it saves:
  // Q and O at home, a committed group, its local tokens of a group. Every
  // saving is positive, so only the few workers that save anything can beat
  // the base: they are evaluated one by one, and when none of them has
  // headroom, every worker with headroom is at the base and the choice is the
  // least-loaded worker (lowest id on ties): a scan of the least of every
  // run of workers, or with many workers a tournament tree. Same choice, same tie-breaks
  // as scanning all W workers.
  Choice evaluate(int p, std::int32_t block, int s, std::int64_t begin, std::int64_t end, std::int64_t flops) {
    find_rows(p, block, begin, end);
    first_ = rows_first_;
    last_ = rows_last_;
    key_ = shard_key_[static_cast<std::size_t>(s)];
    const std::int64_t vkv = shard_vkv_[static_cast<std::size_t>(s)];
    const std::int64_t vqo = 2 * (end - begin) * geo_.qo_bytes_per_row();
    if (words_ == 1) return evaluate_few<1>(vkv, vqo, flops);
    if (words_ == 2) return evaluate_few<2>(vkv, vqo, flops);
    // Locals, not members: the stores into saved_ and touched_ could alias
    // them (size_t and int64_t may alias), one reload per saving.
    std::int64_t* const saved = saved_.data();
    std::int32_t* const touched = touched_.data();
    std::size_t touched_count = 0;
    // Branch-free: the slot past the end is overwritten by the next saver.
    auto save = [saved, touched, &touched_count](int r, std::int64_t bytes) {
      std::int64_t& x = saved[r];
      touched[touched_count] = r;
      touched_count += x == 0 ? 1 : 0;
      x += bytes;
    };
    save(rows_home_, vqo);
    const std::int32_t first = first_, last = last_, keys = geo_.keys_per_sample, key = key_;
    const std::size_t words = words_;
    const std::int64_t* lengths = geo_.lengths.data();
    const std::int32_t* const run_base = geo_.run_base.data();
    const HomeRun* const home_runs = home_runs_.data();
    const std::size_t step = static_cast<std::size_t>(keys) * words;  // group j * keys + key
    const std::uint64_t* bits = committed_.data() + static_cast<std::size_t>(first * keys + key) * words;
    for (std::int32_t j = first; j < last; ++j, bits += step) {
      const std::int64_t full = vkv * lengths[j];
      for (std::size_t w = 0; w < words; ++w) {
        for (std::uint64_t word = bits[w]; word != 0; word &= word - 1) {
          save(static_cast<int>(w * 64 + static_cast<std::size_t>(std::countr_zero(word))), full);
        }
      }
      const HomeRun* const runs_end = home_runs + run_base[j + 1];
      for (const HomeRun* run = home_runs + run_base[j]; run != runs_end; ++run) {
        const std::uint32_t r = run->worker;
        if (!((bits[r / 64] >> (r % 64)) & 1U)) save(static_cast<int>(r), vkv * run->tokens);
      }
    }
    return choose(saved, touched, touched_count, flops);
  }

  // evaluate() with up to 64 * NW workers (the paper's scale): the savers
  // are kept as a bitmask in registers instead of a list, and chosen in id
  // order, which settles the last tie (lowest id) without a comparison.
  template <std::size_t NW>
  Choice evaluate_few(std::int64_t vkv, std::int64_t vqo, std::int64_t flops) {
    std::int64_t* const saved = saved_.data();
    std::array<std::uint64_t, NW> mask{};
    auto mark = [&mask](std::uint32_t r) { mask[r / 64] |= std::uint64_t{1} << (r % 64); };
    // The home runs' savings go to one worker sample after sample (a block's
    // samples mostly sit on one CP rank): summed in a register while the
    // worker repeats, not through memory (each add waited for the last
    // one's store). Integer sums: the same savings in any order.
    auto pending_worker = static_cast<std::uint32_t>(rows_home_);
    std::int64_t pending = vqo;
    mark(pending_worker);
    const std::int32_t first = first_, last = last_, keys = geo_.keys_per_sample, key = key_;
    const std::int64_t* lengths = geo_.lengths.data();
    const std::int32_t* const run_base = geo_.run_base.data();
    const HomeRun* const home_runs = home_runs_.data();
    const std::size_t step = static_cast<std::size_t>(keys) * NW;  // group j * keys + key
    const std::uint64_t* bits = committed_.data() + static_cast<std::size_t>(first * keys + key) * NW;
    for (std::int32_t j = first; j < last; ++j, bits += step) {
      const std::int64_t full = vkv * lengths[j];
      // Copied first: the stores into saved (int64_t) may alias the bits.
      std::array<std::uint64_t, NW> held;
      for (std::size_t w = 0; w < NW; ++w) held[w] = bits[w];
      for (std::size_t w = 0; w < NW; ++w) {
        mask[w] |= held[w];
        for (std::uint64_t word = held[w]; word != 0; word &= word - 1) {
          saved[w * 64 + static_cast<std::size_t>(std::countr_zero(word))] += full;
        }
      }
      const HomeRun* const runs_end = home_runs + run_base[j + 1];
      for (const HomeRun* run = home_runs + run_base[j]; run != runs_end; ++run) {
        const std::uint32_t r = run->worker;
        if (!((held[r / 64] >> (r % 64)) & 1U)) {
          if (r != pending_worker) {
            saved[pending_worker] += pending;
            pending_worker = r;
            pending = 0;
            mark(r);
          }
          pending += vkv * run->tokens;
        }
      }
    }
    saved[pending_worker] += pending;
    return choose_few<NW>(saved, mask, flops);
  }

  // choose() over the savers in `mask`, in id order.
  template <std::size_t NW>
  Choice choose_few(std::int64_t* saved, const std::array<std::uint64_t, NW>& mask, std::int64_t flops) {
    Choice c;
    const std::int64_t room = limit_ - flops;
    const std::int64_t* loads = loads_.data();
    std::int64_t* const kept = kept_.data();  // the i-th saver's saving, in id order
    std::int64_t best = 0, best_load = 0;
    std::size_t i = 0;
    for (std::size_t w = 0; w < NW; ++w) {
      for (std::uint64_t m = mask[w]; m != 0; m &= m - 1, ++i) {
        const auto r = static_cast<std::int32_t>(w * 64 + static_cast<std::size_t>(std::countr_zero(m)));
        const std::int64_t x = saved[r];
        kept[i] = x;
        saved[r] = 0;
        const std::int64_t load = loads[r];
        if (load > room) continue;
        // Ids ascend: on equal (saving, load) the earlier worker stays.
        if (c.worker < 0 || x > best || (x == best && load < best_load)) {
          c.worker = r;
          best = x;
          best_load = load;
        }
      }
    }
    if (c.worker >= 0) return c;
    const std::int32_t least = tree_ ? least_[1].id : scan_least();
    if (loads[least] <= room) {
      c.worker = least;
      return c;
    }
    // Nobody has headroom: as in choose(), the minimum of (load, dcomm, r).
    const std::int64_t least_load = loads[least];
    c.fallback = least;
    std::int64_t fallback_saved = 0;
    i = 0;
    for (std::size_t w = 0; w < NW; ++w) {
      for (std::uint64_t m = mask[w]; m != 0; m &= m - 1, ++i) {
        const auto r = static_cast<std::int32_t>(w * 64 + static_cast<std::size_t>(std::countr_zero(m)));
        if (r == least) fallback_saved = kept[i];
      }
    }
    i = 0;
    for (std::size_t w = 0; w < NW; ++w) {
      for (std::uint64_t m = mask[w]; m != 0; m &= m - 1, ++i) {
        const auto r = static_cast<std::int32_t>(w * 64 + static_cast<std::size_t>(std::countr_zero(m)));
        if (loads[r] != least_load) continue;
        if (kept[i] > fallback_saved || (kept[i] == fallback_saved && r < c.fallback)) {
          c.fallback = r;
          fallback_saved = kept[i];
        }
      }
    }
    return c;
  }

  // The shards of a block come one after another with the same rows: the
  // samples they touch (and their Q home) are found once.
  void find_rows(int p, std::int32_t block, std::int64_t begin, std::int64_t end) {
    if (p == rows_slot_ && begin == rows_begin_ && end == rows_end_) return;
    rows_slot_ = p;
    rows_begin_ = begin;
    rows_end_ = end;
    rows_first_ = geo_.block_sample(p, block);
    rows_last_ = rows_first_;
    while (rows_last_ < geo_.sample_base[p + 1] && geo_.starts[rows_last_] < end) ++rows_last_;
    rows_home_ = geo_.home(p, begin);
  }

  // The choice among the `touched_count` savers (`saved` bytes each) for a
  // tile of `flops`, else the least-loaded worker, else the fallback.
  // Leaves `saved` zero again: each saving is read once, into `kept`.
  Choice choose(std::int64_t* saved, const std::int32_t* touched, std::size_t touched_count, std::int64_t flops) {
    Choice c;
    const std::int64_t room = limit_ - flops;  // headroom: load <= room
    const std::int64_t* loads = loads_.data();
    std::int64_t* const kept = kept_.data();  // touched[i]'s saving
    // Among the savers with headroom: the largest saving (least dcomm),
    // then the lowest (load, r).
    std::int64_t best = 0;
    for (std::size_t i = 0; i < touched_count; ++i) {
      const std::int32_t r = touched[i];
      const std::int64_t x = saved[r];
      kept[i] = x;
      saved[r] = 0;
      if (loads[r] > room) continue;
      if (c.worker < 0 || x > best ||
          (x == best && (loads[r] < loads[c.worker] || (loads[r] == loads[c.worker] && r < c.worker)))) {
        c.worker = r;
        best = x;
      }
    }
    if (c.worker < 0) {
      const std::int32_t least = tree_ ? least_[1].id : scan_least();
      if (loads[least] <= room) {
        c.worker = least;
      } else {
        // Nobody has headroom: the minimum of (load, dcomm, r) over all
        // workers. It has the least load; `least` is the lowest id of
        // those, and only a saver among them has a lower dcomm.
        const std::int64_t least_load = loads[least];
        c.fallback = least;
        std::int64_t fallback_saved = 0;  // `least` saves nothing unless it is a saver
        for (std::size_t i = 0; i < touched_count; ++i) {
          if (touched[i] == least) fallback_saved = kept[i];
        }
        for (std::size_t i = 0; i < touched_count; ++i) {
          const std::int32_t r = touched[i];
          if (loads[r] != least_load) continue;
          if (kept[i] > fallback_saved || (kept[i] == fallback_saved && r < c.fallback)) {
            c.fallback = r;
            fallback_saved = kept[i];
          }
        }
      }
    }
    return c;
  }

  // Commits the fragments loaded by the last evaluate() (or commit_rows) to r.
  void commit(int r, std::int64_t flops) {
    loads_[static_cast<std::size_t>(r)] += flops;
    if (tree_) {
      update_tree(r);
    } else if (run_least_[static_cast<std::size_t>(r / kRunWorkers)] == r) {
      update_run(r);
    }
    // Locals: the stores into committed_ could alias words_.
    const std::size_t words = words_;
    const std::int32_t keys = geo_.keys_per_sample, key = key_, last = last_;
    std::uint64_t* const bits = committed_.data() + static_cast<std::size_t>(r) / 64;
    const std::uint64_t bit = std::uint64_t{1} << (r % 64);
    const std::size_t step = static_cast<std::size_t>(keys) * words;  // group j * keys + key, word r / 64
    std::uint64_t* at = bits + static_cast<std::size_t>(first_ * keys + key) * words;
    for (std::int32_t j = first_; j < last; ++j, at += step) *at |= bit;
  }
  void commit_rows(int r, int p, int s, std::int64_t begin, std::int64_t end, std::int64_t flops) {
    first_ = last_ = geo_.sample_at(p, begin);
    while (last_ < geo_.sample_base[p + 1] && geo_.starts[last_] < end) ++last_;
    key_ = shard_key_[static_cast<std::size_t>(s)];
    commit(r, flops);
  }

  std::int64_t load(int r) const { return loads_[static_cast<std::size_t>(r)]; }
  double capacity() const { return capacity_; }

 private:
  // Up to this many workers, the least-loaded one is found by a scan when
  // an evaluation asks for it (about one in four at paper scale, W = 64):
  // a scan over the least-loaded worker of every run of kRunWorkers
  // workers, each kept on commit by rescanning its run only when the
  // committed worker was its least (loads only grow, so no other commit
  // changes it). That costs less than keeping the tournament tree on every
  // commit (placement ~20% faster at W = 64); above, the tree's log W per
  // commit wins.
  static constexpr int kScanWorkers = 256;
  static constexpr int kRunWorkers = 8;
  // The lowest-id worker of least load: runs in id order, so on equal
  // loads the earlier run's wins.
  std::int32_t scan_least() const {
    const std::int64_t* loads = loads_.data();
    const std::int32_t* run_least = run_least_.data();
    std::int32_t least = run_least[0];
    for (std::size_t b = 1; b < run_least_.size(); ++b) {
      if (loads[run_least[b]] < loads[least]) least = run_least[b];
    }
    return least;
  }
  void update_run(int r) {
    const int begin = r / kRunWorkers * kRunWorkers, end = std::min(begin + kRunWorkers, geo_.workers);
    const std::int64_t* loads = loads_.data();
    std::int32_t least = begin;
    for (int x = begin + 1; x < end; ++x) {
      if (loads[x] < loads[least]) least = x;
    }
    run_least_[static_cast<std::size_t>(r / kRunWorkers)] = least;
  }
  void update_tree(int r) {
    // Up the tree with the new entry in hand: each level reads only the
    // sibling, not both children and their loads.
    std::size_t i = leaves_ + static_cast<std::size_t>(r);
    Least cur{loads_[static_cast<std::size_t>(r)], static_cast<std::int32_t>(r)};
    least_[i] = cur;
    for (; i > 1; i /= 2) {
      // A left sibling (i odd) holds the lower ids and wins ties: one
      // comparison instead of (load, id).
      const Least sib = least_[i ^ 1];
      if (sib.load - static_cast<std::int64_t>(i & 1) < cur.load) cur = sib;
      least_[i / 2] = cur;
    }
  }
  // A tree entry: a worker and its load (padding: the largest load and id).
  struct Least {
    std::int64_t load;
    std::int32_t id;
  };
  // The lower (load, id) of two tree entries.
  static Least lesser(Least a, Least b) {
    return (b.load < a.load || (b.load == a.load && b.id < a.id)) ? b : a;
  }

  const Geometry& geo_;
  double capacity_;
  std::size_t words_;
  std::vector<std::int64_t> loads_;
  std::vector<std::uint64_t> committed_;
  std::vector<std::int64_t> saved_;     // per worker, zero outside evaluate()
  std::vector<std::int32_t> touched_;   // within evaluate(): the workers with saved_ > 0
  std::vector<std::int64_t> kept_;      // within choose(): touched_[i]'s saving
  std::size_t leaves_;
  bool tree_;                          // least_ is kept (more than kScanWorkers workers)
  std::vector<std::int32_t> run_least_;  // without the tree: per run of kRunWorkers workers, its least (scan_least)
  std::vector<Least> least_;           // tournament tree: least_[1] = min (load, r)
  // The largest integer x with double(x) <= C: the contract's headroom test
  // double(load + f) <= C is then exactly load + f <= limit_, because the
  // int64 -> double conversion is monotone.
  std::int64_t limit_;
  std::vector<std::int32_t> shard_key_;
  std::vector<std::int64_t> shard_vkv_;
  // Geometry::runs as evaluate() reads them: the worker and the tokens.
  struct HomeRun {
    std::uint32_t worker;
    std::int64_t tokens;
  };
  RawArray<HomeRun> home_runs_;
  // The tile loaded by the last evaluate() or commit_rows(): its samples
  // (global) [first_, last_), whose groups are j * keys_per_sample + key_.
  std::int32_t first_ = 0, last_ = 0;
  std::int32_t key_ = 0;
  int rows_slot_ = -1;  // the rows evaluated last and what they touch
  std::int64_t rows_begin_ = 0, rows_end_ = 0;
  std::int32_t rows_first_ = 0, rows_last_ = 0;
  int rows_home_ = 0;
};

// Sorts by key, keeping the order of equal keys: LSD radix on bytes,
// skipping a byte every key shares (a comparison sort mispredicts about
// every other branch on these keys).
void stable_radix_sort(std::vector<std::pair<std::uint64_t, std::int32_t>>& items) {
  if (items.empty()) return;
  // Every byte's histogram in one pass over the keys (a byte's counts do
  // not change as the passes reorder the items).
  // Counts fit 32 bits: check_totals bounds the tiles by 2^30.
  std::array<std::array<std::uint32_t, 257>, 8> counts{};
  for (const auto& x : items) {
    for (int d = 0; d < 8; ++d) ++counts[static_cast<std::size_t>(d)][((x.first >> (8 * d)) & 0xff) + 1];
  }
  std::vector<std::pair<std::uint64_t, std::int32_t>> scratch(items.size());
  for (int d = 0; d < 8; ++d) {
    const int shift = 8 * d;
    std::array<std::uint32_t, 257>& count = counts[static_cast<std::size_t>(d)];
    if (count[((items[0].first >> shift) & 0xff) + 1] == items.size()) continue;
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (const auto& x : items) scratch[count[(x.first >> shift) & 0xff]++] = x;
    items.swap(scratch);
  }
}

struct BaseTile {
  PlacedRows rows;
  std::int64_t flops;
};

// Tap-split's answer to an empty headroom set: carve off the largest suffix
// of the remaining rows that fits the least-loaded worker (the suffix holds
// the most expensive rows, so it moves the fewest Q/O bytes per FLOP), until
// the rest fits some worker's headroom. Each piece's FLOPs are recomputed
// exactly from its rows. If not even one row fits, the rest goes to the
// least-loaded worker as in plain TAP.
void place_split(const Geometry& geo, Placer& placer, const BaseTile& t, std::vector<PlacedRows>& out) {
  const int p = t.rows.slot;
  const int s = t.rows.shard;
  const std::int64_t begin = t.rows.begin;
  std::int64_t end = t.rows.end;
  std::int64_t flops = t.flops;
  for (;;) {
    const Placer::Choice c = placer.evaluate(p, t.rows.block, s, begin, end, flops);
    if (c.worker >= 0) {
      placer.commit(c.worker, flops);
      out.push_back({t.rows.slot, t.rows.block, t.rows.shard, begin, end, c.worker});
      return;
    }
    const int r = c.fallback;
    const std::int64_t load = placer.load(r);
    auto fits = [&](std::int64_t y) {
      return static_cast<double>(load + geo.rows_flops(p, y, end)) <= placer.capacity();
    };
    if (end - begin < 2 || !fits(end - 1)) {
      placer.commit(r, flops);
      out.push_back({t.rows.slot, t.rows.block, t.rows.shard, begin, end, r});
      return;
    }
    // Smallest y in (begin, end) whose suffix [y, end) fits: fits() is
    // monotone in y because every row costs at least one pair.
    std::int64_t lo = begin + 1, hi = end - 1;
    while (lo < hi) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      if (fits(mid)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const std::int64_t piece_flops = geo.rows_flops(p, lo, end);
    placer.commit_rows(r, p, s, lo, end, piece_flops);
    out.push_back({t.rows.slot, t.rows.block, t.rows.shard, lo, end, r});
    end = lo;
    flops -= piece_flops;
  }
}

// One query block of the pool: its tiles are its shards, ids block * S +
// s, with the block's rows and FLOPs.
struct Block {
  std::int32_t slot, block;
  std::int64_t begin, end, flops;
};

// Every block once, in id order; `total` receives the FLOPs of all tiles.
std::vector<Block> pool_blocks(const Geometry& geo, std::int64_t& total) {
  std::vector<Block> blocks;
  std::size_t n = 0;
  for (int p = 0; p < geo.pool_size; ++p) n += static_cast<std::size_t>(geo.blocks(p));
  blocks.reserve(n);
  total = 0;
  for (int p = 0; p < geo.pool_size; ++p) {
    const std::int32_t nb = geo.blocks(p);
    for (std::int32_t b = 0; b < nb; ++b) {
      const std::int64_t begin = b * geo.block_size;
      const std::int64_t end = std::min(begin + geo.block_size, geo.tokens[static_cast<std::size_t>(p)]);
      const std::int64_t f = geo.rows_flops(p, begin, end, geo.block_sample(p, b));
      blocks.push_back({p, b, begin, end, f});
      total += f * static_cast<std::int64_t>(geo.shards);
    }
  }
  return blocks;
}

// The tiles in id order, each on worker(slot, shard) (-1: not placed yet).
template <class WorkerOf>
std::vector<PlacedRows> tile_rows(const std::vector<Block>& blocks, int shards, WorkerOf worker) {
  std::vector<PlacedRows> rows;
  rows.reserve(blocks.size() * static_cast<std::size_t>(shards));
  for (const Block& k : blocks) {
    for (std::int32_t s = 0; s < shards; ++s) rows.push_back({k.slot, k.block, s, k.begin, k.end, worker(k.slot, s)});
  }
  return rows;
}

std::vector<PlacedRows> unplaced_rows(const std::vector<Block>& blocks, int shards) {
  return tile_rows(blocks, shards, [](std::int32_t, std::int32_t) { return -1; });
}

// The shards of a block have equal f_t and consecutive ids, so sorting
// blocks by (decreasing f, id) and expanding each into its shards gives
// exactly the contract's order (decreasing f_t, increasing id).
std::vector<std::pair<std::uint64_t, std::int32_t>> blocks_by_flops(const std::vector<Block>& blocks) {
  std::vector<std::pair<std::uint64_t, std::int32_t>> keyed(blocks.size());
  std::int64_t max_flops = 0;
  for (const Block& k : blocks) max_flops = std::max(max_flops, k.flops);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    keyed[i] = {static_cast<std::uint64_t>(max_flops - blocks[i].flops), static_cast<std::int32_t>(i)};
  }
  stable_radix_sort(keyed);  // the keys are in id order: ties stay so
  return keyed;
}

using Keyed = std::vector<std::pair<std::uint64_t, std::int32_t>>;

// Plain TAP (contract section 6) one tile at a time: the blocks in the
// order `keyed` gives, each block's shards in order.
class TapOrder final : public TapSteps {
 public:
  TapOrder(const Geometry& geo, const std::vector<Block>& blocks, const Keyed& keyed, double capacity)
      : blocks_(blocks), keyed_(keyed), placer_(geo, capacity), shards_(geo.shards) {}

  bool next(std::int32_t& tile, int& worker) override {
    if (k_ == keyed_.size()) return false;
    const std::int32_t i = keyed_[k_].second;
    const Block& b = blocks_[static_cast<std::size_t>(i)];
    const Placer::Choice c = placer_.evaluate(b.slot, b.block, shard_, b.begin, b.end, b.flops);
    worker = c.worker >= 0 ? c.worker : c.fallback;
    placer_.commit(worker, b.flops);
    tile = i * shards_ + shard_;
    if (++shard_ == shards_) {
      shard_ = 0;
      ++k_;
    }
    return true;
  }
  const Placer& placer() const { return placer_; }

 private:
  const std::vector<Block>& blocks_;
  const Keyed& keyed_;
  Placer placer_;
  std::int32_t shards_;
  std::size_t k_ = 0;  // into keyed_
  std::int32_t shard_ = 0;
};

// TAP's placement of the tiles in the order `keyed` gives (contract
// section 6), or with `split` tap-split's, and the largest load it leaves.
struct TapPlacement {
  std::vector<PlacedRows> rows;  // tap: in id order; split: in placement order
  std::int64_t max_load = 0;
};

TapPlacement place_in_order(const Geometry& geo, const std::vector<Block>& blocks, const Keyed& keyed,
                            double capacity, bool split) {
  TapPlacement out;
  auto max_load = [&](const Placer& placer) {
    for (int r = 0; r < geo.workers; ++r) out.max_load = std::max(out.max_load, placer.load(r));
  };
  if (!split) {
    out.rows = unplaced_rows(blocks, geo.shards);  // the loop sets the workers
    TapOrder tap(geo, blocks, keyed, capacity);
    std::int32_t tile = 0;
    int worker = 0;
    while (tap.next(tile, worker)) out.rows[static_cast<std::size_t>(tile)].worker = worker;
    max_load(tap.placer());
    return out;
  }
  Placer placer(geo, capacity);
  out.rows.reserve(blocks.size() * static_cast<std::size_t>(geo.shards));
  for (const auto& [key, i] : keyed) {
    const Block& k = blocks[static_cast<std::size_t>(i)];
    for (std::int32_t s = 0; s < geo.shards; ++s) {
      place_split(geo, placer, {{k.slot, k.block, s, k.begin, k.end, -1}, k.flops}, out.rows);
    }
  }
  max_load(placer);
  return out;
}

// tap-topo: from TAP's placement (stepped as far as tap-topo needs it),
// within tau of balance, the least slowest-worker transfer time
// (topo.cpp); its split pieces come last.
std::vector<PlacedRows> place_tap_topo(const Geometry& geo, const PlanConfig& config, const std::vector<Block>& blocks,
                                       const Keyed& keyed, double capacity) {
  const std::vector<PlacedRows> base = unplaced_rows(blocks, geo.shards);
  std::vector<std::int64_t> flops;
  flops.reserve(base.size());
  for (const Block& k : blocks) flops.insert(flops.end(), static_cast<std::size_t>(geo.shards), k.flops);
  TapOrder tap(geo, blocks, keyed, capacity);
  std::vector<PlacedRows> topo = place_topo(geo, config, base, flops, capacity, tap);
  sort_rows(topo);
  return topo;
}

}  // namespace

Result<std::vector<PlacedRows>> place_tiles(const Geometry& geo, const PlanConfig& config) {
  std::int64_t total = 0;
  const std::vector<Block> blocks = pool_blocks(geo, total);
  if (config.mode == PlanMode::kUlysses) {
    return tile_rows(blocks, geo.shards, [&](std::int32_t p, std::int32_t s) { return p * geo.cp + s; });
  }
  // Contract section 6, in this order of evaluation.
  const double capacity = tap_capacity(total, geo.workers, config.tau);
  const auto keyed = blocks_by_flops(blocks);
  if (config.mode == PlanMode::kTapTopo) return place_tap_topo(geo, config, blocks, keyed, capacity);
  // Plain TAP first. tap-split keeps it when it already meets tau (then it
  // equals `tap` tile for tile) and otherwise splits; it returns whichever
  // of the two has the lower maximum load, so it is never worse than tap.
  TapPlacement tap = place_in_order(geo, blocks, keyed, capacity, false);
  if (config.mode == PlanMode::kTap || static_cast<double>(tap.max_load) <= capacity) return std::move(tap.rows);
  TapPlacement split = place_in_order(geo, blocks, keyed, capacity, true);
  if (split.max_load >= tap.max_load) return std::move(tap.rows);
  sort_rows(split.rows);  // in placement order
  return std::move(split.rows);
}

namespace {

// Whether c's dedup keys are those with dedup_per_kv_head off (its
// geometry and the builder's KV groups): no shards merged (S <= h_kv) and
// every shard's key its own index.
bool dedup_renames_nothing(const PlanConfig& c) {
  if (!c.dedup_per_kv_head) return true;
  if (c.head_shards < 1 || c.shape.heads_kv < 1 || c.shape.heads_q < 1) return false;  // not validated
  const Geometry g = geometry_shape(1, c);
  if (g.keys_per_sample != g.shards) return false;
  for (int s = 0; s < g.shards; ++s) {
    if (g.key_index(s) != s || g.shard_kv_heads(s).begin != s) return false;
  }
  return true;
}

// Every PlanConfig field but the mode; dedup_per_kv_head the same or
// inert in both.
bool same_but_mode(const PlanConfig& a, const PlanConfig& b) {
  const AttentionShape &x = a.shape, &y = b.shape;
  return a.seq_len == b.seq_len && a.cp == b.cp && a.block_size == b.block_size && a.head_shards == b.head_shards &&
         x.heads_q == y.heads_q && x.heads_kv == y.heads_kv && x.head_dim == y.head_dim && x.dtype == y.dtype &&
         x.window == y.window && a.tau == b.tau && a.chunks == b.chunks && a.chunk_split == b.chunk_split &&
         a.home_layout == b.home_layout && a.kv_prefix == b.kv_prefix && a.topology == b.topology &&
         (a.dedup_per_kv_head == b.dedup_per_kv_head || (dedup_renames_nothing(a) && dedup_renames_nothing(b)));
}

}  // namespace

bool same_tap_inputs(const PlanConfig& tap_config, const PlanConfig& config) {
  return tap_config.mode == PlanMode::kTap && (config.mode == PlanMode::kTap || config.mode == PlanMode::kTapSplit) &&
         same_but_mode(tap_config, config);
}

bool same_tap_plan(const Plan& tap, std::span<const PackedSequence> pool, const PlanConfig& config) {
  if (!same_tap_inputs(tap.config(), config) || !std::ranges::equal(tap.pool(), pool)) return false;
  if (config.mode == PlanMode::kTap) return true;
  // tap's worker loads are TAP's (a tile's FLOPs, summed on its worker).
  const std::span<const std::int64_t> loads = tap.worker_flops();
  std::int64_t total = 0, max_load = 0;
  for (std::int64_t f : loads) {
    total += f;
    max_load = std::max(max_load, f);
  }
  return static_cast<double>(max_load) <= tap_capacity(total, tap.num_workers(), config.tau);
}

}  // namespace detail
}  // namespace libra
