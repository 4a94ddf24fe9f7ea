// The test-only fault hook (target libra_fault, linked only into the
// libra_faulty test binary): LIBRA_FAULT=ACTION:POINT:RANK makes world rank
// RANK, the first time it reaches POINT, fail (an error), stop (send
// nothing more: SIGSTOP under mpirun, a blocked thread in-process) or fail
// an allocation. ACTION is fail, stop or alloc; POINT before-post, mid-pass,
// kernel or output (core/fault.hpp).
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/fault.hpp"

namespace {

using libra::detail::FaultAction;
using libra::detail::FaultPoint;

FaultAction g_action = FaultAction::kNone;
FaultPoint g_point = FaultPoint::kBeforePost;
int g_rank = -1;
std::atomic<bool> g_fired{false};

FaultAction hook(FaultPoint p, int rank) {
  if (p != g_point || rank != g_rank || g_fired.exchange(true)) return FaultAction::kNone;
  if (g_action != FaultAction::kStop) return g_action;
  if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr) {
    ::raise(SIGSTOP);  // as `kill -STOP` would: the process sends nothing more
    // mpirun continues a stopped process before killing it: it stays
    // silent until then rather than reporting a failure of its own.
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  // In-process the rank is a thread: it stops until another rank has
  // failed (timed out on it), then fails too so the process can end.
  while (!libra::detail::fault_release().load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return FaultAction::kFail;
}

bool parse(const std::string& spec) {
  const auto a = spec.find(':'), b = spec.rfind(':');
  if (a == std::string::npos || a == b) return false;
  const std::string action = spec.substr(0, a), point = spec.substr(a + 1, b - a - 1);
  if (action == "fail") g_action = FaultAction::kFail;
  else if (action == "stop") g_action = FaultAction::kStop;
  else if (action == "alloc") g_action = FaultAction::kAlloc;
  else return false;
  bool found = false;
  for (FaultPoint p : {FaultPoint::kBeforePost, FaultPoint::kMidPass, FaultPoint::kKernel, FaultPoint::kOutput}) {
    if (point == libra::detail::fault_point_name(p)) {
      g_point = p;
      found = true;
    }
  }
  g_rank = std::atoi(spec.c_str() + b + 1);
  return found;
}

const bool installed = [] {
  const char* spec = std::getenv("LIBRA_FAULT");
  if (spec == nullptr) return false;
  if (!parse(spec)) {
    std::fprintf(stderr, "LIBRA_FAULT=%s: expected ACTION:POINT:RANK\n", spec);
    std::exit(99);
  }
  libra::detail::set_fault_hook(hook);
  return true;
}();

}  // namespace
