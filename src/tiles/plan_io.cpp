// Plan files: JSON for people, a compact versioned binary for programs.
// Both store the defining content (config, pool, tiles with placement);
// loading re-derives everything else through the same builder and checks
// the fingerprint, so a loaded plan is exactly the plan that was saved.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "libra/io.hpp"
#include "tiles/plan_internal.hpp"

namespace libra {

namespace {

using OJson = nlohmann::ordered_json;
using detail::PlacedRows;

constexpr char kMagic[8] = {'L', 'I', 'B', 'R', 'A', 'P', 'L', 'N'};
constexpr std::size_t kHeaderBytes = 32;  // magic, u32 version, u32 flags, u64 fingerprint, u64 words
constexpr std::int64_t kI32 = std::numeric_limits<std::int32_t>::max();
constexpr std::int64_t kI64 = std::numeric_limits<std::int64_t>::max();

std::string hex(std::uint64_t v) { return fmt::format("0x{:016x}", v); }

OJson range_json(HeadRange r) { return OJson::array({r.begin, r.end}); }

}  // namespace

namespace {

// The configuration; fields that came with a later format version only where the plan needs that version.
OJson config_json(const PlanConfig& c) {
  OJson cfg;
  cfg["mode"] = std::string(plan_mode_name(c.mode));
  cfg["seq_len"] = c.seq_len;
  cfg["cp"] = c.cp;
  cfg["block_size"] = c.block_size;
  cfg["head_shards"] = c.head_shards;
  cfg["heads_q"] = c.shape.heads_q;
  cfg["heads_kv"] = c.shape.heads_kv;
  cfg["head_dim"] = c.shape.head_dim;
  cfg["dtype"] = dtype_name(c.shape.dtype);
  cfg["elem_bytes"] = c.shape.elem_bytes();  // for readers of format 1 without "dtype"
  cfg["window"] = c.shape.window == kFullCausal ? OJson(nullptr) : OJson(c.shape.window);
  cfg["tau"] = c.tau;
  cfg["chunks"] = c.chunks;
  cfg["dedup_per_kv_head"] = c.dedup_per_kv_head;
  // Version 1 (contiguous) files stay as they were.
  if (plan_format_version(c) >= 2) cfg["home_layout"] = std::string(home_layout_name(c.home_layout));
  if (plan_format_version(c) >= 3) cfg["kv_prefix"] = c.kv_prefix;
  if (plan_format_version(c) >= 4) cfg["chunk_split"] = std::string(chunk_split_name(c.chunk_split));
  if (plan_stores_topology(c)) {
    const PlanTopology& t = c.topology;
    cfg["topology"] = {{"gpus_per_node", t.gpus_per_node},
                       {"nodes_per_supernode", t.nodes_per_supernode},
                       {"intra_node_gbps", t.intra_node_gbps},
                       {"inter_node_gbps", t.inter_node_gbps},
                       {"inter_supernode_gbps", t.inter_supernode_gbps},
                       {"congestion_per_node", t.congestion_per_node}};
  }
  return cfg;
}

// Each tile's defining fields and its derived ones (id, piece, heads, flops, home).
OJson tiles_json(const Plan& plan) {
  OJson tiles = OJson::array();
  for (const Tile& t : plan.tiles()) {
    OJson o;
    o["id"] = t.id;
    o["slot"] = t.slot;
    o["block"] = t.block;
    o["shard"] = t.shard;
    o["piece"] = t.piece;
    o["begin"] = t.begin;
    o["end"] = t.end;
    o["heads"] = range_json(t.heads);
    o["kv_heads"] = range_json(t.kv_heads);
    o["flops"] = t.flops;
    o["home"] = t.home;
    o["worker"] = t.worker;
    tiles.push_back(std::move(o));
  }
  return tiles;
}

// Bytes sent from each worker (row) to each worker (column).
OJson byte_matrix_json(const Plan& plan) {
  const int W = plan.num_workers();
  OJson matrix = OJson::array();
  for (int src = 0; src < W; ++src) {
    OJson row = OJson::array();
    for (int dst = 0; dst < W; ++dst) row.push_back(plan.bytes(src, dst));
    matrix.push_back(std::move(row));
  }
  return matrix;
}

// Per worker: work, tiles, groups and bytes by tier.
OJson workers_json(const Plan& plan) {
  const int W = plan.num_workers();
  OJson workers = OJson::array();
  for (int r = 0; r < W; ++r) {
    OJson o;
    o["worker"] = r;
    o["flops"] = plan.worker_flops()[static_cast<std::size_t>(r)];
    o["tiles"] = plan.worker_tiles(r).size();
    o["kv_groups"] = plan.worker_groups(r).size();
    o["send_bytes"] = plan.send_bytes(r);
    o["recv_bytes"] = plan.recv_bytes(r);
    const TierBytes& tb = plan.tier_bytes()[static_cast<std::size_t>(r)];
    o["kept_bytes"] = tb.kept;
    o["send_intra_node_bytes"] = tb.send_intra_node;
    o["send_cross_node_bytes"] = tb.send_cross_node;
    o["recv_intra_node_bytes"] = tb.recv_intra_node;
    o["recv_cross_node_bytes"] = tb.recv_cross_node;
    o["recv_cross_supernode_bytes"] = tb.recv_cross_supernode;
    workers.push_back(std::move(o));
  }
  return workers;
}

}  // namespace

std::string plan_to_json(const Plan& plan, int indent) {
  const PlanConfig& c = plan.config();
  OJson j;
  j["format"] = "libra-plan";
  j["version"] = plan_format_version(c);
  j["fingerprint"] = hex(plan.fingerprint());
  j["config"] = config_json(c);
  j["pool_size"] = plan.pool_size();
  j["num_workers"] = plan.num_workers();
  OJson pool = OJson::array();
  for (const PackedSequence& s : plan.pool()) pool.push_back(s);
  j["pool"] = std::move(pool);
  j["tiles"] = tiles_json(plan);
  j["worker_flops"] = std::vector<std::int64_t>(plan.worker_flops().begin(), plan.worker_flops().end());
  j["imbalance"] = plan.imbalance();
  j["comm_bytes"] = plan.comm_bytes();
  j["byte_matrix"] = byte_matrix_json(plan);
  j["workers"] = workers_json(plan);
  // Bytes by tier use config.topology (the default h200 layout unless the
  // plan is tap-topo's, which records its own).
  j["busiest_receiver"] = plan.busiest_receiver();
  j["max_recv_cross_node_bytes"] = plan.max_recv_cross_node();
  return j.dump(indent) + "\n";
}

namespace {

// Little-endian writes and reads, independent of the host's byte order.
void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffU));
}
void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xffU));
}
std::uint64_t get_u64(std::string_view in, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}
std::uint32_t get_u32(std::string_view in, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}

