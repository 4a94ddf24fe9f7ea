// `libra corpus stats` and `libra pack`: corpus statistics and packing.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "commands.hpp"
#include "libra/corpus.hpp"
#include "libra/io.hpp"
#include "libra/packing.hpp"

namespace libra::cli {
namespace {

struct StatsOptions {
  std::string source;
  bool json = false;
  std::optional<std::int64_t> seq_len;
};

struct PackCliOptions {
  std::string source;
  std::optional<std::int64_t> seq_len;
  std::string output;
  std::string overlong = "split";
  std::string packer = "sequential";
};

std::string_view format_name(CorpusFormat f) {
  switch (f) {
    case CorpusFormat::kText: return "text";
    case CorpusFormat::kJsonLines: return "jsonl";
    case CorpusFormat::kMegatronIdx: return "megatron-idx";
    case CorpusFormat::kBuiltin: return "builtin";
  }
  return "?";
}

std::string_view format_description(const Corpus& c) {
  switch (c.format) {
    case CorpusFormat::kText: return "raw sample lengths (plain text)";
    case CorpusFormat::kJsonLines: return "packed sequences (JSON Lines)";
    case CorpusFormat::kMegatronIdx: return "raw sample lengths (Megatron-LM .idx)";
    case CorpusFormat::kBuiltin: return "raw sample lengths (built-in synthetic corpus)";
  }
  return "?";
}

Status check_seq_len(std::optional<std::int64_t> seq_len) {
  if (seq_len && (*seq_len < 1 || *seq_len > kMaxSeqLen)) {
    return invalid_input("--seq-len " + std::to_string(*seq_len) + ": must be in [1, " + std::to_string(kMaxSeqLen) +
                         "] so that F = sum l^2 fits in 64 bits");
  }
  return {};
}

// Percentiles and maxima are always values of the data (exact integers);
// print them as integers while a double holds them exactly.
nlohmann::ordered_json number(double v) {
  if (std::abs(v) < 9007199254740992.0 && v == std::floor(v)) return static_cast<std::int64_t>(v);
  return v;
}

nlohmann::ordered_json to_json(const Distribution& d) {
  return {{"count", d.count}, {"mean", d.mean},       {"median", number(d.median)}, {"p90", number(d.p90)},
          {"p99", number(d.p99)}, {"max", number(d.max)}, {"cv", d.cv}};
}

std::string row(std::string_view label, const Distribution& d) {
  return fmt::format("{:<17}{:>16.2f}{:>16}{:>16}{:>16}{:>16}{:>10.4f}\n", label, d.mean, number(d.median).dump(),
                     number(d.p90).dump(), number(d.p99).dump(), number(d.max).dump(), d.cv);
}

std::string header() {
  return fmt::format("{:<17}{:>16}{:>16}{:>16}{:>16}{:>16}{:>10}\n", "", "mean", "median", "p90", "p99", "max", "cv");
}

int run_stats(const StatsOptions& o) {
  if (Status s = check_seq_len(o.seq_len); !s.ok()) return fail(s);
  Result<Corpus> corpus = load_corpus(o.source);
  if (!corpus.ok()) return fail(corpus.error());
  if (o.seq_len && corpus->kind == CorpusKind::kPacked) {
    // Re-read with the length check so an overlong line is named.
    auto checked = load_packed_sequences(o.source, o.seq_len);
    if (!checked.ok()) return fail(checked.error());
  }
  Result<CorpusStats> stats = corpus_stats(*corpus);
  if (!stats.ok()) return fail(stats.error());

  // Raw corpora with a packed length (given, or the builtin's default) are
  // also shown packed sequentially, the way a data loader would.
  std::optional<CorpusStats> packed_stats;
  std::int64_t packed_at = 0;
  if (corpus->kind == CorpusKind::kRaw && (o.seq_len || corpus->default_seq_len > 0)) {
    packed_at = o.seq_len.value_or(corpus->default_seq_len);
    PackOptions popts;
    popts.seq_len = packed_at;
    Result<PackResult> packed = pack(corpus->raw_lengths, popts);
    if (!packed.ok()) return fail(packed.error());
    Corpus pc;
    pc.kind = CorpusKind::kPacked;
    pc.source = corpus->source;
    pc.packed = std::move(packed->sequences);
    Result<CorpusStats> ps = corpus_stats(pc);
    if (!ps.ok()) return fail(ps.error());
    packed_stats = std::move(*ps);
  } else if (corpus->kind == CorpusKind::kPacked) {
    packed_stats = *stats;
  }

  std::string out;
  if (o.json) {
    nlohmann::ordered_json j = {{"source", corpus->source},
                        {"format", format_name(corpus->format)},
                        {"kind", corpus->kind == CorpusKind::kRaw ? "raw" : "packed"},
                        {"samples", stats->samples},
                        {"total_tokens", stats->total_tokens},
                        {"sample_length", to_json(stats->lengths)}};
    if (corpus->default_seq_len > 0) j["default_seq_len"] = corpus->default_seq_len;
    if (packed_stats) {
      nlohmann::ordered_json p = {{"sequences", packed_stats->tokens_per_sequence->count},
                          {"tokens_per_sequence", to_json(*packed_stats->tokens_per_sequence)},
                          {"workload_f", to_json(*packed_stats->workloads)}};
      if (packed_at > 0) {
        p["packed_by"] = "libra sequential, overlong samples split";
        p["seq_len"] = packed_at;
      } else {
        p["packed_by"] = "input";
        if (o.seq_len) p["seq_len"] = *o.seq_len;
      }
      j["packed"] = std::move(p);
    }
    out = j.dump(2) + "\n";
  } else {
    out += fmt::format("source        {}\n", corpus->source);
    out += fmt::format("format        {}\n", format_description(*corpus));
    out += fmt::format("samples       {}\n", stats->samples);
    out += fmt::format("total tokens  {}\n", stats->total_tokens);
    if (packed_stats) {
      if (packed_at > 0) {
        out += fmt::format("packed        {} sequences, sequentially at seq_len {} (overlong samples split)\n",
                           packed_stats->tokens_per_sequence->count, packed_at);
      } else {
        out += fmt::format("packed        {} sequences as given\n", packed_stats->tokens_per_sequence->count);
      }
    }
    out += "\n" + header() + row("sample length", stats->lengths);
    if (packed_stats) {
      out += row("tokens/sequence", *packed_stats->tokens_per_sequence);
      out += row("F = sum l^2", *packed_stats->workloads);
    }
  }
  std::cout << out;
  std::cout.flush();
  return std::cout ? kExitOk : fail(io_error("standard output: write failed"));
}

int run_pack(const PackCliOptions& o) {
  Result<OverlongPolicy> overlong = parse_overlong_policy(o.overlong);
  if (!overlong.ok()) return fail(overlong.error());
  Result<PackerKind> packer = parse_packer_kind(o.packer);
  if (!packer.ok()) return fail(packer.error());
  if (Status s = check_seq_len(o.seq_len); !s.ok()) return fail(s);
  Result<Corpus> corpus = load_corpus(o.source);
  if (!corpus.ok()) return fail(corpus.error());
  if (corpus->kind != CorpusKind::kRaw) {
    return fail(invalid_input(o.source + ": already packed sequences (JSON Lines); pack reads raw sample lengths"));
  }
  if (!o.seq_len && corpus->default_seq_len == 0) {
    return fail(invalid_input(o.source + ": raw sample lengths have no default packed length; give --seq-len"));
  }
  PackOptions popts;
  popts.seq_len = o.seq_len.value_or(corpus->default_seq_len);
  popts.overlong = *overlong;
  popts.packer = *packer;
  Result<PackResult> r = pack(corpus->raw_lengths, popts);
  if (!r.ok()) return fail(r.error());
  if (r->sequences.empty()) {
    return fail(invalid_input(o.source + ": --overlong drop left nothing: every sample is longer than --seq-len " +
                              std::to_string(popts.seq_len)));
  }
  if (Status s = write_file_atomic(o.output, format_packed_jsonl(r->sequences)); !s.ok()) return fail(s);
  std::cerr << fmt::format(
      "libra: packed {} samples ({} tokens) into {} sequences of at most {} tokens ({}); {} overlong samples ({}), "
      "{} tokens dropped\n",
      r->input_samples, r->input_tokens, r->sequences.size(), popts.seq_len, to_string(popts.packer),
      r->overlong_samples, to_string(popts.overlong), r->dropped_tokens);
  return kExitOk;
}

const bool registered = register_command(10, [](CLI::App& app) {
  std::vector<Handler> handlers;
  CLI::App* group = command_group(app, "corpus", "Corpora of sample lengths");
  auto stats = std::make_shared<StatsOptions>();
  CLI::App* st = group->add_subcommand("stats", "Length and workload statistics of a corpus");
  st->add_option("source", stats->source, "File (text, JSON Lines, Megatron .idx) or builtin:NAME[:SEED]")->required();
  st->add_flag("--json", stats->json, "Print JSON instead of a table");
  st->add_option("--seq-len", stats->seq_len,
                 "Also show raw input packed sequentially at this length (default: the builtin's); "
                 "for packed input, check every sequence fits");
  handlers.push_back({st, [stats] { return run_stats(*stats); }});

  auto po = std::make_shared<PackCliOptions>();
  CLI::App* pk = app.add_subcommand("pack", "Pack raw sample lengths into packed sequences (JSON Lines)");
  pk->add_option("source", po->source, "File (text or Megatron .idx) or builtin:NAME[:SEED]")->required();
  pk->add_option("--seq-len", po->seq_len, "Packed length L (default: the builtin's)");
  pk->add_option("-o,--output", po->output, "Output JSON Lines file ('-' for standard output)")->required();
  pk->add_option("--overlong", po->overlong, "Samples longer than L: split (default), truncate or drop");
  pk->add_option("--packer", po->packer, "sequential (default, loader order) or bfd (best-fit decreasing)");
  handlers.push_back({pk, [po] { return run_pack(*po); }});
  return handlers;
});

}  // namespace
}  // namespace libra::cli
