// The plan flags shared by `libra plan`, `libra exec` and `libra bench exec`:
// one spelling, one set of dtype choices and defaults, and --model presets
// for the attention shape.
//
//   PlanFlags flags;
//   add_plan_flags(sub, flags, "required to plan a pool");
//   ...after parsing:
//   Result<PlanConfig> c = plan_config_from(flags);  // names the first missing flag
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "libra/plan.hpp"
#include "libra/status.hpp"

namespace libra::cli {

// An attention shape by model name (heads from the models' published configs).
struct ModelPreset {
  std::string_view name;
  int heads_q, heads_kv, head_dim;
};
// qwen3-30b-a3b (32/4/128), llama3-8b (32/8/128), llama3-70b (64/8/128).
std::span<const ModelPreset> model_presets();
[[nodiscard]] Result<ModelPreset> find_model_preset(std::string_view name);
// "qwen3-30b-a3b, llama3-8b, llama3-70b" for messages and --help.
std::string model_preset_names();

struct PlanFlags {
  std::string model;  // empty: no preset
  std::optional<std::int64_t> seq_len, block, window;
  std::optional<int> cp, head_shards, heads_q, heads_kv, head_dim;
  std::string dtype = "bf16";
  double tau = 0.03;
  int chunks = 1;
  std::string chunk_split = "equal";  // equal | tapered (ChunkSplit)
  std::string home_layout = "contiguous";
  bool kv_prefix = false;
  std::vector<const CLI::Option*> options;  // every flag added, to tell which were given
  std::string instead;  // what replaces the flags, for messages: "--load PLAN", "--plan FILE"
};

// Adds --seq-len, --cp, --block-size (alias --block), --head-shards, --model,
// --heads-q, --heads-kv, --head-dim, --dtype, --window, --tau, --chunks,
// --chunk-split, --home-layout, --kv-prefix.
// `required` is how --help describes the flags a plan needs ("required",
// "required unless --load").
void add_plan_flags(CLI::App* sub, PlanFlags& flags, std::string_view required);

// The first plan flag given on the command line ("--seq-len"), or empty.
std::string first_plan_flag_given(const PlanFlags& flags);

// The configuration the flags describe (mode tap); the error names the first
// missing or invalid flag. Shape flags override the --model preset.
[[nodiscard]] Result<PlanConfig> plan_config_from(const PlanFlags& flags);

// The element type of a --dtype value (parse_dtype), the error naming the flag.
[[nodiscard]] Result<DType> dtype_flag(std::string_view dtype);

// `s` (a configuration error) with the shape fields that came from the
// --model preset named, so that "heads_q 32 must ..." is not read as a
// flag the user typed; `s` unchanged when no preset filled a field.
[[nodiscard]] Status name_preset_fields(const PlanFlags& flags, Status s);

// `s` (validate_plan_config's verdict on `c`, built from `flags`) with
// --chunks and --chunk-split named when the tapered cut is what it refuses
// ("--chunks 2 --chunk-split tapered: tapered chunks need 3 <= chunks <= ...",
// the flags in place of the message's "plan config: " lead); `s` unchanged
// otherwise, and unchanged when its message lacks that lead.
[[nodiscard]] Status name_chunk_flags(const PlanFlags& flags, const PlanConfig& c, Status s);

// The query heads of a tile in each chunk of a valid configuration (a
// tile is h_q / H heads wide, h_q / cp in mode ulysses): 1,3,3,1 for 8 heads
// in 4 tapered chunks.
std::vector<std::int32_t> chunk_widths(const PlanConfig& c);
// "tapered chunks 1,3,3,1" (chunk_widths); empty for the equal cut.
std::string tapered_chunks_text(const PlanConfig& c);

// Refuses plan paths load_plan would misreport: "-" (a plan is read from a
// file, not stdin) and a gzip file (read as JSON, "not valid JSON"). `flag`
// names the option in the message.
[[nodiscard]] Status check_plan_path(const std::string& path, std::string_view flag = "--plan");

}  // namespace libra::cli