// Checks the summaries a file states against the re-derived plan.
Status check_fingerprint(const Plan& plan, std::uint64_t stated, const std::string& source) {
  if (plan.fingerprint() != stated) {
    return mismatch_error(source + ": fingerprint " + hex(stated) + " does not match the plan's content (" +
                          hex(plan.fingerprint()) + ")");
  }
  return {};
}

Result<Plan> finish(std::span<const PackedSequence> pool, const PlanConfig& config, std::vector<PlacedRows> rows,
                    const std::string& source) {
  auto geo = detail::make_geometry(pool, config);
  if (!geo.ok()) return Error(geo.error().code(), source + ": " + geo.error().message());
  LIBRA_TRY(detail::check_rows(*geo, rows, source));
  return detail::build_plan(pool, config, std::move(*geo), rows);
}

}  // namespace

std::string plan_to_binary(const Plan& plan) {
  const std::vector<std::uint64_t> words =
      detail::canonical_words(plan.config(), plan.pool(), plan.tiles());
  std::string out;
  out.reserve(kHeaderBytes + 8 * words.size());
  out.append(kMagic, sizeof kMagic);
  put_u32(out, plan_format_version(plan.config()));
  put_u32(out, 0);
  put_u64(out, plan.fingerprint());
  put_u64(out, words.size());
  for (std::uint64_t w : words) put_u64(out, w);
  return out;
}

namespace {

// A binary plan's header, checked: version, stated fingerprint and the content words.
struct BinaryHeader {
  std::uint32_t version = 0;
  std::uint64_t stated = 0;
  std::vector<std::uint64_t> words;
};

Result<BinaryHeader> read_binary_header(std::string_view bytes, const std::string& source) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    return invalid_input(source + ": not a libra binary plan (missing LIBRAPLN header)");
  }
  BinaryHeader h;
  h.version = get_u32(bytes, 8);
  if (h.version < 1 || h.version > kPlanFormatVersion) {
    return mismatch_error(source + ": plan format version " + std::to_string(h.version) +
                          "; this libra reads versions 1 to " + std::to_string(kPlanFormatVersion));
  }
  // Reserved for options a later version may add: a reader that ignored
  // them would misread such a file.
  if (const std::uint32_t flags = get_u32(bytes, 12); flags != 0) {
    return invalid_input(source + ": binary plan header: flags word is " + std::to_string(flags) +
                         ", expected 0 (docs/plan-format.md)");
  }
  h.stated = get_u64(bytes, 16);
  const std::uint64_t count = get_u64(bytes, 24);
  if (count != (bytes.size() - kHeaderBytes) / 8 || (bytes.size() - kHeaderBytes) % 8 != 0) {
    return invalid_input(source + ": truncated or padded binary plan (header says " + std::to_string(count) +
                         " words, file holds " + std::to_string(bytes.size() - kHeaderBytes) + " bytes)");
  }
  h.words.resize(count);
  for (std::size_t i = 0; i < count; ++i) h.words[i] = get_u64(bytes, kHeaderBytes + 8 * i);
  if (detail::hash_words(h.words) != h.stated) {
    return mismatch_error(source + ": fingerprint " + hex(h.stated) + " does not match the file's content");
  }
  return h;
}

