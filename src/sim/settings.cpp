// Names and settings: the variant name table, model and hardware presets,
// and the one settings schema that the JSON config and the CLI flags share.
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <variant>

#include "core/decimal.hpp"
#include "libra/dtype.hpp"
#include "libra/simulator.hpp"

namespace libra {

namespace {

constexpr std::array<std::pair<Variant, std::string_view>, 8> kVariantNames = {{
    {Variant::kUlysses, "ulysses"},
    {Variant::kWlb, "wlb"},
    {Variant::kDistca, "distca"},
    {Variant::kLibraTap, "libra-tap"},
    {Variant::kLibraTapVrsp, "libra-tap-vrsp"},
    {Variant::kLibraFull, "libra-full"},
    {Variant::kLibraPlus, "libra-plus"},
    {Variant::kLibraTopo, "libra-topo"},
}};
constexpr std::array<Variant, 8> kAllVariants = {Variant::kUlysses,      Variant::kWlb,       Variant::kDistca,
                                                 Variant::kLibraTap,     Variant::kLibraTapVrsp,
                                                 Variant::kLibraFull,    Variant::kLibraPlus, Variant::kLibraTopo};
constexpr std::array<Variant, 6> kCandidateVariants = {Variant::kLibraTap,  Variant::kLibraTapVrsp, Variant::kLibraFull,
                                                       Variant::kLibraPlus, Variant::kDistca,      Variant::kLibraTopo};

}  // namespace

std::string_view variant_name(Variant v) {
  for (const auto& [k, n] : kVariantNames) {
    if (k == v) return n;
  }
  return "?";
}

Result<Variant> parse_variant(std::string_view name) {
  for (const auto& [k, n] : kVariantNames) {
    if (n == name) return k;
  }
  return invalid_input(fmt::format("variant '{}': unknown", name));
}

std::span<const Variant> all_variants() { return kAllVariants; }
std::span<const Variant> candidate_variants() { return kCandidateVariants; }

bool variant_pipelined(Variant v) {
  return v == Variant::kLibraFull || v == Variant::kLibraPlus || v == Variant::kLibraTopo || v == Variant::kDistca;
}

const VariantLatency* CandidateResult::find(Variant v) const {
  for (const auto& l : latency) {
    if (l.variant == v) return &l;
  }
  return nullptr;
}

const Stat& CandidateResult::inter(PlacementMode mode) const {
  for (const auto& [m, s] : inter_imbalance) {
    if (m == mode) return s;
  }
  static const Stat kNone;
  return kNone;
}

Result<ModelShape> model_preset(std::string_view name) {
  if (name == "qwen3-30b-a3b") return ModelShape{};
  return invalid_input(fmt::format("--model '{}': unknown preset; known: qwen3-30b-a3b", name));
}

std::vector<std::string> hardware_profile_names() { return {"h200-fa3", "h200-fa2"}; }

Result<CostModel> hardware_profile(std::string_view name) {
  CostModel m;
  if (name == "h200-fa3") return m;
  if (name == "h200-fa2") {
    // FlashAttention-2 on Hopper reaches ~35% of dense bf16 peak forward
    // (no wgmma/TMA pipelining), about 0.6x FlashAttention-3.
    m.analytic.peak_fwd_tflops = 350;
    m.analytic.peak_bwd_tflops = 260;
    m.kernel = analytic_profile(m.analytic, "h200-fa2-analytic");
    return m;
  }
  return invalid_input(fmt::format("--hardware '{}': unknown profile; known: h200-fa3, h200-fa2", name));
}

// ----- The settings schema ---------------------------------------------------

namespace {

using Value = std::variant<std::int64_t, std::uint64_t, double, std::vector<std::int64_t>, std::string, bool>;
using Apply = Status (*)(SimConfig&, const Value&, const std::string& where);
using Dump = nlohmann::ordered_json (*)(const SimConfig&);

struct Entry {
  SimSetting s;
  Apply apply;
  Dump dump;
};

template <class T>
const T& as(const Value& v) {
  return std::get<T>(v);
}

// A preset's own message already names the flag; a config file adds its place.
Status preset_error(const std::string& where, const Error& e) {
  if (where.rfind("--", 0) == 0) return e;
  return invalid_input(where + ": " + e.message());
}

Status regenerate_kernel(SimConfig& c, const std::string& where) {
  auto positive = [](double x) { return x > 0 && std::isfinite(x); };
  const AnalyticKernel& k = c.cost.analytic;
  if (!positive(k.peak_fwd_tflops) || !positive(k.peak_bwd_tflops) || !positive(k.half_block_len) ||
      !positive(k.half_heads)) {
    return invalid_input(where + ": must be positive");
  }
  c.cost.kernel = analytic_profile(k, c.cost.kernel.device.empty() ? "analytic" : c.cost.kernel.device);
  return {};
}

#define LIBRA_INT(field) \
  [](SimConfig& c, const Value& v, const std::string&) -> Status { c.field = as<std::int64_t>(v); return {}; }, \
  [](const SimConfig& c) { return nlohmann::ordered_json(c.field); }
#define LIBRA_UINT(field) \
  [](SimConfig& c, const Value& v, const std::string&) -> Status { c.field = as<std::uint64_t>(v); return {}; }, \
  [](const SimConfig& c) { return nlohmann::ordered_json(c.field); }
#define LIBRA_NUM(field) \
  [](SimConfig& c, const Value& v, const std::string&) -> Status { c.field = as<double>(v); return {}; }, \
  [](const SimConfig& c) { return nlohmann::ordered_json(c.field); }
#define LIBRA_LIST(field) \
  [](SimConfig& c, const Value& v, const std::string&) -> Status { c.field = as<std::vector<std::int64_t>>(v); return {}; }, \
  [](const SimConfig& c) { return nlohmann::ordered_json(c.field); }
#define LIBRA_KERNEL(field) \
  [](SimConfig& c, const Value& v, const std::string& where) -> Status { \
    c.cost.analytic.field = as<double>(v); return regenerate_kernel(c, where); }, \
  [](const SimConfig& c) { return nlohmann::ordered_json(c.cost.analytic.field); }

using T = SettingType;

// Presets first: explicit keys in the same file or command line override
// them; the measured kernel profile last, so it replaces any analytic one.
const std::vector<Entry>& entries() {
  static const std::vector<Entry> e = {
      {{"hardware", "--hardware", T::kString, "hardware profile: h200-fa3 (default) or h200-fa2"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         auto m = hardware_profile(as<std::string>(v));
         if (!m.ok()) return preset_error(where, m.error());
         c.cost = *m;
         c.hardware = as<std::string>(v);
         return {};
       },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.hardware); }},
      {{"model", "--model", T::kString, "attention preset: qwen3-30b-a3b (default)"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         auto m = model_preset(as<std::string>(v));
         if (!m.ok()) return preset_error(where, m.error());
         c.model = *m;
         return {};
       },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.model.name); }},
      {{"source", "--source", T::kString, "corpus: file or builtin:NAME (default builtin:paper-1m)"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status { c.source = as<std::string>(v); return {}; },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.source); }},
      {{"seq_len", "--seq-len", T::kInt, "packed length L (default: the corpus' own)"}, LIBRA_INT(seq_len)},
      {{"gbs", "--gbs", T::kInt, "global batch size D (default 128)"}, LIBRA_INT(gbs)},
      {{"dp", "--dp", T::kInt, "data-parallel replicas (default 16)"}, LIBRA_INT(dp)},
      {{"cp", "--cp", T::kInt, "context-parallel workers per replica (default 8)"}, LIBRA_INT(cp)},
      {{"heads_q", "--heads-q", T::kInt, "query heads h_q"}, LIBRA_INT(model.heads_q)},
      {{"heads_kv", "--heads-kv", T::kInt, "KV heads h_kv"}, LIBRA_INT(model.heads_kv)},
      {{"head_dim", "--head-dim", T::kInt, "head dimension d"}, LIBRA_INT(model.head_dim)},
      {{"elem_bytes", "--elem-bytes", T::kInt, "bytes per element (2: bf16/fp16, 4: fp32)"},
       LIBRA_INT(model.elem_bytes)},
      {{"dtype", "--dtype", T::kString, "bf16 (default), fp16 or fp32: sets --elem-bytes"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         Result<DType> d = parse_dtype(as<std::string>(v));
         if (!d.ok()) return invalid_input(where + ": must be bf16, fp16 or fp32");
         c.model.elem_bytes = dtype_bytes(*d);
         return {};
       },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.model.elem_bytes == 4 ? "fp32" : "bf16"); }},
      {{"layers", "--layers", T::kInt, "transformer layers (end-to-end model, default 48)"}, LIBRA_INT(model.layers)},
      {{"active_params", "--active-params", T::kNumber, "active parameters per token (default 3.3e9)"},
       LIBRA_NUM(model.active_params)},
      {{"grad_bytes_per_gpu", "--grad-bytes-per-gpu", T::kNumber, "gradient bytes all-reduced per GPU (default 7.6e9)"},
       LIBRA_NUM(model.grad_bytes_per_gpu)},
      {{"pool_size", "--pool-size", T::kIntList, "candidate pool sizes P (default 2,4,8,16)"}, LIBRA_LIST(pool_sizes)},
      {{"head_shards", "--head-shards", T::kIntList, "candidate head shards H (default 4,8)"}, LIBRA_LIST(head_shards)},
      {{"block_size", "--block-size", T::kIntList, "candidate block sizes B (default 8192,16384,32768)"},
       LIBRA_LIST(block_sizes)},
      {{"chunks", "--chunks", T::kIntList,
        "pipeliner chunks M; a list: each candidate's pipelined variants take the best (default 1,2,4)"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status {
         c.chunks = as<std::vector<std::int64_t>>(v);
         return {};
       },
       // One M is written as a number, as before lists were accepted.
       [](const SimConfig& c) {
         return c.chunks.size() == 1 ? nlohmann::ordered_json(c.chunks[0]) : nlohmann::ordered_json(c.chunks);
       }},
      {{"kv_prefix", "--kv-prefix", T::kBool,
        "libra-topo sends only the causal prefix of a sample's K/V a worker reads (default true)"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status { c.kv_prefix = as<bool>(v); return {}; },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.kv_prefix); }},
      {{"home_layout", "--home-layout", T::kString,
        "libra-topo's home rows per CP rank: auto (default: zigzag where B divides L / 2CP), zigzag or contiguous"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         const std::string name = as<std::string>(v);
         if (name == "auto") {
           c.home_layout.reset();
           return {};
         }
         Result<HomeLayout> l = parse_home_layout(name);
         if (!l.ok()) return invalid_input(where + " '" + name + "': must be auto, zigzag or contiguous");
         c.home_layout = *l;
         return {};
       },
       [](const SimConfig& c) {
         return nlohmann::ordered_json(c.home_layout ? std::string(home_layout_name(*c.home_layout)) : "auto");
       }},
      {{"relay", "--relay", T::kString,
        "libra-topo sends cross-node inputs through node-mates: auto (default: priced both ways, relayed where faster), "
        "on or off"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         const std::string name = as<std::string>(v);
         if (name == "auto") {
           c.relay.reset();
         } else if (name == "on" || name == "off") {
           c.relay = name == "on";
         } else {
           return invalid_input(where + " '" + name + "': must be auto, on or off");
         }
         return {};
       },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.relay ? (*c.relay ? "on" : "off") : "auto"); }},
      {{"chunk_split", "--chunk-split", T::kString,
        "how libra-topo's pipeline chunks cut a tile's heads: auto (default: equal and tapered priced, the faster "
        "runs), equal, or tapered (where 3 <= M <= heads per tile)"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         const std::string name = as<std::string>(v);
         if (name == "auto") {
           c.chunk_split.reset();
           return {};
         }
         auto split = parse_chunk_split(name);
         if (!split.ok()) return invalid_input(where + " '" + name + "': must be auto, equal or tapered");
         c.chunk_split = *split;
         return {};
       },
       [](const SimConfig& c) {
         return nlohmann::ordered_json(c.chunk_split ? std::string(chunk_split_name(*c.chunk_split)) : "auto");
       }},
      {{"tau", "--tau", T::kNumber, "TAP load slack (default 0.03)"}, LIBRA_NUM(tau)},
      {{"windows", "--windows", T::kInt, "windows to simulate, 0 = all (default 20)"}, LIBRA_INT(max_windows)},
      {{"threads", "--threads", T::kInt, "worker threads, 0 = all cores (default)"}, LIBRA_INT(threads)},
      {{"seed", "--seed", T::kUint, "first seed of the random placement baseline (default 0)"}, LIBRA_UINT(seed)},
      {{"random_seeds", "--random-seeds", T::kInt, "random groupings averaged per window (default 32)"},
       LIBRA_INT(random_seeds)},
      {{"scaling_dp", "--scaling-dp", T::kIntList, "DP values of the end-to-end sweep (default 1,2,4,8,16)"},
       LIBRA_LIST(scaling_dp)},
      {{"end_to_end", "--end-to-end", T::kBool, "run the DP sweep and microbatch model (default true)"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status { c.end_to_end = as<bool>(v); return {}; },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.end_to_end); }},
      {{"coupling", "--coupling", T::kString,
        "how replicas wait for each other per micro-batch in the end-to-end step: none, all (default) or a span of N "
        "replicas"},
       [](SimConfig& c, const Value& v, const std::string& where) -> Status {
         const std::string name = as<std::string>(v);
         if (name == "none") {
           c.coupling = 1;
         } else if (name == "all") {
           c.coupling = 0;
         } else {
           std::int64_t n = 0;
           const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
           if (ec != std::errc() || end != name.data() + name.size() || n < 1) {
             return invalid_input(where + " '" + name + "': must be none, all or a positive number of replicas");
           }
           c.coupling = n;
         }
         return {};
       },
       [](const SimConfig& c) {
         return nlohmann::ordered_json(c.coupling == 0 ? "all" : c.coupling == 1 ? "none" : std::to_string(c.coupling));
       }},
      {{"pp", "--pp", T::kInt, "pipeline stages of the end-to-end step's 1F1B schedule (default 4)"}, LIBRA_INT(pp)},
      {{"trained_heads_kv", "--trained-heads-kv", T::kInt,
        "KV heads of the trained model in the end-to-end step (default 0: --heads-kv)"},
       LIBRA_INT(trained_heads_kv)},
      {{"step_costs_out", "--step-costs-out", T::kString,
        "debug: write the end-to-end step model's micro-batch costs and steps to this JSON file"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status {
         c.step_costs_out = as<std::string>(v);
         return {};
       },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.step_costs_out); }},
      {{"worst_weight", "--worst-weight", T::kNumber,
        "recommend by mean + W x worst libra-full latency (default 0: mean only)"},
       LIBRA_NUM(worst_weight)},
      {{"distca_max_gpus", "--distca-max-gpus", T::kInt, "time distca only up to this many GPUs (default 1024)"},
       LIBRA_INT(distca_max_gpus)},
      {{"gpus_per_node", "--gpus-per-node", T::kInt, "GPUs per node (default 8)"}, LIBRA_INT(cost.net.gpus_per_node)},
      {{"nodes_per_supernode", "--nodes-per-supernode", T::kInt, "nodes per supernode / rail group (default 4)"},
       LIBRA_INT(cost.net.nodes_per_supernode)},
      {{"intra_node_gbps", "--intra-node-gbps", T::kNumber, "NVLink bandwidth per GPU, GB/s (default 360)"},
       LIBRA_NUM(cost.net.intra_node_gbps)},
      {{"inter_node_gbps", "--inter-node-gbps", T::kNumber, "NIC bandwidth per GPU, GB/s (default 45)"},
       LIBRA_NUM(cost.net.inter_node_gbps)},
      {{"inter_supernode_gbps", "--inter-supernode-gbps", T::kNumber,
        "per-GPU share of the supernode uplinks, GB/s (default 7.5)"},
       LIBRA_NUM(cost.net.inter_supernode_gbps)},
      {{"congestion_per_node", "--congestion-per-node", T::kNumber,
        "NIC slowdown per node beyond two that an all-to-all spans (default 0.5)"},
       LIBRA_NUM(cost.net.congestion_per_node)},
      {{"latency_us", "--latency-us", T::kNumber, "per-message latency, microseconds (default 10)"},
       LIBRA_NUM(cost.net.latency_us)},
      {{"pxn", "--pxn", T::kBool,
        "price cross-node sends as NCCL's PXN routes them: over NVLink to the node-mate on the receiver's rail, "
        "then its NIC (default false: the sender's own NIC)"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status { c.cost.net.pxn = as<bool>(v); return {}; },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.cost.net.pxn); }},
      {{"noise_sigma", "--noise-sigma", T::kNumber, "per-GPU runtime noise sigma, 0 = off (default 0.0132)"},
       LIBRA_NUM(cost.noise.sigma)},
      {{"noise_seed", "--noise-seed", T::kUint, "seed of the device noise (default 1)"}, LIBRA_UINT(cost.noise.seed)},
      {{"linear_tflops", "--linear-tflops", T::kNumber, "achieved TFLOP/s of the linear part (default 400)"},
       LIBRA_NUM(cost.step.linear_tflops)},
      {{"peak_fwd_tflops", "--peak-fwd-tflops", T::kNumber, "analytic kernel: forward peak (h200-fa3: 600)"},
       LIBRA_KERNEL(peak_fwd_tflops)},
      {{"peak_bwd_tflops", "--peak-bwd-tflops", T::kNumber, "analytic kernel: backward peak (h200-fa3: 450)"},
       LIBRA_KERNEL(peak_bwd_tflops)},
      {{"half_block_len", "--half-block-len", T::kNumber, "analytic kernel: block length at half rate (default 512)"},
       LIBRA_KERNEL(half_block_len)},
      {{"half_heads", "--half-heads", T::kNumber, "analytic kernel: head-count constant (default 0.25)"},
       LIBRA_KERNEL(half_heads)},
      {{"kernel_profile", "--kernel-profile", T::kString, "measured throughput profile JSON (replaces the analytic one)"},
       [](SimConfig& c, const Value& v, const std::string&) -> Status {
         LIBRA_ASSIGN_OR_RETURN(KernelProfile p, load_kernel_profile(as<std::string>(v)));
         c.cost.kernel = std::move(p);
         return {};
       },
       [](const SimConfig& c) { return nlohmann::ordered_json(c.cost.kernel.device); }},
  };
  return e;
}

