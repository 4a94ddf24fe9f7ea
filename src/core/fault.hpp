// core/fault.hpp (internal, not installed): the named points where the
// test-only fault library (tests/fault, target libra_fault) makes one rank
// fail, stop or run out of memory. With no hook installed -- every
// production binary -- each point is one relaxed atomic load.
//
//   // in an executor, before the first exchange of a pass:
//   LIBRA_TRY(libra::detail::fault_point(libra::detail::FaultPoint::kBeforePost));
#pragma once

#include <atomic>

#include "libra/status.hpp"

namespace libra::detail {

enum class FaultPoint { kBeforePost, kMidPass, kKernel, kOutput };
enum class FaultAction { kNone, kFail, kStop, kAlloc };

const char* fault_point_name(FaultPoint p);

// Decides what happens at `p` on `rank`; installed by the test library only.
// A kStop hook stops the caller itself (SIGSTOP under MPI; in-process it
// blocks until fault_release() and then answers kFail).
using FaultHook = FaultAction (*)(FaultPoint p, int rank);
void set_fault_hook(FaultHook hook);

// The rank the calling thread works for (in-process ranks are threads).
void set_fault_rank(int rank);
int fault_rank();

// Set once any in-process rank failed, so a rank stopped by the hook wakes
// and the process can end.
std::atomic<bool>& fault_release();

// The hook's verdict at `p` for this thread's rank.
FaultAction fault_action(FaultPoint p);

// An action as the caller's outcome: kFail an internal error naming the
// point, kAlloc std::bad_alloc (as a failed allocation there would throw).
Status fault_outcome(FaultAction a, FaultPoint p);
inline Status fault_point(FaultPoint p) { return fault_outcome(fault_action(p), p); }

}  // namespace libra::detail