// Reads the content words in order; every count is checked against the words left before use.
struct WordReader {
  const std::vector<std::uint64_t>& w;
  const std::string& source;
  std::size_t at = 0;

  Error bad(const std::string& what) const {
    return invalid_input(source + ": malformed binary plan at word " + std::to_string(at) + ": " + what);
  }
  bool next(std::uint64_t& v) {
    if (at >= w.size()) return false;
    v = w[at++];
    return true;
  }
  template <typename T>
  bool next_int(T& out, std::int64_t lo, std::int64_t hi) {
    std::uint64_t v = 0;
    if (!next(v)) return false;
    const auto s = static_cast<std::int64_t>(v);
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) || s < lo || s > hi) return false;
    out = static_cast<T>(s);
    return true;
  }
  std::int64_t left() const { return static_cast<std::int64_t>(w.size() - at); }
};

// The fields that came with later format versions, in the canonical words' order: the home layout (version 2)
// before the topology.
Status decode_versioned_config(WordReader& in, std::uint32_t version, int mode, PlanConfig& c) {
  if (version >= 2) {
    int layout = 0;
    if (!in.next_int(layout, 0, 1)) return in.bad("home layout");
    c.home_layout = static_cast<HomeLayout>(layout);
  }
  if (version >= 3) {
    int prefix = 0;
    if (!in.next_int(prefix, 0, 1)) return in.bad("kv_prefix");
    c.kv_prefix = prefix != 0;
  }
  if (version >= 4) {
    int split = 0;
    if (!in.next_int(split, 0, 1)) return in.bad("chunk split");
    c.chunk_split = static_cast<ChunkSplit>(split);
  }
  if (static_cast<PlanMode>(mode) == PlanMode::kTapTopo || version >= 5) {
    std::uint64_t bits[4] = {};
    if (!in.next_int(c.topology.gpus_per_node, 1, kI32) || !in.next_int(c.topology.nodes_per_supernode, 1, kI32) ||
        !in.next(bits[0]) || !in.next(bits[1]) || !in.next(bits[2]) || !in.next(bits[3])) {
      return in.bad("topology");
    }
    c.topology.intra_node_gbps = std::bit_cast<double>(bits[0]);
    c.topology.inter_node_gbps = std::bit_cast<double>(bits[1]);
    c.topology.inter_supernode_gbps = std::bit_cast<double>(bits[2]);
    c.topology.congestion_per_node = std::bit_cast<double>(bits[3]);
  }
  return {};
}

Result<PlanConfig> decode_config(WordReader& in, std::uint32_t version) {
  std::uint64_t magic = 0, ver = 0;
  if (!in.next(magic) || !in.next(ver) || ver != version) return in.bad("content header");
  PlanConfig c;
  std::uint64_t tau_bits = 0;
  int mode = 0, dedup = 0;
  std::uint64_t dtype_word = 0;
  if (!in.next_int(c.seq_len, 1, kI64) || !in.next_int(c.cp, 1, kI32) || !in.next_int(c.block_size, 1, kI64) ||
      !in.next_int(c.head_shards, 1, kI32) || !in.next_int(c.shape.heads_q, 1, kI32) ||
      !in.next_int(c.shape.heads_kv, 1, kI32) || !in.next_int(c.shape.head_dim, 1, kI32) ||
      !in.next(dtype_word) || !in.next_int(c.shape.window, 1, kI64) || !in.next(tau_bits) ||
      !in.next_int(c.chunks, 1, kI32) || !in.next_int(mode, 0, 3) || !in.next_int(dedup, 0, 1)) {
    return in.bad("configuration");
  }
  LIBRA_TRY(decode_versioned_config(in, version, mode, c));
  if (!dtype_from_code(dtype_word, c.shape.dtype)) {
    // Format-1 files hold the element size here: 4 and 2 decode above.
    return invalid_input(in.source + ": malformed binary plan: element type word " + std::to_string(dtype_word) +
                         " names no type (4 fp32, 2 bf16, 258 fp16)");
  }
  c.tau = std::bit_cast<double>(tau_bits);
  c.mode = static_cast<PlanMode>(mode);
  c.dedup_per_kv_head = dedup != 0;
  if (plan_format_version(c) != version) {
    return in.bad("this configuration is stored as format version " + std::to_string(plan_format_version(c)));
  }
  return c;
}

