// libra: command-line front end. Thin by design: parse flags, call the
// library, print. See `libra --help`.
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "core/decimal.hpp"
#include "libra/io.hpp"

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

// CLI11 reads integers with strtoll(..., 0): "064" is octal 52, "0x400" hex,
// "+1" accepted, and an overflowing value clamps. Every integer option goes
// through parse_decimal first instead; the canonical digits it leaves behind
// mean the same to strtoll.
template <class T>
CLI::Validator strict_integer() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const auto r = detail::parse_decimal<T>(text);
        if (r.error == detail::DecimalError::kSyntax) {
          return "'" + printable(text) + "' is not a decimal integer (digits only" +
                 (std::is_signed_v<T> ? ", an optional '-'" : "") + "; no '+' or 0x)";
        }
        if (r.error == detail::DecimalError::kRange) {
          return text + " is out of range (at most " + std::to_string(std::numeric_limits<T>::max()) + ")";
        }
        text = std::to_string(r.value);
        return {};
      },
      "");
}

// CLI11 reads a float with strtod-like rules: '' is 0 and "0x10" is 16.
// Every float option takes a decimal number instead (digits, an optional
// sign, point and exponent), finite.
CLI::Validator strict_float() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        const char* b = text.data();
        const char* e = b + text.size();
        const auto [end, ec] = std::from_chars(b, e, v, std::chars_format::general);
        const bool hex = text.find_first_of("xX") != std::string::npos;
        if (text.empty() || hex || ec != std::errc() || end != e) {
          return "'" + printable(text) + "' is not a decimal number";
        }
        if (!std::isfinite(v)) return "'" + printable(text) + "' is not a finite number";
        return {};
      },
      "");
}

// Options that name a file libra writes, by their long name in every command.
bool is_output_option(const CLI::Option* opt) {
  for (const char* name : {"output", "trace", "profile-out", "config-out"}) {
    if (opt->check_lname(name)) return true;
  }
  return false;
}

// Options and positionals that name a file libra reads.
bool is_input_option(const CLI::Option* opt) {
  if (opt->get_positional()) return true;
  for (const char* name : {"load", "config", "plan", "kernel-profile"}) {
    if (opt->check_lname(name)) return true;
  }
  return false;
}

// Options that name a directory libra writes into (created if missing).
bool is_output_dir_option(const CLI::Option* opt) { return opt->check_lname("report"); }

CLI::Validator writable_dir() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        const libra::Status s = libra::check_writable_dir(path);
        return s.ok() ? std::string() : s.error().message();
      },
      "");
}

// Every output path is checked while parsing, so a typo in a directory fails
// before minutes of work rather than after.
CLI::Validator writable_path() {
  return CLI::Validator(
      [](std::string& path) -> std::string {
        const libra::Status s = libra::check_writable(path);
        return s.ok() ? std::string() : s.error().message();
      },
      "");
}

// Closes the classes once for every command, present and future: strict
// integers, and output paths checked up front.
void harden_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type == "INT") opt->transform(strict_integer<std::int64_t>());
    if (type == "UINT") opt->transform(strict_integer<std::uint64_t>());
    if (type == "FLOAT") opt->transform(strict_float());
    if (is_output_option(opt)) opt->check(writable_path());
    if (is_output_dir_option(opt)) opt->check(writable_dir());
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) harden_options(*sub);
}

// Refuses an output that is one of the command's inputs (`pack x -o x`
// would replace its own input).
libra::Status check_outputs_are_not_inputs(CLI::App& leaf) {
  for (const CLI::Option* out : leaf.get_options()) {
    if (!is_output_option(out) || out->count() == 0) continue;
    for (const CLI::Option* in : leaf.get_options()) {
      if (!is_input_option(in) || in->count() == 0) continue;
      for (const std::string& o : out->results()) {
        for (const std::string& i : in->results()) {
          if (libra::same_file(o, i)) {
            return libra::invalid_input(out->get_name() + " " + o + ": is the input " + i +
                                        "; write the output to another file");
          }
        }
      }
    }
  }
  return {};
}

// Refuses, before any work, outputs that would land on each other: two
// output flags naming one file (symbolic links followed) or both standard
// output, and a file inside an output directory (`simulate --report R` fills
// R with files of its own, which would replace `-o R/result.json`).
libra::Status check_outputs_do_not_collide(CLI::App& leaf) {
  struct Named {
    std::string flag, path, target;
    bool dir;
  };
  std::vector<Named> outs;
  for (const CLI::Option* opt : leaf.get_options()) {
    const bool dir = is_output_dir_option(opt);
    if ((!dir && !is_output_option(opt)) || opt->count() == 0) continue;
    for (const std::string& p : opt->results()) {
      auto t = libra::output_target(p);
      if (!t.ok()) return t.error();
      outs.push_back({opt->get_name(), p, *t, dir});
    }
  }
  for (std::size_t a = 0; a < outs.size(); ++a) {
    for (std::size_t b = 0; b < outs.size(); ++b) {
      const Named& x = outs[a];
      const Named& y = outs[b];
      if (a < b && x.target == y.target) {
        return libra::invalid_input(y.flag + " " + y.path + ": " +
                                    (x.target == "-" ? "standard output is also " + x.flag + "'s"
                                                     : "is also " + x.flag + " " + x.path) +
                                    "; give each output its own path");
      }
      if (y.dir && !x.dir && x.target.size() > y.target.size() && x.target.rfind(y.target + "/", 0) == 0) {
        return libra::invalid_input(x.flag + " " + x.path + ": inside the " + y.flag + " directory " + y.path +
                                    ", which libra fills with its own files; write it elsewhere");
      }
    }
  }
  return {};
}

