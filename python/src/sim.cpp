// python/src/sim.cpp: the simulator (libra/simulator.hpp).
#include "binding.hpp"

#include "libra/elastic_sim.hpp"
#include "libra/sampler.hpp"
#include "libra/simulator.hpp"

namespace libra_py {

namespace {

// The configuration of priced elastic fusing: the keys of `libra simulate --config`, with one
// head-shard count and block size (8 and 16384 unless given, as `simulate --elastic`) and the
// packed length required. gbs, dp and the pool size are the sampler's.
libra::SimConfig pricing_config(const std::string& config_json) {
  libra::SimConfig cfg;
  cfg.head_shards = {8};
  cfg.block_sizes = {16384};
  cfg.chunks = {4};
  check(libra::apply_sim_config_json(config_json, "elastic pricing", cfg));
  if (cfg.seq_len < 1) bad("elastic pricing: seq_len: required (the packed length L of the sequences)");
  if (cfg.head_shards.size() != 1) bad("elastic pricing: head_shards: one value, not a list");
  if (cfg.block_sizes.size() != 1) bad("elastic pricing: block_sizes: one value, not a list");
  if (cfg.chunks.size() != 1) bad("elastic pricing: chunks: one value, not a list");
  return cfg;
}

}  // namespace

void bind_sim(py::module_& m) {
  // ---- simulator: the config as JSON text (the keys of `libra simulate --config`), the result as
  // `libra simulate --json` prints it; the Python wrapper converts both.
  m.def(
      "simulate_json",
      [](const std::string& config_json) {
        libra::Result<std::string> r = [&]() -> libra::Result<std::string> {
          py::gil_scoped_release release;
          libra::SimConfig cfg;
          libra::Status s = libra::apply_sim_config_json(config_json, "simulate config", cfg);
          if (!s.ok()) return s.error();
          auto sim = libra::simulate(cfg);
          if (!sim.ok()) return sim.error();
          return libra::sim_json(*sim);
        }();
        return unwrap(std::move(r));
      },
      py::arg("config_json"));

  // A PlacementSampler in mode vrsp-elastic whose windows fuse only where libra::ElasticPricer
  // predicts the optimizer step faster: the simulator's per-window decision (libra simulate
  // --elastic), step s priced as window s.
  m.def(
      "priced_placement_sampler",
      [](const py::object& seqs, I64 gbs, I64 dp, I64 pool_size, std::uint64_t seed, I64 elastic_k,
         double elastic_threshold, const std::string& elastic_rule, const std::string& config_json,
         const std::string& plan_mode) {
        libra::SimConfig cfg = pricing_config(config_json);
        cfg.gbs = gbs;
        cfg.dp = dp;
        const libra::ElasticOptions e{.max_pools = elastic_k, .threshold = elastic_threshold,
                                      .rule = unwrap(libra::parse_elastic_rule(elastic_rule))};
        libra::ElasticPricer pricer = unwrap(libra::ElasticPricer::create(
            cfg, {pool_size, cfg.head_shards.front(), cfg.block_sizes.front()}, e, cfg.seq_len, /*priced=*/true,
            unwrap(libra::parse_plan_mode(plan_mode))));
        libra::SamplerOptions o{.gbs = gbs, .dp = dp,
                                .placement = {.pool_size = pool_size, .mode = libra::PlacementMode::kVrspElastic,
                                              .seed = seed, .dp = dp, .elastic = pricer.elastic()}};
        o.placer = libra::priced_elastic_placer(pricer);
        return unwrap(libra::PlacementSampler::create(to_sequences(seqs, "sequences"), o));
      },
      py::arg("sequences"), py::arg("gbs"), py::arg("dp"), py::arg("pool_size"), py::arg("seed") = 0,
      py::arg("elastic_k") = 2, py::arg("elastic_threshold") = 0.05, py::arg("elastic_rule") = "buddy",
      py::arg("config_json") = "{}", py::arg("plan_mode") = "tap");

  // (cp, gpus per node, nodes per supernode) of a pricing configuration: where the priced sampler's
  // buddy domains sit (libra::buddy_domain_starts), for libra.torch.domain_groups.
  m.def(
      "pricing_topology",
      [](const std::string& config_json) {
        const libra::SimConfig cfg = pricing_config(config_json);
        return py::make_tuple(cfg.cp, cfg.cost.net.gpus_per_node, cfg.cost.net.nodes_per_supernode);
      },
      py::arg("config_json"));
}

}  // namespace libra_py