Result<std::vector<PackedSequence>> decode_pool(WordReader& in) {
  std::int64_t slots = 0;
  if (!in.next_int(slots, 1, in.left())) return in.bad("pool size");
  std::vector<PackedSequence> pool(static_cast<std::size_t>(slots));
  for (PackedSequence& seq : pool) {
    std::int64_t n = 0;
    if (!in.next_int(n, 0, in.left())) return in.bad("sample count");
    seq.resize(static_cast<std::size_t>(n));
    for (std::int64_t& l : seq) {
      if (!in.next_int(l, 1, kI64)) return in.bad("sample length");
    }
  }
  return pool;
}

// Each tile is four words: slot and block packed, shard and worker packed, begin, end.
Result<std::vector<PlacedRows>> decode_rows(WordReader& in) {
  std::int64_t ntiles = 0;
  if (!in.next_int(ntiles, 0, in.left() / 4)) return in.bad("tile count");
  std::vector<PlacedRows> rows(static_cast<std::size_t>(ntiles));
  for (PlacedRows& r : rows) {
    std::uint64_t a = 0, b = 0;
    if (!in.next(a) || !in.next(b) || !in.next_int(r.begin, 0, kI64) || !in.next_int(r.end, 0, kI64)) {
      return in.bad("tile");
    }
    r.slot = static_cast<std::int32_t>(a >> 32);
    r.block = static_cast<std::int32_t>(a & 0xffffffffU);
    r.shard = static_cast<std::int32_t>(b >> 32);
    r.worker = static_cast<std::int32_t>(b & 0xffffffffU);
  }
  return rows;
}

}  // namespace

Result<Plan> plan_from_binary(std::string_view bytes, const std::string& source) {
  LIBRA_ASSIGN_OR_RETURN(BinaryHeader h, read_binary_header(bytes, source));
  WordReader in{h.words, source};
  LIBRA_ASSIGN_OR_RETURN(PlanConfig c, decode_config(in, h.version));
  LIBRA_ASSIGN_OR_RETURN(std::vector<PackedSequence> pool, decode_pool(in));
  LIBRA_ASSIGN_OR_RETURN(std::vector<PlacedRows> rows, decode_rows(in));
  if (in.at != h.words.size()) return in.bad("trailing words");
  LIBRA_ASSIGN_OR_RETURN(Plan plan, finish(pool, c, std::move(rows), source));
  LIBRA_TRY(check_fingerprint(plan, h.stated, source));
  return plan;
}

namespace {

// Typed field access with one-line errors naming the file and the field.
struct JsonReader {
  const std::string& source;