std::string command_path(const CLI::App* app) {
  std::string path;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent()) {
    path = path.empty() ? a->get_name() : a->get_name() + " " + path;
  }
  return path;
}

std::string subcommand_names(CLI::App* app) {
  std::string out;
  for (const CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; })) {
    out += (out.empty() ? "" : ", ") + sub->get_name();
  }
  return out;
}

// The message for a missing or unknown subcommand, or an unknown flag,
// naming what was typed and what is expected (CLI11 says only "A subcommand
// is required").
std::string usage_message(CLI::App& app, const CLI::ParseError& e) {
  CLI::App* leaf = &app;
  for (bool descended = true; descended;) {
    descended = false;
    for (CLI::App* sub : leaf->get_subcommands()) {
      if (sub->parsed()) {
        leaf = sub;
        descended = true;
        break;
      }
    }
  }
  std::vector<std::string> extra;
  for (const CLI::App* a = leaf; a != nullptr && extra.empty(); a = a->get_parent()) extra = a->remaining();
  const std::string path = command_path(leaf);
  const bool wants_command = leaf->get_require_subcommand_min() > 0 && leaf->get_subcommands().empty();
  if (!extra.empty()) {
    const std::string& first = extra.front();
    if (!first.empty() && first[0] == '-') {
      return path + ": unknown option '" + printable(first) + "'" +
             (wants_command ? "; a command is required first: " + subcommand_names(leaf) : "");
    }
    if (wants_command) {
      return "'" + printable(first) + "' is not a '" + path + "' command; expected one of: " + subcommand_names(leaf);
    }
    return path + ": unexpected argument '" + printable(first) + "'";
  }
  if (wants_command) return path + ": a command is required: " + subcommand_names(leaf);
  return printable(e.what());
}

}  // namespace

bool register_command(int order, std::function<std::vector<Handler>(CLI::App&)> setup) {
  registry().push_back({order, std::move(setup)});
  return true;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

int fail(const Error& error) {
  libra::write_stderr_line("libra: error: " + printable(error.message()));
  return error.code() == ErrorCode::kInternal ? kExitFailure : kExitUsage;
}

int fail(const Status& status) { return status.ok() ? kExitOk : fail(status.error()); }

void note(std::string_view message) { libra::write_stderr_line("libra: note: " + printable(message)); }

std::vector<std::string>& command_line_storage() {
  static std::vector<std::string> args;
  return args;
}
const std::vector<std::string>& command_line() { return command_line_storage(); }

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

}  // namespace libra::cli

int main(int argc, char** argv) {
  using namespace libra::cli;
  CLI::App app{"libra: attention-workload balancing for long-context LLM training", "libra"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("libra 0.1.0"));
  // Inherited by every subcommand: --help shows each option's default.
  app.option_defaults()->always_capture_default();
  std::stable_sort(registry().begin(), registry().end(),
                   [](const Registration& a, const Registration& b) { return a.order < b.order; });
  std::vector<Handler> handlers;
  for (auto& r : registry()) {
    auto h = r.setup(app);
    handlers.insert(handlers.end(), h.begin(), h.end());
  }
  harden_options(app);
  for (int i = 1; i < argc; ++i) command_line_storage().emplace_back(argv[i]);
  // Under mpirun every process parses the same flags: a flag error goes
  // through the processes' agreement, so it is printed once, not once each.
  auto usage_error = [&](const std::string& message) {
    if (under_launcher()) return fail_under_launcher(libra::invalid_input(message));
    libra::write_stderr_line("libra: error: " + printable(message));
    return kExitUsage;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ConversionError& e) {
    // After strict_integer only the range of a narrower type fails here.
    std::string m = e.what();
    const std::string prefix = "Could not convert: ";
    if (m.rfind(prefix, 0) == 0) {
      m = m.substr(prefix.size());
      if (const auto eq = m.find(" = "); eq != std::string::npos) m.replace(eq, 3, " ");
      m += ": out of range for this option";
    }
    return usage_error(m);
  } catch (const CLI::ParseError& e) {
    // One line, naming the flag and the rule, exit status 2 like every bad input.
    return usage_error(usage_message(app, e));
  }
  for (auto& h : handlers) {
    if (h.command->parsed()) {
      for (auto check : {check_outputs_are_not_inputs, check_outputs_do_not_collide}) {
        if (libra::Status s = check(*h.command); !s.ok()) return under_launcher() ? fail_under_launcher(s) : fail(s);
      }
      // tests/docs: every command shown in the docs parses (flags exist,
      // values are well formed, output directories exist) without running.
      if (const char* p = std::getenv("LIBRA_PARSE_ONLY"); p != nullptr && std::string(p) == "1") {
        libra::write_stderr_line("libra: parse-only: " + command_path(h.command) + " parsed");
        return kExitOk;
      }
      try {
        return h.run();
      } catch (const std::bad_alloc&) {
        libra::write_stderr_line("libra: error: out of memory");
        return kExitFailure;
      }
    }
  }
  libra::write_stderr_line("libra: error: no command given; see libra --help");
  return kExitUsage;
}
