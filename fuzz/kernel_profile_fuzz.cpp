// Fuzzes the kernel-profile reader of the simulator's cost model: never
// crashes, errors are one line, an accepted profile round-trips through its
// writer and interpolates to finite, positive throughput everywhere.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.hpp"
#include "libra/cost_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = parse_kernel_profile(text, "fuzz.json");
  if (!r.ok()) {
    fuzz::require_one_line(r.error());
    return 0;
  }
  auto again = parse_kernel_profile(kernel_profile_json(*r), "again.json");
  fuzz::require(again.ok() && again->entries.size() == r->entries.size());
  for (double len : {1.0, 63.0, 4096.0, 3e6}) {
    for (double heads : {1.0, 3.0, 512.0}) {
      for (bool bwd : {false, true}) {
        const double g = profile_gflops(*r, len, heads, bwd);
        fuzz::require(std::isfinite(g) && g > 0);
      }
    }
  }
  return 0;
}