  Result<const OJson*> field(const OJson& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) return invalid_input(source + ": " + where + " must be a JSON object");
    auto it = obj.find(key);
    if (it == obj.end()) return invalid_input(source + ": " + where + ": missing field '" + key + "'");
    return &*it;
  }
  Result<std::int64_t> integer(const OJson& obj, const char* key, const std::string& where, std::int64_t lo,
                               std::int64_t hi) const {
    LIBRA_ASSIGN_OR_RETURN(const OJson* v, field(obj, key, where));
    if (!v->is_number_integer()) {
      return invalid_input(source + ": " + where + ": field '" + key + "' must be an integer");
    }
    if (v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) {
      return invalid_input(source + ": " + where + ": field '" + key + "' is out of range");
    }
    const auto x = v->get<std::int64_t>();
    if (x < lo || x > hi) {
      return invalid_input(source + ": " + where + ": field '" + key + "' = " + std::to_string(x) +
                           " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return x;
  }
};

// The config fields that came with later format versions, each required
// from its version on and refused before it (docs/plan-format.md), and the
// topology: tap-topo's plans and version 5 store it, no other plan may.
Status read_versioned_config(const JsonReader& rd, const OJson& cfg, std::int64_t version, PlanConfig& c) {
  const std::string& source = rd.source;
  auto too_early = [&](const char* key, int since) -> Status {
    if (version >= since || !cfg.contains(key)) return {};
    return invalid_input(source + ": config: field '" + key + "' belongs to format version " + std::to_string(since) +
                         " and later; the file says version " + std::to_string(version));
  };
  // Version 1 has no home layout; "contiguous" there is the one leniency
  // (written by early libra).
  if (version >= 2 || cfg.contains("home_layout")) {
    LIBRA_ASSIGN_OR_RETURN(const OJson* hl, rd.field(cfg, "home_layout", "config"));
    auto l = hl->is_string() ? parse_home_layout(hl->get<std::string>())
                             : Result<HomeLayout>(invalid_input("field 'home_layout' must be a string"));
    if (!l.ok()) return invalid_input(source + ": config: " + l.error().message());
    c.home_layout = *l;
  }
  LIBRA_TRY(too_early("kv_prefix", 3));
  if (version >= 3) {
    LIBRA_ASSIGN_OR_RETURN(const OJson* kp, rd.field(cfg, "kv_prefix", "config"));
    if (!kp->is_boolean()) return invalid_input(source + ": config: field 'kv_prefix' must be true or false");
    c.kv_prefix = kp->get<bool>();
  }
  LIBRA_TRY(too_early("chunk_split", 4));
  if (version >= 4) {
    LIBRA_ASSIGN_OR_RETURN(const OJson* cs, rd.field(cfg, "chunk_split", "config"));
    auto split = cs->is_string() ? parse_chunk_split(cs->get<std::string>())
                                 : Result<ChunkSplit>(invalid_input("field 'chunk_split' must be a string"));
    if (!split.ok()) return invalid_input(source + ": config: " + split.error().message());
    c.chunk_split = *split;
  }
  if (c.mode != PlanMode::kTapTopo && version < 5 && cfg.contains("topology")) {
    return invalid_input(source + ": config: field 'topology' belongs to tap-topo plans and format version 5; the file "
                         "says mode " + std::string(plan_mode_name(c.mode)) + ", version " + std::to_string(version));
  }
  if (c.mode == PlanMode::kTapTopo || version >= 5) {
    LIBRA_ASSIGN_OR_RETURN(const OJson* tj, rd.field(cfg, "topology", "config"));
    if (!tj->is_object()) return invalid_input(source + ": config: field 'topology' must be an object");
    const std::string tw = "config.topology";
    static constexpr const char* kKeys[] = {"gpus_per_node", "nodes_per_supernode", "intra_node_gbps",
                                            "inter_node_gbps", "inter_supernode_gbps", "congestion_per_node"};
    for (auto it = tj->begin(); it != tj->end(); ++it) {
      const std::string& key = it.key();
      if (std::find_if(std::begin(kKeys), std::end(kKeys), [&](const char* k) { return key == k; }) == std::end(kKeys)) {
        return invalid_input(source + ": config.topology: unknown field '" + key + "'");
      }
    }
    LIBRA_ASSIGN_OR_RETURN(std::int64_t gpn, rd.integer(*tj, "gpus_per_node", tw, 1, kI32));
    LIBRA_ASSIGN_OR_RETURN(std::int64_t nps, rd.integer(*tj, "nodes_per_supernode", tw, 1, kI32));
    c.topology.gpus_per_node = static_cast<int>(gpn);
    c.topology.nodes_per_supernode = static_cast<int>(nps);
    for (auto [key, dst] : {std::pair{"intra_node_gbps", &c.topology.intra_node_gbps},
                            std::pair{"inter_node_gbps", &c.topology.inter_node_gbps},
                            std::pair{"inter_supernode_gbps", &c.topology.inter_supernode_gbps},
                            std::pair{"congestion_per_node", &c.topology.congestion_per_node}}) {
      LIBRA_ASSIGN_OR_RETURN(const OJson* v, rd.field(*tj, key, tw));
      if (!v->is_number()) return invalid_input(source + ": config.topology: field '" + key + "' must be a number");
      *dst = v->get<double>();
    }
  }
  if (plan_format_version(c) != static_cast<std::uint32_t>(version)) {
    return invalid_input(source + ": config: home_layout " + std::string(home_layout_name(c.home_layout)) +
                         (c.kv_prefix ? " with kv_prefix" : "") +
                         (c.chunk_split != ChunkSplit::kEqual ? " with tapered chunks" : "") +
                         (plan_format_version(c) == 5 ? " with a topology of its own" : "") + " is format version " +
                         std::to_string(plan_format_version(c)) + ", the file says " + std::to_string(version));
  }
  return {};
}

// The header: format, version and the stated fingerprint.
struct JsonHeader {
  std::int64_t version = 0;
  std::uint64_t stated = 0;
};

Result<JsonHeader> read_json_header(const JsonReader& rd, const OJson& j) {
  const std::string& source = rd.source;
  if (!j.is_object() || !j.contains("format") || j.at("format") != "libra-plan") {
    return invalid_input(source + ": not a libra plan (field 'format' must be \"libra-plan\")");
  }
  JsonHeader h;
  LIBRA_ASSIGN_OR_RETURN(h.version, rd.integer(j, "version", "plan", 0, kI64));
  if (h.version < 1 || h.version > kPlanFormatVersion) {
    return mismatch_error(source + ": plan format version " + std::to_string(h.version) +
                          "; this libra reads versions 1 to " + std::to_string(kPlanFormatVersion));
  }
  LIBRA_ASSIGN_OR_RETURN(const OJson* fp, rd.field(j, "fingerprint", "plan"));
  const std::string s = fp->is_string() ? fp->get<std::string>() : std::string();
  if (s.size() != 18 || s.rfind("0x", 0) != 0 || s.find_first_not_of("0123456789abcdef", 2) != std::string::npos) {
    return invalid_input(source + ": field 'fingerprint' must be a string 0x followed by 16 lowercase hex digits");
  }
  h.stated = std::stoull(s.substr(2), nullptr, 16);
  return h;
}

// Format-1 writers gave only elem_bytes; newer ones give "dtype" (and
// elem_bytes for old readers), which must then agree.
Result<DType> read_dtype(const JsonReader& rd, const OJson& cfg) {
  const std::string& source = rd.source;
  if (!cfg.contains("dtype")) {
    LIBRA_ASSIGN_OR_RETURN(std::int64_t eb, rd.integer(cfg, "elem_bytes", "config", 1, kI32));
    return dtype_from_elem_bytes(eb, source + ": config");
  }
  const OJson& dt = cfg.at("dtype");
  auto t = dt.is_string() ? parse_dtype(dt.get<std::string>()) : Result<DType>(invalid_input("dtype must be a string"));
  if (!t.ok()) return invalid_input(source + ": config: " + t.error().message());
  if (cfg.contains("elem_bytes")) {
    LIBRA_ASSIGN_OR_RETURN(std::int64_t eb, rd.integer(cfg, "elem_bytes", "config", 1, kI32));
    if (eb != dtype_bytes(*t)) {
      return invalid_input(source + ": config: elem_bytes " + std::to_string(eb) + " disagrees with dtype " +
                           dtype_name(*t) + " (" + std::to_string(dtype_bytes(*t)) + " bytes)");
    }
  }
  return *t;
}

Result<PlanConfig> read_config(const JsonReader& rd, const OJson& cfg, std::int64_t version) {
  const std::string& source = rd.source;
  const std::string w = "config";
  PlanConfig c;
  LIBRA_ASSIGN_OR_RETURN(const OJson* mode, rd.field(cfg, "mode", w));
  if (!mode->is_string()) return invalid_input(source + ": config: field 'mode' must be a string");
  auto m = parse_plan_mode(mode->get<std::string>());
  if (!m.ok()) return invalid_input(source + ": config: " + m.error().message());
  c.mode = *m;
  LIBRA_ASSIGN_OR_RETURN(c.seq_len, rd.integer(cfg, "seq_len", w, 1, kI64));
  LIBRA_ASSIGN_OR_RETURN(std::int64_t cp, rd.integer(cfg, "cp", w, 1, kI32));
  LIBRA_ASSIGN_OR_RETURN(c.block_size, rd.integer(cfg, "block_size", w, 1, kI64));
  LIBRA_ASSIGN_OR_RETURN(std::int64_t hs, rd.integer(cfg, "head_shards", w, 1, kI32));
  LIBRA_ASSIGN_OR_RETURN(std::int64_t hq, rd.integer(cfg, "heads_q", w, 1, kI32));
  LIBRA_ASSIGN_OR_RETURN(std::int64_t hkv, rd.integer(cfg, "heads_kv", w, 1, kI32));
  LIBRA_ASSIGN_OR_RETURN(std::int64_t hd, rd.integer(cfg, "head_dim", w, 1, kI32));
  LIBRA_ASSIGN_OR_RETURN(std::int64_t chunks, rd.integer(cfg, "chunks", w, 1, kI32));
  c.cp = static_cast<int>(cp);
  c.head_shards = static_cast<int>(hs);
  c.shape.heads_q = static_cast<int>(hq);
  c.shape.heads_kv = static_cast<int>(hkv);
  c.shape.head_dim = static_cast<int>(hd);
  LIBRA_ASSIGN_OR_RETURN(c.shape.dtype, read_dtype(rd, cfg));
  c.chunks = static_cast<int>(chunks);
  LIBRA_ASSIGN_OR_RETURN(const OJson* win, rd.field(cfg, "window", w));
  if (win->is_null()) {
    c.shape.window = kFullCausal;
  } else {
    LIBRA_ASSIGN_OR_RETURN(c.shape.window, rd.integer(cfg, "window", w, 1, kI64));
  }
  LIBRA_ASSIGN_OR_RETURN(const OJson* tau, rd.field(cfg, "tau", w));
  if (!tau->is_number()) return invalid_input(source + ": config: field 'tau' must be a number");
  c.tau = tau->get<double>();
  LIBRA_ASSIGN_OR_RETURN(const OJson* dedup, rd.field(cfg, "dedup_per_kv_head", w));
  if (!dedup->is_boolean()) return invalid_input(source + ": config: field 'dedup_per_kv_head' must be true or false");
  c.dedup_per_kv_head = dedup->get<bool>();
  LIBRA_TRY(read_versioned_config(rd, cfg, version, c));
  return c;
}

Result<std::vector<PackedSequence>> read_pool(const JsonReader& rd, const OJson& j) {
  const std::string& source = rd.source;
  LIBRA_ASSIGN_OR_RETURN(const OJson* pj, rd.field(j, "pool", "plan"));
  if (!pj->is_array()) return invalid_input(source + ": field 'pool' must be an array of arrays of lengths");
  std::vector<PackedSequence> pool;
  for (std::size_t p = 0; p < pj->size(); ++p) {
    const OJson& seq = (*pj)[p];
    if (!seq.is_array()) return invalid_input(source + ": pool slot " + std::to_string(p) + " must be an array");
    PackedSequence s;
    for (const OJson& l : seq) {
      if (!l.is_number_integer()) {
        return invalid_input(source + ": pool slot " + std::to_string(p) + ": sample lengths must be integers");
      }
      s.push_back(l.get<std::int64_t>());
    }
    pool.push_back(std::move(s));
  }
  return pool;
}

// The tiles' defining fields (slot, block, shard, worker, rows); the rest is re-derived.
Result<std::vector<PlacedRows>> read_rows(const JsonReader& rd, const OJson& tj) {
  if (!tj.is_array()) return invalid_input(rd.source + ": field 'tiles' must be an array");
  std::vector<PlacedRows> rows;
  rows.reserve(tj.size());
  for (std::size_t i = 0; i < tj.size(); ++i) {
    const OJson& t = tj[i];
    const std::string w = "tiles[" + std::to_string(i) + "]";
    PlacedRows r;
    LIBRA_ASSIGN_OR_RETURN(std::int64_t slot, rd.integer(t, "slot", w, 0, kI32));
    LIBRA_ASSIGN_OR_RETURN(std::int64_t block, rd.integer(t, "block", w, 0, kI32));
    LIBRA_ASSIGN_OR_RETURN(std::int64_t shard, rd.integer(t, "shard", w, 0, kI32));
    LIBRA_ASSIGN_OR_RETURN(std::int64_t worker, rd.integer(t, "worker", w, 0, kI32));
    LIBRA_ASSIGN_OR_RETURN(r.begin, rd.integer(t, "begin", w, 0, kI64));
    LIBRA_ASSIGN_OR_RETURN(r.end, rd.integer(t, "end", w, 0, kI64));
    r.slot = static_cast<std::int32_t>(slot);
    r.block = static_cast<std::int32_t>(block);
    r.shard = static_cast<std::int32_t>(shard);
    r.worker = static_cast<std::int32_t>(worker);
    rows.push_back(r);
  }
  return rows;
}

// Stated per-tile summaries, where present, must agree with the re-derived plan.
Status check_stated_tiles(const std::string& source, const OJson& tj, const Plan& plan) {
  for (std::size_t i = 0; i < tj.size(); ++i) {
    const OJson& t = tj[i];
    const Tile& d = plan.tiles()[i];
    for (const auto& [key, want] : {std::pair<const char*, std::int64_t>{"id", d.id}, {"flops", d.flops},
                                    {"home", d.home}, {"piece", d.piece}}) {
      if (t.contains(key) && (!t[key].is_number_integer() || t[key].get<std::int64_t>() != want)) {
        return mismatch_error(source + ": tiles[" + std::to_string(i) + "]: field '" + key +
                              "' disagrees with the plan (" + std::to_string(want) + ")");
      }
    }
  }
  return {};
}

// The byte matrix, where stated, must be the plan's, entry for entry.
bool same_byte_matrix(const OJson& m, const Plan& plan) {
  const int W = plan.num_workers();
  bool same = m.is_array() && m.size() == static_cast<std::size_t>(W);
  for (int s = 0; same && s < W; ++s) {
    const OJson& row = m[static_cast<std::size_t>(s)];
    same = row.is_array() && row.size() == static_cast<std::size_t>(W);
    for (int d = 0; same && d < W; ++d) same = row[static_cast<std::size_t>(d)] == plan.bytes(s, d);
  }
  return same;
}

// Stated plan-wide summaries, where present, must agree with the re-derived plan.
Status check_stated_summaries(const std::string& source, const OJson& j, const Plan& plan) {
  for (const auto& [key, want] : {std::pair<const char*, std::int64_t>{"num_workers", plan.num_workers()},
                                  {"pool_size", plan.pool_size()}}) {
    if (j.contains(key) && (!j.at(key).is_number_integer() || j.at(key).get<std::int64_t>() != want)) {
      return mismatch_error(source + ": field '" + key + "' disagrees with the plan's tiles (" + std::to_string(want) + ")");
    }
  }
  if (j.contains("imbalance")) {
    // Written with the shortest text that reads back to the same double.
    const OJson& im = j.at("imbalance");
    const double want = plan.imbalance();
    if (!im.is_number() || std::abs(im.get<double>() - want) > 1e-12 * std::max(1.0, std::abs(want))) {
      return mismatch_error(source + ": field 'imbalance' disagrees with the plan's tiles (" + fmt::format("{}", want) + ")");
    }
  }
  if (j.contains("comm_bytes") && j.at("comm_bytes") != plan.comm_bytes()) {
    return mismatch_error(source + ": field 'comm_bytes' disagrees with the plan (" +
                          std::to_string(plan.comm_bytes()) + ")");
  }
  if (j.contains("worker_flops") &&
      j.at("worker_flops") != OJson(std::vector<std::int64_t>(plan.worker_flops().begin(), plan.worker_flops().end()))) {
    return mismatch_error(source + ": field 'worker_flops' disagrees with the plan");
  }
  if (j.contains("byte_matrix") && !same_byte_matrix(j.at("byte_matrix"), plan)) {
    return mismatch_error(source + ": field 'byte_matrix' disagrees with the plan");
  }
  return {};
}

}  // namespace

Result<Plan> plan_from_json(std::string_view text, const std::string& source) {
  OJson j;
  try {
    j = OJson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return invalid_input(source + ": not valid JSON: " + e.what());
  }
  const JsonReader rd{source};
  LIBRA_ASSIGN_OR_RETURN(JsonHeader h, read_json_header(rd, j));
  LIBRA_ASSIGN_OR_RETURN(const OJson* cfg, rd.field(j, "config", "plan"));
  LIBRA_ASSIGN_OR_RETURN(PlanConfig c, read_config(rd, *cfg, h.version));
  LIBRA_ASSIGN_OR_RETURN(std::vector<PackedSequence> pool, read_pool(rd, j));
  LIBRA_ASSIGN_OR_RETURN(const OJson* tj, rd.field(j, "tiles", "plan"));
  LIBRA_ASSIGN_OR_RETURN(std::vector<PlacedRows> rows, read_rows(rd, *tj));
  LIBRA_ASSIGN_OR_RETURN(Plan plan, finish(pool, c, std::move(rows), source));
  LIBRA_TRY(check_fingerprint(plan, h.stated, source));
  LIBRA_TRY(check_stated_tiles(source, *tj, plan));
  LIBRA_TRY(check_stated_summaries(source, j, plan));
  return plan;
}

PlanFileFormat plan_format_for_path(const std::string& path) {
  const std::string ext = ".json";
  return path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0
             ? PlanFileFormat::kJson
             : PlanFileFormat::kBinary;
}

Status save_plan(const Plan& plan, const std::string& path) { return save_plan(plan, path, plan_format_for_path(path)); }

Status save_plan(const Plan& plan, const std::string& path, PlanFileFormat format) {
  return write_file_atomic(path, format == PlanFileFormat::kJson ? plan_to_json(plan) : plan_to_binary(plan));
}

Result<Plan> load_plan(const std::string& path) {
  LIBRA_ASSIGN_OR_RETURN(std::string bytes, read_file(path));
  if (bytes.size() >= sizeof kMagic && std::memcmp(bytes.data(), kMagic, sizeof kMagic) == 0) {
    return plan_from_binary(bytes, path);
  }
  return plan_from_json(bytes, path);
}

}  // namespace libra
