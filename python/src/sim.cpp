// python/src/sim.cpp: the simulator (libra/simulator.hpp).
#include "binding.hpp"

#include "libra/simulator.hpp"

namespace libra_py {

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
}

}  // namespace libra_py
