// The libra CLI's command registry. Each cmd_*.cpp file registers the
// subcommands it owns at static-initialisation time:
//
//   static const bool registered = libra::cli::register_command(10, [](CLI::App& app) {
//     auto* sub = app.add_subcommand("pack", "Pack raw sample lengths");
//     auto opts = std::make_shared<PackOptions>();
//     sub->add_option("source", opts->source)->required();
//     return libra::cli::Handler{sub, [opts] { return run_pack(*opts); }};
//   });
//
// A handler returns the process exit status. Library errors become one line
// on stderr and exit status 2 through libra::cli::fail.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "libra/status.hpp"

namespace libra::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitUsage = 2;  // bad input, bad flags, impossible configuration
inline constexpr int kExitFailure = 1;  // internal error (a bug, out of memory)
inline constexpr int kExitCheckFailed = 3;  // a check ran and failed (exec --check beyond tolerance)

struct Handler {
  CLI::App* command;            // the leaf subcommand that runs this handler
  std::function<int()> run;
};

// `order` sorts commands in --help; lower comes first.
bool register_command(int order, std::function<std::vector<Handler>(CLI::App&)> setup);

// Exit statuses (documented in README.md "Exit status"): 0 success, 2 bad
// input (one line on stderr), 3 a --check that ran and found the result
// beyond tolerance, 1 an internal error.
//
// Prints "libra: error: <message>" to stderr (control bytes escaped, so the
// message is one line whatever a file name holds) and returns kExitUsage
// (or kExitFailure for internal errors).
int fail(const Error& error);
int fail(const Status& status);

// Prints "libra: note: <message>" to stderr, escaped like fail().
void note(std::string_view message);

// `text` with every control byte (below 0x20, and 0x7f) written as \xNN:
// file names with a newline or an escape byte stay one inert line.
std::string printable(std::string_view text);

// The parent command `name` (e.g. "corpus", "bench"), created on first use so
// several files can hang leaf commands under it.
inline CLI::App* command_group(CLI::App& app, const std::string& name, const std::string& description) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  CLI::App* group = app.add_subcommand(name, description);
  group->require_subcommand(1);
  return group;
}

// The arguments this process was started with (after the program name),
// for comparing across the ranks of one job.
const std::vector<std::string>& command_line();

// Reports a flag error of a process a registered launcher started (mpirun;
// LaunchedWorld in libra/comm.hpp): agreed with the other processes (which
// meet it in their first collective), so the job prints one line. Returns the
// exit status.
int fail_under_launcher(const Status& error);
bool under_launcher();

// True when stderr is a terminal (progress bars only then).
bool stderr_is_terminal();

}  // namespace libra::cli
