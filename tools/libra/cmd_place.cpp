// `libra place`: sequence placement (VRSP and its baselines) over the
// optimizer-step windows of a packed corpus.
#include <fmt/format.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "libra/corpus.hpp"
#include "libra/io.hpp"
#include "libra/placement.hpp"
#include "libra/sampler.hpp"

namespace libra::cli {
namespace {

struct PlaceOptions {
  std::string source;
  std::int64_t pool_size = 0;
  std::int64_t gbs = 0;
  std::optional<std::int64_t> dp;  // default: the pool size
  std::string mode = "vrsp";
  std::uint64_t seed = 0;
  std::optional<std::int64_t> seq_len;
  bool json = false;
  bool summary = false;
  std::string output = "-";
  ElasticOptions elastic;  // --mode vrsp-elastic
  std::string elastic_rule = "buddy";
  const CLI::Option* mode_flag = nullptr;  // given explicitly?
  std::vector<const CLI::Option*> elastic_flags;  // meaningful with --mode vrsp-elastic only
};

// Population coefficient of variation of the workloads of the full windows.
double workload_cv(std::span<const std::int64_t> w) {
  if (w.empty()) return 0.0;
  double mean = 0;
  for (std::int64_t x : w) mean += static_cast<double>(x);
  mean /= static_cast<double>(w.size());
  if (mean <= 0) return 0.0;
  double var = 0;
  for (std::int64_t x : w) var += (static_cast<double>(x) - mean) * (static_cast<double>(x) - mean);
  var /= static_cast<double>(w.size());
  return std::sqrt(var) / mean;
}

struct ModeStats {
  PlacementMode mode{};
  double mean_imbalance = 0;
  double max_imbalance = 0;
  double mean_gap = 0;
  std::int64_t at_bound = 0;  // windows whose R - 1 equals the lower bound
};

// Placement of every window under one mode: mean and max R - 1, mean gap to
// the window's lower bound.
Result<ModeStats> run_mode(const PlacementSampler& base, PlacementMode mode, const SamplerOptions& so,
                           const std::vector<double>& lower_bounds) {
  SamplerOptions o = so;
  o.placement.mode = mode;
  LIBRA_ASSIGN_OR_RETURN(PlacementSampler s, PlacementSampler::from_workloads(base.workloads(), o));
  ModeStats st;
  st.mode = mode;
  for (std::int64_t step = 0; step < s.num_steps(); ++step) {
    LIBRA_ASSIGN_OR_RETURN(SamplerStep w, s.at(step));
    st.mean_imbalance += w.placement.imbalance;
    st.max_imbalance = std::max(st.max_imbalance, w.placement.imbalance);
    const double lb = lower_bounds[static_cast<std::size_t>(step)];
    st.mean_gap += w.placement.imbalance - lb;
    if (w.placement.imbalance <= lb) ++st.at_bound;
  }
  st.mean_imbalance /= static_cast<double>(s.num_steps());
  st.mean_gap /= static_cast<double>(s.num_steps());
  return st;
}

int run_place(const PlaceOptions& opt) {
  PlacementMode mode = PlacementMode::kVrsp;
  for (const CLI::Option* f : opt.elastic_flags) {
    if (f->count() > 0 && opt.mode != "vrsp-elastic") {
      return fail(invalid_input(f->get_name() + ": only with --mode vrsp-elastic (the mode is " + opt.mode + ")"));
    }
  }
  if (opt.summary && opt.mode_flag != nullptr && opt.mode_flag->count() > 0) {
    return fail(invalid_input("--mode " + opt.mode + ": --summary runs every mode; drop one of the two"));
  }
  if (!opt.summary) {
    auto m = parse_placement_mode(opt.mode);
    if (!m.ok()) return fail(invalid_input("--mode " + opt.mode + ": unknown placement mode; expected one of vrsp, "
                                           "sampler, random, zigzag, zigzag-swap, vrsp-refine, vrsp-elastic"));
    mode = *m;
  }
  ElasticOptions elastic = opt.elastic;
  {
    auto r = parse_elastic_rule(opt.elastic_rule);
    if (!r.ok()) return fail(invalid_input("--elastic-rule " + opt.elastic_rule + ": expected buddy or lightest"));
    elastic.rule = *r;
  }
  if (elastic.max_pools < 1) {
    return fail(invalid_input("--elastic-k " + std::to_string(elastic.max_pools) + ": must be at least 1"));
  }
  if (!(elastic.threshold >= 0) || !std::isfinite(elastic.threshold)) {
    return fail(invalid_input("--elastic-threshold " + fmt::format("{}", elastic.threshold) +
                              ": must be a finite number >= 0"));
  }
  if (opt.pool_size < 1) return fail(invalid_input("--pool-size " + std::to_string(opt.pool_size) + ": must be at least 1"));
  if (opt.gbs < 1) return fail(invalid_input("--gbs " + std::to_string(opt.gbs) + ": must be at least 1"));
  if (opt.dp && *opt.dp < 1) return fail(invalid_input("--dp " + std::to_string(*opt.dp) + ": must be at least 1"));
  if (opt.seq_len && *opt.seq_len < 1) {
    return fail(invalid_input("--seq-len " + std::to_string(*opt.seq_len) + ": must be at least 1"));
  }
  const std::uint64_t seed = opt.seed;
  auto sequences = load_packed_sequences(opt.source, opt.seq_len);
  if (!sequences.ok()) return fail(sequences.error());
  const auto n = static_cast<std::int64_t>(sequences->size());
  if (n < opt.gbs) {
    return fail(invalid_input(opt.source + ": " + std::to_string(n) + " packed sequences, fewer than --gbs " +
                              std::to_string(opt.gbs) + " (one optimizer step)"));
  }
  const SamplerOptions so{.gbs = opt.gbs, .dp = opt.dp.value_or(opt.pool_size), .placement = {.pool_size = opt.pool_size, .mode = mode, .seed = seed, .elastic = elastic}};
  auto sampler = PlacementSampler::create(std::move(*sequences), so);
  if (!sampler.ok()) return fail(sampler.error());
  const std::int64_t windows = sampler->num_steps();
  const std::int64_t tail = sampler->dropped_tail();
  if (tail > 0) {
    note(fmt::format("skipped the last {} packed sequence{} of {} (a partial window, fewer than --gbs {})", tail,
                     tail == 1 ? "" : "s", opt.source, opt.gbs));
  }
  const std::int64_t dp = sampler->options().dp;
  const std::int64_t k = opt.gbs / opt.pool_size;

  std::vector<double> lower_bounds;  // per window, as R - 1
  for (std::int64_t step = 0; step < windows; ++step) {
    const std::span<const std::int64_t> w(sampler->workloads().data() + step * opt.gbs,
                                          static_cast<std::size_t>(opt.gbs));
    lower_bounds.push_back(lower_bound_imbalance(w, opt.pool_size));
  }
  double mean_lb = 0;
  for (double lb : lower_bounds) mean_lb += lb;
  mean_lb /= static_cast<double>(windows);
  const double cv = workload_cv(std::span<const std::int64_t>(sampler->workloads()).first(
      static_cast<std::size_t>(windows * opt.gbs)));
  const double lln = lln_prediction(cv, opt.pool_size, k) - 1.0;

  std::string out;
  if (opt.summary) {
    std::vector<ModeStats> rows;
    for (PlacementMode m : all_placement_modes()) {
      auto st = run_mode(*sampler, m, so, lower_bounds);
      if (!st.ok()) return fail(st.error());
      rows.push_back(*st);
    }
    if (opt.json) {
      nlohmann::json j = {{"source", opt.source}, {"pool_size", opt.pool_size}, {"gbs", opt.gbs},
                          {"dp", dp},           {"seed", seed},           {"windows", windows},
                          {"skipped_tail", tail}, {"workload_cv", cv},        {"lln_prediction", lln},
                          {"mean_lower_bound", mean_lb}};
      nlohmann::json modes = nlohmann::json::array();
      for (const auto& r : rows) {
        modes.push_back({{"mode", std::string(placement_mode_name(r.mode))},
                         {"mean_imbalance", r.mean_imbalance},
                         {"max_imbalance", r.max_imbalance},
                         {"mean_gap", r.mean_gap},
                         {"windows_at_bound", r.at_bound}});
      }
      j["modes"] = modes;
      out = j.dump() + "\n";
    } else {
      out += fmt::format("# source {}  gbs {}  pool-size {}  pools {}  windows {}  skipped {}  CV(F) {:.4f}\n",
                         opt.source, opt.gbs, opt.pool_size, k, windows, tail, cv);
      out += fmt::format("{:<12} {:>12} {:>12} {:>12} {:>12} {:>9}\n", "mode", "mean_R-1", "max_R-1", "mean_bound",
                         "mean_gap", "at_bound");
      for (const auto& r : rows) {
        out += fmt::format("{:<12} {:>12.6f} {:>12.6f} {:>12.6f} {:>12.6f} {:>9}\n", placement_mode_name(r.mode),
                           r.mean_imbalance, r.max_imbalance, mean_lb, r.mean_gap, r.at_bound);
      }
      out += fmt::format("{:<12} {:>12.6f}   (paper eq. 4, R-1 of random grouping)\n", "lln", lln);
    }
  } else {
    nlohmann::json jw = nlohmann::json::array();
    std::string table = fmt::format("{:>6} {:>8} {:>12} {:>12} {:>12} {:>20} {:>20}\n", "window", "first",
                                    "R-1", "bound_R-1", "gap", "max_load", "mean_load");
    double mean_imb = 0;
    std::int64_t fused_windows = 0;  // windows with a domain of more than one pool
    for (std::int64_t step = 0; step < windows; ++step) {
      auto st = sampler->at(step);
      if (!st.ok()) return fail(st.error());
      const auto& pl = st->placement;
      const double lb = lower_bounds[static_cast<std::size_t>(step)];
      mean_imb += pl.imbalance;
      if (pl.domains.size() < pl.pools.size()) ++fused_windows;
      std::int64_t max_load = 0, sum = 0;
      for (std::int64_t l : pl.loads) {
        max_load = std::max(max_load, l);
        sum += l;
      }
      if (opt.json) {
        jw.push_back({{"window", step},
                      {"first_sequence", step * opt.gbs},
                      {"pools", pl.pools},
                      {"loads", pl.loads},
                      {"imbalance", pl.imbalance},
                      {"lower_bound", lb},
                      {"gap", pl.imbalance - lb},
                      {"layout",
                       {{"ga_steps", st->layout.ga_steps},
                        {"pool_ga", st->layout.pool_ga},
                        {"pool_first_replica", st->layout.pool_first_replica},
                        {"order", st->order}}}});
        // Elastic pools: the TAP domains and R - 1 over pools beside the
        // imbalance over domains (other modes keep their output unchanged).
        if (mode == PlacementMode::kVrspElastic) {
          jw.back()["domains"] = pl.domains;
          jw.back()["pool_imbalance"] = pl.pool_imbalance;
        }
      } else {
        table += fmt::format("{:>6} {:>8} {:>12.6f} {:>12.6f} {:>12.6f} {:>20} {:>20.1f}\n", step, step * opt.gbs,
                             pl.imbalance, lb, pl.imbalance - lb, max_load,
                             static_cast<double>(sum) / static_cast<double>(k));
      }
    }
    mean_imb /= static_cast<double>(windows);
    if (opt.json) {
      nlohmann::json j = {{"source", opt.source},       {"mode", std::string(placement_mode_name(mode))},
                          {"pool_size", opt.pool_size}, {"gbs", opt.gbs},
                          {"dp", dp},                   {"seed", seed},
                          {"sequences", n},             {"skipped_tail", tail},
                          {"mean_imbalance", mean_imb}, {"mean_lower_bound", mean_lb},
                          {"workload_cv", cv},          {"lln_prediction", lln}};
      if (mode == PlacementMode::kVrspElastic) j["fused_windows"] = fused_windows;
      // One window per line: readable, diffable, and still one JSON document.
      out = j.dump();
      out.pop_back();
      out += ",\"windows\":[\n";
      for (std::size_t i = 0; i < jw.size(); ++i) out += jw[i].dump() + (i + 1 < jw.size() ? ",\n" : "\n");
      out += "]}\n";
    } else {
      out = fmt::format("# source {}  mode {}  gbs {}  pool-size {}  dp {}  pools {}  windows {}  skipped {}\n",
                        opt.source, placement_mode_name(mode), opt.gbs, opt.pool_size, dp, k, windows, tail);
      out += table;
      out += fmt::format("# mean R-1 {:.6f}  mean bound {:.6f}  mean gap {:.6f}  CV(F) {:.4f}  LLN R-1 {:.6f}\n",
                         mean_imb, mean_lb, mean_imb - mean_lb, cv, lln);
      if (mode == PlacementMode::kVrspElastic) {
        out += fmt::format("# elastic ({}, k {}, threshold {}): {} of {} windows fuse pools; R-1 is over domains\n",
                           elastic_rule_name(elastic.rule), elastic.max_pools, elastic.threshold, fused_windows,
                           windows);
      }
    }
  }
  return fail(write_file_atomic(opt.output, out));
}

const bool registered = register_command(30, [](CLI::App& app) {
  auto opts = std::make_shared<PlaceOptions>();
  CLI::App* sub = app.add_subcommand(
      "place",
      "Place each window of GBS packed sequences into GBS/P pools of P (VRSP or a baseline); "
      "a trailing partial window is skipped with a note on stderr");
  sub->add_option("source", opts->source, "Packed sequences: JSONL file, or a raw corpus / builtin:NAME packed at --seq-len")
      ->required();
  sub->add_option("--pool-size,-P", opts->pool_size, "Sequences per pool (P); must divide --gbs and --dp")->required();
  sub->add_option("--gbs,-D", opts->gbs, "Packed sequences per optimizer step (window)")->required();
  sub->add_option("--dp", opts->dp, "DP replicas for the layout (default: the pool size)");
  opts->mode_flag = sub->add_option(
      "--mode", opts->mode, "vrsp, sampler, random, zigzag, zigzag-swap, vrsp-refine or vrsp-elastic; not with --summary");
  sub->add_option("--seed", opts->seed, "Base seed of the random mode (window w uses step_seed(seed, w))");
  sub->add_option("--seq-len", opts->seq_len, "Packed length for raw sources (default: the corpus' own)");
  sub->add_flag("--json", opts->json, "JSON output");
  sub->add_flag("--summary", opts->summary, "One row per mode (every mode): mean and max R-1, bound, gap, LLN");
  sub->add_option("--output,-o", opts->output, "Output file (default: standard output)");
  opts->elastic_flags.push_back(sub->add_option("--elastic-k", opts->elastic.max_pools, "vrsp-elastic: at most this many pools per fused domain")
      ->capture_default_str());
  opts->elastic_flags.push_back(sub->add_option("--elastic-threshold", opts->elastic.threshold,
                  "vrsp-elastic: fuse only pools whose load exceeds the mean pool load by more than this")
      ->capture_default_str());
  opts->elastic_flags.push_back(sub->add_option("--elastic-rule", opts->elastic_rule, "vrsp-elastic: buddy (static groups) or lightest")
      ->capture_default_str());
  return std::vector<Handler>{{sub, [opts] { return run_place(*opts); }}};
});

}  // namespace
}  // namespace libra::cli
