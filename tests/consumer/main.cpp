#include <iostream>
#include <vector>

#include "libra/libra.hpp"

int main() {
  std::vector<std::int64_t> seq = {3, 4};
  auto f = libra::workload_proxy(seq);
  if (!f.ok() || *f != 25) {
    std::cerr << "consumer: unexpected workload\n";
    return 1;
  }
  std::cout << "consumer: libra::libra linked, F = " << *f << '\n';
  return 0;
}
