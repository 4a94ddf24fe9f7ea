// Fuzzes the JSON plan-file reader: never crashes, errors are one line, and
// an accepted plan saves and loads back to the same fingerprint, in both
// formats.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.hpp"
#include "libra/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = plan_from_json(text, "fuzz.json");
  if (!r.ok()) {
    fuzz::require_one_line(r.error());
    return 0;
  }
  // Every config field (the topology too) comes back: the same JSON text.
  const std::string saved = plan_to_json(*r);
  auto json = plan_from_json(saved, "again.json");
  fuzz::require(json.ok() && json->fingerprint() == r->fingerprint() && plan_to_json(*json) == saved);
  auto bin = plan_from_binary(plan_to_binary(*r), "again.bin");
  fuzz::require(bin.ok() && bin->fingerprint() == r->fingerprint() && plan_to_json(*bin) == saved);
  fuzz::require(bin->config().topology == r->config().topology);
  return 0;
}
