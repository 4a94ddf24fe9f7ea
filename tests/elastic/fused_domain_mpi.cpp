// The fused-domain executor check (fused_domain_body.hpp) over MPI:
//   mpirun --oversubscribe -np 6 libra_fused_domain_mpi_test
// Prints "fused domain: ok" on rank 0; exits 1 on every rank when any failed.
#include <cstdio>

#include "elastic/fused_domain_body.hpp"

int main() {
  using namespace libra;
  if (Status s = mpi_init(); !s.ok()) {
    std::fprintf(stderr, "libra_fused_domain_mpi_test: %s\n", s.message().c_str());
    return 2;
  }
  auto world = mpi_world();
  if (!world.ok()) {
    std::fprintf(stderr, "libra_fused_domain_mpi_test: %s\n", world.error().message().c_str());
    return 2;
  }
  const Status local = elastic_test::fused_domain_case(**world);
  if (!local.ok()) std::fprintf(stderr, "FAIL rank %d: %s\n", (*world)->rank(), local.message().c_str());
  const Status all = agree_on_status(**world, local, "fused domain");
  if (all.ok() && (*world)->rank() == 0) std::printf("fused domain: ok\n");
  const int rc = all.ok() ? 0 : 1;
  world->reset();
  mpi_finalize();
  return rc;
}
