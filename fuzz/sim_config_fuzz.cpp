// Fuzzes the simulator's JSON config reader (`libra simulate --config`):
// never crashes, errors are one line.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_util.hpp"
#include "libra/simulator.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace libra;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  SimConfig config;
  Status s = apply_sim_config_json(text, "fuzz.json", config);
  if (!s.ok()) fuzz::require_one_line(s.error());
  return 0;
}
