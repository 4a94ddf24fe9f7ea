// Fuzzes the binary plan-file reader: never crashes, errors are one line, and
// an accepted plan saves and loads back to the same fingerprint and bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.hpp"
#include "libra/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto r = plan_from_binary(bytes, "fuzz.bin");
  if (!r.ok()) {
    fuzz::require_one_line(r.error());
    return 0;
  }
  const std::string saved = plan_to_binary(*r);
  auto again = plan_from_binary(saved, "again.bin");
  fuzz::require(again.ok() && again->fingerprint() == r->fingerprint() && plan_to_binary(*again) == saved);
  auto json = plan_from_json(plan_to_json(*r), "again.json");
  fuzz::require(json.ok() && json->fingerprint() == r->fingerprint() && plan_to_json(*json) == plan_to_json(*r));
  fuzz::require(json->config().topology == r->config().topology);
  return 0;
}
