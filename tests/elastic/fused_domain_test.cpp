// The fused-domain executor check (fused_domain_body.hpp) with the ranks as
// threads of this process.
#include <gtest/gtest.h>

#include "elastic/fused_domain_body.hpp"

namespace libra {
namespace {

TEST(FusedDomain, ForwardBackwardEqualPlainAttentionInProcess) {
  const auto statuses = run_in_process(elastic_test::kWorldSize, elastic_test::fused_domain_case);
  for (std::size_t r = 0; r < statuses.size(); ++r) EXPECT_TRUE(statuses[r].ok()) << r << ": " << statuses[r].message();
}

}  // namespace
}  // namespace libra
