// The registries: the attention backends that can be made by name and the
// worlds a launcher starts (libra/backend.hpp, libra/comm.hpp). A new
// backend or transport is its own files (listed in src/exec/CMakeLists.txt)
// and one line here; the engine, the harness and the CLI read these lists.
#include <fmt/format.h>

#include <string>

#include "libra/backend.hpp"
#include "libra/comm.hpp"

namespace libra {
namespace {

const BackendEntry kBackends[] = {
    {"cpu", "libra's CPU kernel (Highway SIMD)", &make_cpu_backend},
};

const LaunchedWorld kWorlds[] = {
    {"mpi", "mpirun", "mpirun -np N", &mpi_launched, &mpi_launcher_rank, &mpi_init, &mpi_world, &mpi_finalize},
};

}  // namespace

std::span<const BackendEntry> attention_backends() { return kBackends; }

Result<std::unique_ptr<AttentionBackend>> make_backend(std::string_view name) {
  std::string names;
  for (const BackendEntry& b : kBackends) {
    if (name == b.name) return b.make();
    names += (names.empty() ? "" : ", ") + std::string(b.name);
  }
  return invalid_input(fmt::format("backend {}: not one of the registered backends ({})", name, names));
}

std::span<const LaunchedWorld> launched_worlds() { return kWorlds; }

const LaunchedWorld* launched_world() {
  for (const LaunchedWorld& w : kWorlds) {
    if (w.launched()) return &w;
  }
  return nullptr;
}

}  // namespace libra
