// The job of `libra exec` on every rank (exec_job.hpp).
#include "exec_job.hpp"

#include <string>

namespace libra::cli {

// The rank a timeout error names as silent ("(rank N stopped or is too
// slow)", as both communicators say it); -1 for other errors.
int silent_rank(const Error& e) {
  const std::string& m = e.message();
  const auto end = m.rfind(" stopped or is too slow)");
  const auto at = m.rfind("(rank ", end);
  if (end == std::string::npos || at == std::string::npos) return -1;
  return std::atoi(m.c_str() + at + 6);
}

// Failure of one rank after the collective part started: other ranks may
// be waiting on it, so the whole job ends. When a peer went silent, every
// other rank times out at about the same moment: the lowest of them alone
// reports it, and the rest give it a few seconds to end the job before
// reporting it themselves, so the job prints one line.
namespace {
bool g_in_process = false;  // --ranks: the ranks are threads of this process
}  // namespace

bool in_process_ranks() { return g_in_process; }
void set_in_process_ranks() { g_in_process = true; }

[[noreturn]] void abort_job(Communicator& world, const Error& e) {
  const int silent = silent_rank(e);
  if (silent >= 0 && !in_process_ranks() && world.rank() != (silent == 0 ? 1 : 0)) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  world.abort(printable(e.message()));
  std::abort();  // not reached: abort ends the job
}

// The exit status of a status every rank holds alike (agreed): world rank 0
// alone prints it, so the job prints one line however many ranks failed.
int finish_agreed(Communicator& world, const Status& agreed) {
  if (agreed.ok()) return kExitOk;
  // The agreement itself timed out: a peer went silent, and rank 0 may be
  // the one, so this ends the job like any silent peer.
  if (silent_rank(agreed.error()) >= 0) abort_job(world, agreed.error());
  if (world.rank() == 0) return fail(agreed.error());
  return agreed.error().code() == ErrorCode::kInternal ? kExitFailure : kExitUsage;
}

// Every rank learns of a failure and of the same message (the lowest failed
// rank's, naming the ranks). kExitOk when no rank failed.
int fail_on_all_ranks(Communicator& world, const Status& local) {
  return finish_agreed(world, agree_on_status(world, local, "libra exec"));
}

}  // namespace libra::cli