#undef LIBRA_INT
#undef LIBRA_UINT
#undef LIBRA_NUM
#undef LIBRA_LIST
#undef LIBRA_KERNEL

const Entry* entry_of(std::string_view key) {
  for (const auto& e : entries()) {
    if (e.s.key == key) return &e;
  }
  return nullptr;
}

// The CLI's one decimal parser (core/decimal.hpp) and its messages, so a
// simulate flag reads like every other libra flag.
template <class I>
Result<I> parse_int(std::string_view t, const std::string& where) {
  const auto r = detail::parse_decimal<I>(t);
  if (r.error == detail::DecimalError::kRange) {
    return invalid_input(fmt::format("{}: {} is out of range (at most {})", where, t, std::numeric_limits<I>::max()));
  }
  if (!r.ok()) {
    return invalid_input(fmt::format("{}: '{}' is not a decimal integer (digits only{}; no '+' or 0x)", where, t,
                                     std::is_signed_v<I> ? ", an optional '-'" : ""));
  }
  return r.value;
}

// Text (a flag's value) to a typed value.
Result<Value> from_text(SettingType type, std::string_view t, const std::string& where) {
  switch (type) {
    case T::kInt: {
      LIBRA_ASSIGN_OR_RETURN(std::int64_t v, parse_int<std::int64_t>(t, where));
      return Value(v);
    }
    case T::kUint: {
      LIBRA_ASSIGN_OR_RETURN(std::uint64_t v, parse_int<std::uint64_t>(t, where));
      return Value(v);
    }
    case T::kNumber: {
      double v = 0;
      const char* end = t.data() + t.size();
      auto [p, ec] = std::from_chars(t.data(), end, v);
      if (ec != std::errc() || p != end || t.empty() || !std::isfinite(v)) {
        return invalid_input(fmt::format("{}: '{}' is not a number", where, t));
      }
      return Value(v);
    }
    case T::kIntList: {
      std::vector<std::int64_t> out;
      std::size_t start = 0;
      while (true) {
        const std::size_t comma = t.find(',', start);
        if (comma == start || (comma == std::string_view::npos && start == t.size() && start > 0)) {
          return invalid_input(fmt::format("{} {}: an empty item; give integers separated by single commas", where, t));
        }
        LIBRA_ASSIGN_OR_RETURN(std::int64_t v, parse_int<std::int64_t>(t.substr(start, comma - start), where));
        out.push_back(v);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
      return Value(std::move(out));
    }
    case T::kString: return Value(std::string(t));
    case T::kBool:
      if (t == "true" || t == "1") return Value(true);
      if (t == "false" || t == "0") return Value(false);
      return invalid_input(fmt::format("{}: '{}' must be true or false", where, t));
  }
  return invalid_input(where + ": unsupported");
}

Result<Value> from_json(SettingType type, const nlohmann::json& v, const std::string& where) {
  switch (type) {
    case T::kInt:
      if (!v.is_number_integer()) return invalid_input(where + ": must be an integer");
      if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
        return invalid_input(where + ": out of the int64 range");
      }
      return Value(v.get<std::int64_t>());
    case T::kUint:
      if (!v.is_number_unsigned()) return invalid_input(where + ": must be a non-negative integer");
      return Value(v.get<std::uint64_t>());
    case T::kNumber:
      if (!v.is_number()) return invalid_input(where + ": must be a number");
      return Value(v.get<double>());
    case T::kIntList: {
      std::vector<std::int64_t> out;
      if (v.is_number_integer()) {
        out.push_back(v.get<std::int64_t>());
        return Value(std::move(out));
      }
      if (!v.is_array() || v.empty()) return invalid_input(where + ": must be an integer or a non-empty array of integers");
      for (const auto& x : v) {
        if (!x.is_number_integer()) return invalid_input(where + ": must be an integer or a non-empty array of integers");
        out.push_back(x.get<std::int64_t>());
      }
      return Value(std::move(out));
    }
    case T::kString:
      if (!v.is_string()) return invalid_input(where + ": must be a string");
      return Value(v.get<std::string>());
    case T::kBool:
      if (!v.is_boolean()) return invalid_input(where + ": must be true or false");
      return Value(v.get<bool>());
  }
  return invalid_input(where + ": unsupported");
}

