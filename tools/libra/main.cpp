// libra: command-line front end. Thin by design: parse flags, call the
// library, print. See `libra --help`.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <utility>

#include "commands.hpp"

namespace libra::cli {

namespace {
struct Registration {
  int order;
  std::function<std::vector<Handler>(CLI::App&)> setup;
};
std::vector<Registration>& registry() {
  static std::vector<Registration> r;
  return r;
}
}  // namespace

bool register_command(int order, std::function<std::vector<Handler>(CLI::App&)> setup) {
  registry().push_back({order, std::move(setup)});
  return true;
}

int fail(const Error& error) {
  std::cerr << "libra: error: " << error.message() << '\n';
  return error.code() == ErrorCode::kInternal ? kExitFailure : kExitUsage;
}

int fail(const Status& status) { return status.ok() ? kExitOk : fail(status.error()); }

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace libra::cli

int main(int argc, char** argv) {
  using namespace libra::cli;
  CLI::App app{"libra: attention-workload balancing for long-context LLM training", "libra"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("libra 0.1.0"));
  std::stable_sort(registry().begin(), registry().end(),
                   [](const Registration& a, const Registration& b) { return a.order < b.order; });
  std::vector<Handler> handlers;
  for (auto& r : registry()) {
    auto h = r.setup(app);
    handlers.insert(handlers.end(), h.begin(), h.end());
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, naming the flag and the rule, exit status 2 like every bad input.
    std::cerr << "libra: error: " << e.what() << '\n';
    return kExitUsage;
  }
  for (auto& h : handlers) {
    if (h.command->parsed()) {
      try {
        return h.run();
      } catch (const std::bad_alloc&) {
        std::cerr << "libra: error: out of memory\n";
        return kExitFailure;
      }
    }
  }
  std::cerr << "libra: error: no command given; see libra --help\n";
  return kExitUsage;
}
