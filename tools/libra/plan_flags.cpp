#include "plan_flags.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <fstream>

namespace libra::cli {

namespace {
// Qwen3-30B-A3B: num_attention_heads 32, num_key_value_heads 4, head_dim 128.
// Llama 3 8B: 32 heads, 8 KV heads, hidden 4096; 70B: 64, 8, hidden 8192.
constexpr std::array<ModelPreset, 3> kPresets = {{
    {"qwen3-30b-a3b", 32, 4, 128},
    {"llama3-8b", 32, 8, 128},
    {"llama3-70b", 64, 8, 128},
}};
}  // namespace

std::span<const ModelPreset> model_presets() { return kPresets; }

std::string model_preset_names() {
  std::string out;
  for (const ModelPreset& p : kPresets) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

Result<ModelPreset> find_model_preset(std::string_view name) {
  for (const ModelPreset& p : kPresets) {
    if (p.name == name) return p;
  }
  return invalid_input("--model " + std::string(name) + ": unknown model; known: " + model_preset_names());
}

Result<DType> dtype_flag(std::string_view dtype) {
  Result<DType> t = parse_dtype(dtype);
  if (!t.ok()) return invalid_input("--dtype " + std::string(dtype) + ": " + t.error().message());
  return t;
}

Status name_preset_fields(const PlanFlags& f, Status s) {
  if (s.ok() || f.model.empty()) return s;
  Result<ModelPreset> p = find_model_preset(f.model);
  if (!p.ok()) return s;
  std::string from;
  auto add = [&](const auto& given, const char* name, int value) {
    if (!given) from += (from.empty() ? "" : ", ") + std::string(name) + " " + std::to_string(value);
  };
  add(f.heads_q, "--heads-q", p->heads_q);
  add(f.heads_kv, "--heads-kv", p->heads_kv);
  add(f.head_dim, "--head-dim", p->head_dim);
  if (from.empty()) return s;
  return Error(s.error().code(), s.error().message() + " (" + from + " from --model " + f.model + ")");
}

Status name_chunk_flags(const PlanFlags& f, const PlanConfig& c, Status s) {
  if (s.ok() || c.chunk_split == ChunkSplit::kEqual) return s;
  // Another rule failed when one equal chunk fails too.
  PlanConfig one = c;
  one.chunks = 1;
  one.chunk_split = ChunkSplit::kEqual;
  if (!validate_plan_config(one).ok()) return s;
  // The flags replace validate_plan_config's lead ("plan config: tapered chunks need ..."). A message
  // without that lead is passed on whole rather than cut at a guess (plan_flags_test pins both).
  constexpr std::string_view kLead = "plan config: ";
  const std::string& message = s.error().message();
  if (!message.starts_with(kLead)) return s;
  return Error(s.error().code(), "--chunks " + std::to_string(c.chunks) + " --chunk-split " + f.chunk_split + ": " +
                                     message.substr(kLead.size()));
}

std::vector<std::int32_t> chunk_widths(const PlanConfig& c) {
  const int shards = c.mode == PlanMode::kUlysses ? c.cp : c.head_shards;
  std::vector<std::int32_t> out;
  if (shards <= 0) return out;
  const std::int32_t width = c.shape.heads_q / shards;
  for (int m = 0; m < c.chunks; ++m) {
    out.push_back(chunk_head_offset(width, c.chunks, c.chunk_split, m + 1) -
                  chunk_head_offset(width, c.chunks, c.chunk_split, m));
  }
  return out;
}

std::string tapered_chunks_text(const PlanConfig& c) {
  if (c.chunk_split == ChunkSplit::kEqual) return {};
  return fmt::format("{} chunks {}", chunk_split_name(c.chunk_split), fmt::join(chunk_widths(c), ","));
}

Status check_plan_path(const std::string& path, std::string_view flag) {
  const std::string f(flag);
  if (path == "-") {
    return invalid_input(f + " -: a plan is read from a file, not standard input; save it with libra plan -o FILE");
  }
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {0, 0};
  if (in.read(magic, 2) && static_cast<unsigned char>(magic[0]) == 0x1f && static_cast<unsigned char>(magic[1]) == 0x8b) {
    return invalid_input(f + " " + path + ": is gzip-compressed; plan files are read uncompressed (gunzip it first)");
  }
  return {};
}

void add_plan_flags(CLI::App* sub, PlanFlags& f, std::string_view required) {
  const std::string req = " (" + std::string(required) + ")";
  const std::string shape_req = " (" + std::string(required) + "; or --model)";
  auto keep = [&](CLI::Option* o) { f.options.push_back(o); };
  keep(sub->add_option("--seq-len", f.seq_len, "Packed length L of every slot" + req));
  keep(sub->add_option("--cp", f.cp, "CP workers per slot" + req));
  keep(sub->add_option("--block-size,--block", f.block, "Query rows per SH-Tile (B)" + req));
  keep(sub->add_option("--head-shards", f.head_shards, "Head shards per block (H)" + req));
  keep(sub->add_option("--model", f.model, "Attention shape preset: " + model_preset_names()));
  keep(sub->add_option("--heads-q", f.heads_q, "Query heads h_q" + shape_req));
  keep(sub->add_option("--heads-kv", f.heads_kv, "KV heads h_kv" + shape_req));
  keep(sub->add_option("--head-dim", f.head_dim, "Head dimension d" + shape_req));
  keep(sub->add_option("--dtype", f.dtype, "Element type: bf16, fp16 or fp32"));
  keep(sub->add_option("--window", f.window, "Sliding-window width (default: full causal)"));
  keep(sub->add_option("--tau", f.tau, "TAP load slack of the soft target C"));
  keep(sub->add_option("--chunks", f.chunks, "Pipeline chunks M; divides h_q/H (equal cut)"));
  keep(sub->add_option("--chunk-split", f.chunk_split,
                       "How the chunks cut a tile's query heads: equal (w/M each), or tapered (first and last chunk "
                       "about half as wide as the middle ones; 3 <= M <= w; plan format 4)"));
  keep(sub->add_option("--home-layout", f.home_layout,
                       "Rows each CP rank holds: contiguous, or zigzag (chunks r and 2CP-1-r of 2CP, as Megatron CP)"));
  keep(sub->add_flag("--kv-prefix", f.kv_prefix,
                     "Send each worker only the causal prefix of a sample's K/V its tiles read (not the contract's "
                     "whole sample; plan format 3)"));
}

std::string first_plan_flag_given(const PlanFlags& f) {
  for (const CLI::Option* o : f.options) {
    if (o->count() > 0) return o->get_name();
  }
  return {};
}

Result<PlanConfig> plan_config_from(const PlanFlags& f) {
  PlanConfig c;
  std::optional<int> hq = f.heads_q, hkv = f.heads_kv, d = f.head_dim;
  if (!f.model.empty()) {
    LIBRA_ASSIGN_OR_RETURN(ModelPreset p, find_model_preset(f.model));
    if (!hq) hq = p.heads_q;
    if (!hkv) hkv = p.heads_kv;
    if (!d) d = p.head_dim;
  }
  const std::string instead = f.instead.empty() ? "" : " (or " + f.instead + ")";
  const std::string shape_instead = " (or --model NAME" + (f.instead.empty() ? "" : ", or " + f.instead) + ")";
  auto need = [](const auto& v, const char* flag, const std::string& hint) -> Status {
    if (!v) return invalid_input(std::string(flag) + " is required to plan a pool" + hint);
    return {};
  };
  LIBRA_TRY(need(f.seq_len, "--seq-len", instead));
  LIBRA_TRY(need(f.cp, "--cp", instead));
  LIBRA_TRY(need(f.block, "--block-size", instead));
  LIBRA_TRY(need(f.head_shards, "--head-shards", instead));
  LIBRA_TRY(need(hq, "--heads-q", shape_instead));
  LIBRA_TRY(need(hkv, "--heads-kv", shape_instead));
  LIBRA_TRY(need(d, "--head-dim", shape_instead));
  c.seq_len = *f.seq_len;
  c.cp = *f.cp;
  c.block_size = *f.block;
  c.head_shards = *f.head_shards;
  c.shape.heads_q = *hq;
  c.shape.heads_kv = *hkv;
  c.shape.head_dim = *d;
  LIBRA_ASSIGN_OR_RETURN(c.shape.dtype, dtype_flag(f.dtype));
  if (f.window) {
    if (*f.window < 1) return invalid_input("--window " + std::to_string(*f.window) + ": must be at least 1");
    c.shape.window = *f.window;
  }
  c.tau = f.tau;
  c.chunks = f.chunks;
  auto split = parse_chunk_split(f.chunk_split);
  if (!split.ok()) return invalid_input("--chunk-split " + f.chunk_split + ": must be equal or tapered");
  c.chunk_split = *split;
  auto layout = parse_home_layout(f.home_layout);
  if (!layout.ok()) return invalid_input("--home-layout " + f.home_layout + ": must be contiguous or zigzag");
  c.home_layout = *layout;
  c.kv_prefix = f.kv_prefix;
  return c;
}

}  // namespace libra::cli
