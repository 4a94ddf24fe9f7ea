// The job of `libra exec` on every rank (cmd_exec.cpp): how a failure
// ends it with one line, and the start-up watchdog of a launched process.
//
//   if (int rc = fail_on_all_ranks(world, status); rc != kExitOk) return rc;  // every rank alike
//   abort_job(world, error);                                                  // a rank's own failure
//   StartupWatchdog watchdog(timeout, launcher_rank);                         // until the world exists
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "commands.hpp"
#include "libra/comm.hpp"
#include "libra/io.hpp"
#include "libra/status.hpp"

namespace libra::cli {

// The rank a timeout error names as silent ("(rank N stopped or is too
// slow)", as both communicators say it); -1 for other errors.
int silent_rank(const Error& e);

// --ranks: the ranks are threads of this process (set once, before they start).
bool in_process_ranks();
void set_in_process_ranks();

// Failure of one rank after the collective part started: other ranks may
// be waiting on it, so the whole job ends, with one line (exec_job.cpp).
[[noreturn]] void abort_job(Communicator& world, const Error& e);

// The exit status of a status every rank holds alike (agreed): world rank 0
// alone prints it, so the job prints one line however many ranks failed.
int finish_agreed(Communicator& world, const Status& agreed);

// Every rank learns of a failure and of the same message (the lowest failed
// rank's, naming the ranks). kExitOk when no rank failed.
int fail_on_all_ranks(Communicator& world, const Status& local);

// OpenMPI's MPI_Init waits for every process of the job, so one that ended
// before it joined left the others blocked there forever (issue 35 F14).
// The start-up (joining the world and making its communicator) gets the same
// --timeout as every wait after it: a process still in it then prints one
// line naming itself and exits with status 1, and the launcher ends the job.
class StartupWatchdog {
 public:
  StartupWatchdog(double seconds, int rank)
      : thread_([this, seconds, rank] {
          std::unique_lock lock(mutex_);
          if (cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_; })) return;
          libra::write_stderr_line(fmt::format("libra: error: rank {}: the job did not start within {} s (--timeout): a "
                                        "process of it ended or never joined (MPI_Init)",
                                        rank, seconds));
          std::_Exit(kExitFailure);
        }) {}
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;
  ~StartupWatchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members it reads exist
};


}  // namespace libra::cli
