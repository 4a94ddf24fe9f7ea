// `libra simulate --elastic`: elastic pools (vrsp-elastic) against plain
// VRSP on every window of a corpus, for one (P, H, B). cmd_simulate.cpp
// parses the flags and hands over here.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "commands.hpp"
#include "libra/elastic_sim.hpp"
#include "libra/io.hpp"

namespace libra::cli {

int run_simulate_elastic(SimConfig cfg, bool pool_given, bool shards_given, bool blocks_given, bool chunks_given,
                         ElasticOptions elastic, const std::string& rule, bool priced, const std::string& plan_mode,
                         bool json, const std::string& output) {
  // One candidate: the paper's choice unless given (a list is an error here).
  const std::pair<const char*, std::vector<std::int64_t>*> lists[] = {
      {"--pool-size", &cfg.pool_sizes}, {"--head-shards", &cfg.head_shards}, {"--block-size", &cfg.block_sizes}};
  const bool given[] = {pool_given, shards_given, blocks_given};
  const std::int64_t defaults[] = {8, 8, 16384};
  std::int64_t value[3];
  for (int i = 0; i < 3; ++i) {
    if (given[i] && lists[i].second->size() != 1) {
      return fail(invalid_input(fmt::format("{}: --elastic takes one value, not a list", lists[i].first)));
    }
    value[i] = given[i] ? lists[i].second->front() : defaults[i];
  }
  // M likewise: one value; a list from a config file gives way to the paper's M = 4.
  if (chunks_given && cfg.chunks.size() != 1) {
    return fail(invalid_input("--chunks: --elastic takes one value, not a list"));
  }
  if (cfg.chunks.size() != 1) cfg.chunks = {4};
  auto r = parse_elastic_rule(rule);
  if (!r.ok()) return fail(invalid_input("--elastic-rule " + rule + ": expected buddy or lightest"));
  elastic.rule = *r;
  if (elastic.max_pools < 1) {
    return fail(invalid_input(fmt::format("--elastic-k {}: must be at least 1", elastic.max_pools)));
  }
  if (!(elastic.threshold >= 0) || !std::isfinite(elastic.threshold)) {
    return fail(invalid_input(fmt::format("--elastic-threshold {}: must be a finite number >= 0", elastic.threshold)));
  }
  auto mode = parse_plan_mode(plan_mode);
  if (!mode.ok() || (*mode != PlanMode::kTap && *mode != PlanMode::kTapTopo)) {
    return fail(invalid_input("--elastic-plan-mode " + plan_mode + ": expected tap or tap-topo"));
  }
  auto res = simulate_elastic(cfg, {value[0], value[1], value[2]}, elastic, priced, *mode);
  if (!res.ok()) return fail(res.error());
  Status s = write_file_atomic(output, json ? elastic_json(*res) : elastic_table(*res));
  if (!s.ok()) return fail(s);
  return kExitOk;
}

}  // namespace libra::cli
