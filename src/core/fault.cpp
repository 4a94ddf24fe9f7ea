#include "core/fault.hpp"

#include <new>
#include <string>

namespace libra::detail {

namespace {
std::atomic<FaultHook> g_hook{nullptr};
thread_local int t_rank = 0;

// What an allocation that fails at a named point throws: a std::bad_alloc
// whose text says where.
class InjectedBadAlloc : public std::bad_alloc {
 public:
  explicit InjectedBadAlloc(FaultPoint p) : what_(std::string("allocation failed at ") + fault_point_name(p) + " (fault injected)") {}
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};
}  // namespace

const char* fault_point_name(FaultPoint p) {
  switch (p) {
    case FaultPoint::kBeforePost: return "before-post";
    case FaultPoint::kMidPass: return "mid-pass";
    case FaultPoint::kKernel: return "kernel";
    case FaultPoint::kOutput: return "output";
  }
  return "?";
}

void set_fault_hook(FaultHook hook) { g_hook.store(hook); }
void set_fault_rank(int rank) { t_rank = rank; }
int fault_rank() { return t_rank; }

std::atomic<bool>& fault_release() {
  static std::atomic<bool> released{false};
  return released;
}

FaultAction fault_action(FaultPoint p) {
  FaultHook hook = g_hook.load(std::memory_order_relaxed);
  return hook == nullptr ? FaultAction::kNone : hook(p, t_rank);
}

Status fault_outcome(FaultAction a, FaultPoint p) {
  switch (a) {
    case FaultAction::kNone:
      return Status();
    case FaultAction::kStop:  // a hook that stops the caller answers kFail once released; this one did not stop
    case FaultAction::kFail:
      return internal_error("rank " + std::to_string(t_rank) + ": fault injected at " + fault_point_name(p));
    case FaultAction::kAlloc:
      throw InjectedBadAlloc(p);
  }
  return Status();
}

}  // namespace libra::detail
