// python/src/placement.cpp: window placement and the placement sampler
// (libra/placement.hpp, sampler.hpp).
#include "binding.hpp"

#include "libra/placement.hpp"
#include "libra/sampler.hpp"

namespace libra_py {

namespace {

libra::PlacementMode placement_mode(const std::string& mode) { return unwrap(libra::parse_placement_mode(mode)); }

py::dict window_dict(const libra::WindowPlacement& w) {
  py::dict o;
  py::list pools;
  for (const auto& p : w.pools) pools.append(py::cast(p));
  o["pools"] = pools;
  o["loads"] = int_array(w.loads);
  o["imbalance"] = w.imbalance;
  // vrsp-elastic: pool indices fused into one TAP domain (unfused pools are domains of one).
  py::list domains;
  for (const auto& d : w.domains) domains.append(py::cast(d));
  o["domains"] = domains;
  o["pool_imbalance"] = w.pool_imbalance;
  return o;
}

libra::PlacementOptions placement_options(I64 pool_size, const std::string& mode, std::uint64_t seed, I64 dp,
                                          I64 elastic_k, double elastic_threshold, const std::string& elastic_rule,
                                          I64 interleave_cp, I64 interleave_gpus_per_node) {
  libra::PlacementOptions o{.pool_size = pool_size, .mode = placement_mode(mode), .seed = seed, .dp = dp};
  o.interleave = {.cp = interleave_cp, .gpus_per_node = interleave_gpus_per_node};
  o.elastic = {.max_pools = elastic_k, .threshold = elastic_threshold,
               .rule = unwrap(libra::parse_elastic_rule(elastic_rule))};
  return o;
}

}  // namespace

void bind_placement(py::module_& m) {
  // ---- placement
  m.def(
      "sequence_workloads",
      [](const py::object& seqs) {
        return int_array(unwrap(libra::sequence_workloads(to_sequences(seqs, "sequences"))));
      },
      py::arg("sequences"));
  m.def(
      "place_window",
      [](const py::object& seqs, I64 pool_size, const std::string& mode, std::uint64_t seed, I64 dp, I64 elastic_k,
         double elastic_threshold, const std::string& elastic_rule, I64 interleave_cp, I64 interleave_gpus_per_node) {
        std::vector<I64> f = unwrap(libra::sequence_workloads(to_sequences(seqs, "sequences")));
        libra::PlacementOptions o = placement_options(pool_size, mode, seed, dp, elastic_k, elastic_threshold,
                                                      elastic_rule, interleave_cp, interleave_gpus_per_node);
        libra::WindowPlacement w = unwrap(libra::place_window(f, o));
        py::dict d = window_dict(w);
        d["workloads"] = int_array(f);
        d["lower_bound"] = libra::lower_bound_imbalance(f, pool_size);
        return d;
      },
      py::arg("sequences"), py::arg("pool_size"), py::arg("mode") = "vrsp", py::arg("seed") = 0,
      py::arg("dp") = 0, py::arg("elastic_k") = 2, py::arg("elastic_threshold") = 0.05,
      py::arg("elastic_rule") = "buddy", py::arg("interleave_cp") = 0, py::arg("interleave_gpus_per_node") = 0);

  m.def(
      "buddy_domain_starts",
      [](I64 pools_per_ga, I64 pool_size, I64 k, I64 cp, I64 gpus_per_node, I64 nodes_per_supernode) {
        return libra::buddy_domain_starts(pools_per_ga, pool_size, k,
                                          {.cp = cp, .gpus_per_node = gpus_per_node,
                                           .nodes_per_supernode = nodes_per_supernode});
      },
      py::arg("pools_per_ga"), py::arg("pool_size"), py::arg("k"), py::arg("cp") = 0, py::arg("gpus_per_node") = 0,
      py::arg("nodes_per_supernode") = 0);

  py::class_<libra::PlacementSampler>(m, "PlacementSampler")
      .def(py::init([](const py::object& seqs, I64 gbs, I64 dp, I64 pool_size, const std::string& mode,
                       std::uint64_t seed, I64 elastic_k, double elastic_threshold, const std::string& elastic_rule,
                       I64 interleave_cp, I64 interleave_gpus_per_node) {
             libra::SamplerOptions o{.gbs = gbs, .dp = dp,
                                     .placement = placement_options(pool_size, mode, seed, dp, elastic_k,
                                                                    elastic_threshold, elastic_rule, interleave_cp,
                                                                    interleave_gpus_per_node)};
             return unwrap(libra::PlacementSampler::create(to_sequences(seqs, "sequences"), o));
           }),
           py::arg("sequences"), py::arg("gbs"), py::arg("dp"), py::arg("pool_size"), py::arg("mode") = "vrsp",
           py::arg("seed") = 0, py::arg("elastic_k") = 2, py::arg("elastic_threshold") = 0.05,
           py::arg("elastic_rule") = "buddy", py::arg("interleave_cp") = 0, py::arg("interleave_gpus_per_node") = 0)
      .def_property_readonly("num_steps", &libra::PlacementSampler::num_steps)
      .def_property_readonly("dropped_tail", &libra::PlacementSampler::dropped_tail)
      .def_property_readonly("gbs", [](const libra::PlacementSampler& s) { return s.options().gbs; })
      .def_property_readonly("dp", [](const libra::PlacementSampler& s) { return s.options().dp; })
      .def_property_readonly("pool_size", [](const libra::PlacementSampler& s) { return s.options().placement.pool_size; })
      .def_property_readonly("num_sequences", [](const libra::PlacementSampler& s) { return s.sequences().size(); })
      .def_property_readonly("workloads", [](const libra::PlacementSampler& s) { return int_array(s.workloads()); })
      .def(
          "sequence",
          [](const libra::PlacementSampler& s, I64 i) {
            if (i < 0 || i >= static_cast<I64>(s.sequences().size())) {
              bad("sequence " + std::to_string(i) + ": must be in [0, " + std::to_string(s.sequences().size()) + ")");
            }
            return s.sequence(i);
          },
          py::arg("index"))
      .def(
          "at",
          [](const libra::PlacementSampler& s, I64 step) {
            // A priced sampler plans and prices the window here: other threads keep running.
            libra::Result<libra::SamplerStep> r = [&] {
              py::gil_scoped_release release;
              return s.at(step);
            }();
            libra::SamplerStep st = unwrap(std::move(r));
            py::dict d = window_dict(st.placement);
            d["step"] = st.step;
            d["order"] = int_array(st.order);
            d["ga_steps"] = st.layout.ga_steps;
            d["pools_per_ga"] = st.layout.pools_per_ga;
            d["pool_ga"] = int_array(st.layout.pool_ga);
            d["pool_first_replica"] = int_array(st.layout.pool_first_replica);
            return d;
          },
          py::arg("step"));
}

}  // namespace libra_py