// Plural spellings kept for configs written before the schema.
std::string_view canonical_key(std::string_view key) {
  if (key == "pool_sizes") return "pool_size";
  if (key == "block_sizes") return "block_size";
  return key;
}

}  // namespace

std::span<const SimSetting> sim_settings() {
  static const std::vector<SimSetting> s = [] {
    std::vector<SimSetting> out;
    for (const auto& e : entries()) out.push_back(e.s);
    return out;
  }();
  return s;
}

Status apply_sim_setting(const SimSetting& setting, std::string_view text, const std::string& where,
                         SimConfig& config) {
  const Entry* e = entry_of(setting.key);
  if (e == nullptr) return invalid_input(where + ": unknown setting");
  LIBRA_ASSIGN_OR_RETURN(Value v, from_text(setting.type, text, where));
  return e->apply(config, v, where);
}

Status apply_sim_config_json(std::string_view text, const std::string& name, SimConfig& c) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return invalid_input(fmt::format("{}: not valid JSON: syntax error at byte {} (simulator config)", name, e.byte));
  } catch (const nlohmann::json::exception&) {
    return invalid_input(name + ": not valid JSON: a number is out of range (simulator config)");
  }
  if (!j.is_object()) {
    return invalid_input(fmt::format("{}: the simulator config must be a JSON object {{\"key\": value, ...}}, got {}", name,
                                     j.type_name()));
  }
  std::map<std::string_view, const nlohmann::json*> given;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "comment") continue;
    const std::string_view key = canonical_key(it.key());
    if (entry_of(key) == nullptr) return invalid_input(name + ": \"" + it.key() + "\": unknown key");
    given[key] = &it.value();
  }
  // Schema order, not file order: presets before the keys they contain.
  for (const auto& e : entries()) {
    auto it = given.find(e.s.key);
    if (it == given.end()) continue;
    const std::string where = name + ": \"" + std::string(e.s.key) + "\"";
    LIBRA_ASSIGN_OR_RETURN(Value v, from_json(e.s.type, *it->second, where));
    LIBRA_TRY(e.apply(c, v, where));
  }
  return {};
}

std::string sim_config_json(const SimConfig& config) {
  nlohmann::ordered_json j;
  for (const auto& e : entries()) {
    if (e.s.key == "kernel_profile" || e.s.key == "dtype") continue;  // a path / derived: not re-applied
    j[std::string(e.s.key)] = e.dump(config);
  }
  return j.dump(1) + "\n";
}

}  // namespace libra
