// The flags `libra exec` and `libra bench exec` share (exec_flags.hpp).
#include "exec_flags.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "libra/corpus.hpp"

namespace libra::cli {

std::vector<const CLI::Option*> add_pool_flags(CLI::App* sub, PoolFlags& o, bool bench) {
  std::vector<const CLI::Option*> pool_flags;
  pool_flags.push_back(sub->add_option("source", o.source, "pool: JSON Lines file (one packed sequence per line) or "
                                                           "builtin:NAME, whose sequences are scaled to --seq-len"));
  add_plan_flags(sub, o.flags, bench ? "default: a CPU-sized pool, see docs/executor.md" : "required unless --plan");
  if (!bench) o.flags.instead = "--plan FILE, whose plan carries the shape";
  pool_flags.push_back(sub->add_option("--pool-size", o.pool_size,
                                       bench ? "slots per pool P (default 4)" : "slots per pool P (default: ranks / cp)"));
  pool_flags.push_back(
      sub->add_option("--pool-index", o.pool_index, "first pool drawn from the source: sequences [index*P, ...)"));
  sub->add_option("--threads", o.threads, "kernel threads per rank");
  sub->add_flag("--relay", o.relay,
                "send cross-node inputs through node-mates chosen by libra::plan_relays (nodes of the plan's "
                "topology: save the plan with `libra plan --gpus-per-node N` and pass --plan)");
  return pool_flags;
}

Result<std::vector<PackedSequence>> load_scaled(const std::string& source, std::int64_t seq_len, double* scale) {
  *scale = 1.0;
  if (source.rfind("builtin:", 0) != 0) return load_packed_sequences(source, seq_len);
  LIBRA_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(source));
  const std::int64_t D = corpus.default_seq_len;
  if (D <= 0 || D == seq_len) return load_packed_sequences(source, seq_len);
  LIBRA_ASSIGN_OR_RETURN(std::vector<PackedSequence> packed, load_packed_sequences(source, std::nullopt));
  *scale = static_cast<double>(seq_len) / static_cast<double>(D);
  for (PackedSequence& seq : packed) {
    PackedSequence out;
    std::int64_t total = 0;
    for (std::int64_t l : seq) {
      const std::int64_t s = std::max<std::int64_t>(1, l * seq_len / D);  // l, L <= 2^31: no overflow
      if (total + s > seq_len) break;
      out.push_back(s);
      total += s;
    }
    seq = std::move(out);
  }
  return packed;
}

Status check_threads(int threads) {
  if (threads < 1 || threads > kMaxThreads) {
    return invalid_input(fmt::format("--threads {}: must be in [1, {}]", threads, kMaxThreads));
  }
  return Status();
}

Result<PlanConfig> make_config(const PoolFlags& o, const std::string& mode) {
  LIBRA_ASSIGN_OR_RETURN(PlanConfig cfg, plan_config_from(o.flags));
  LIBRA_TRY(check_threads(o.threads));
  LIBRA_ASSIGN_OR_RETURN(cfg.mode, parse_plan_mode(mode == "ulysses-plan" ? "ulysses" : mode));
  if (mode == "ulysses") {
    // The baseline executor runs one chunk; it takes no cut.
    cfg.chunks = 1;
    cfg.chunk_split = ChunkSplit::kEqual;
  }
  LIBRA_TRY(name_preset_fields(o.flags, name_chunk_flags(o.flags, cfg, validate_plan_config(cfg))));
  return cfg;
}

}  // namespace libra::cli
