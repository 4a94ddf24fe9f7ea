// `libra simulate`: the configuration simulator (paper sections 7 and 8).
// Every setting's flag comes from the simulator's settings schema
// (libra::sim_settings(), shared with the JSON config); the flags defined
// here are output options only.
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "libra/elastic_sim.hpp"
#include "libra/io.hpp"
#include "libra/simulator.hpp"

extern char** environ;

namespace libra::cli {

// cmd_simulate_elastic.cpp
int run_simulate_elastic(SimConfig cfg, bool pool_given, bool shards_given, bool blocks_given, bool chunks_given,
                         ElasticOptions elastic, const std::string& rule, bool priced, const std::string& plan_mode,
                         bool json,
                         const std::string& output);

namespace {

struct SimulateOptions {
  std::optional<std::string> source;  // positional
  std::optional<std::string> config;
  // Per setting key: the flag's text (lists: every value given).
  std::map<std::string, std::vector<std::string>> values;
  bool no_end_to_end = false;
  bool json = false, csv = false, timing = false, progress = false, quiet = false;
  std::optional<std::string> report, config_out;
  std::string output = "-";
  bool elastic = false;  // --elastic: vrsp-elastic against vrsp (cmd_simulate_elastic.cpp)
  ElasticOptions elastic_options;
  std::string elastic_rule = "buddy";
  bool elastic_unpriced = false;  // --elastic-unpriced: every window vrsp-elastic fuses runs fused
  std::string elastic_plan_mode = "tap";  // --elastic-plan-mode: tap or tap-topo
  std::vector<const CLI::Option*> elastic_flags;  // meaningful with --elastic only
};

// Runs `gnuplot sim-plots.gp` inside `dir`: fork, chdir, execvp with an
// argument vector; no shell ever sees `dir`. True when gnuplot ran and exited 0.
bool render_plots(const std::string& dir) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      dup2(null_fd, STDOUT_FILENO);
      dup2(null_fd, STDERR_FILENO);
    }
    if (chdir(dir.c_str()) != 0) _exit(127);
    char arg0[] = "gnuplot";
    char arg1[] = "sim-plots.gp";
    char* argv[] = {arg0, arg1, nullptr};
    execvp(argv[0], argv);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The figures the report's index.md shows; a figure gnuplot left empty
// (a full disk) counts as not rendered.
bool figures_complete(const std::filesystem::path& dir) {
  for (const char* png : {"sim-imbalance.png", "sim-bytes.png", "sim-latency.png", "sim-microbatch.png",
                          "sim-dp-scaling.png"}) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(dir / png, ec);
    if (ec || size == 0) return false;
  }
  return true;
}

// Writes the report as a whole or not at all: into a temporary folder next
// to `dir`, figures checked, then renamed to `dir` (or, when `dir` already
// holds files, each file renamed into it with index.md last), so a failure
// midway leaves no index.md pointing at missing or empty figures.
Status write_report_atomically(const SimResult& r, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);  // also checks that it can exist
  if (ec || !fs::is_directory(dir)) {
    return io_error(fmt::format("--report {}: cannot create directory: {}", dir,
                                ec ? ec.message() : std::string("a file of that name exists")));
  }
  const fs::path target = fs::absolute(dir).lexically_normal();
  const fs::path tmp = target.parent_path() / fmt::format(".{}.tmp-{}", target.filename().string(), ::getpid());
  fs::remove_all(tmp, ec);
  auto fail_clean = [&](const Status& s) {
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
    return s;
  };
  Status s = write_sim_report(r, tmp.string(), true);
  if (!s.ok()) return fail_clean(s);
  if (!render_plots(tmp.string()) || !figures_complete(tmp)) {
    for (const auto& e : fs::directory_iterator(tmp, ec)) {
      if (e.path().extension() == ".png") fs::remove(e.path(), ec);
    }
    s = write_sim_report(r, tmp.string(), false);
    if (!s.ok()) return fail_clean(s);
  }
  if (fs::is_empty(target, ec) && !ec) {
    fs::rename(tmp, target, ec);  // onto an empty directory: one step
    if (!ec) return {};
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    if (e.path().filename() != "index.md") files.push_back(e.path());
  }
  files.push_back(tmp / "index.md");
  for (const fs::path& f : files) {
    fs::rename(f, target / f.filename(), ec);
    if (ec) {
      return fail_clean(io_error(fmt::format("--report {}: cannot move {} into it: {}", dir, f.filename().string(),
                                             ec.message())));
    }
  }
  fs::remove_all(tmp, ec);
  return {};
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

int run_simulate(const SimulateOptions& o) {
  if (o.json && o.csv) return fail(invalid_input("--json and --csv: choose one output format"));
  if (o.report && o.elastic) return fail(invalid_input("--report " + *o.report + ": --elastic writes no report; drop one"));
  for (const CLI::Option* f : o.elastic_flags) {
    if (!o.elastic && f->count() > 0) return fail(invalid_input(f->get_name() + ": only with --elastic; add --elastic or drop it"));
  }
  SimConfig cfg;
  if (o.config) {
    auto text = read_file(*o.config);
    if (!text.ok()) return fail(text.error());
    Status s = apply_sim_config_json(*text, *o.config, cfg);
    if (!s.ok()) return fail(s);
  }
  // Flags override the file, in schema order (presets first).
  for (const SimSetting& st : sim_settings()) {
    auto it = o.values.find(std::string(st.key));
    if (it == o.values.end() || it->second.empty()) continue;
    const std::string text = st.type == SettingType::kIntList ? join(it->second) : it->second.back();
    Status s = apply_sim_setting(st, text, std::string(st.flag), cfg);
    if (!s.ok()) return fail(s);
  }
  if (o.source) cfg.source = *o.source;
  if (o.no_end_to_end) cfg.end_to_end = false;
  // The default DP sweep is fitted to --gbs (a sweep the user never gave
  // must not refuse --gbs 4 over its 8); a given one is checked whole.
  if (auto it = o.values.find("scaling_dp");
      (it == o.values.end() || it->second.empty()) && cfg.scaling_dp == SimConfig{}.scaling_dp) {
    std::erase_if(cfg.scaling_dp, [&](std::int64_t d) { return cfg.gbs >= 1 && cfg.gbs % d != 0; });
  }
  if (o.elastic) {
    auto given = [&](const char* key) {
      auto it = o.values.find(key);
      return it != o.values.end() && !it->second.empty();
    };
    if (!given("windows")) cfg.max_windows = 0;  // every window unless --windows says otherwise
    return run_simulate_elastic(cfg, given("pool_size"), given("head_shards"), given("block_size"), given("chunks"),
                                o.elastic_options, o.elastic_rule, !o.elastic_unpriced, o.elastic_plan_mode,
                                o.json, o.output);
  }
  if (o.config_out) {
    Status s = write_file_atomic(*o.config_out, sim_config_json(cfg));
    if (!s.ok()) return fail(s);
  }

  // Progress on stderr (never on stdout, so never in --json output): from
  // the start with --progress, else once the run has taken 3 s; a
  // terminal gets one updated line, anything else one line per finished
  // phase. --quiet: none.
  SimProgress progress;
  const bool tty = stderr_is_terminal();
  const bool bar = !o.quiet;
  if (bar) {
    const auto start = std::chrono::steady_clock::now();
    const bool always = o.progress;
    progress = [tty, always, start, shown = false, last = std::string()](std::string_view phase, std::int64_t done,
                                                                         std::int64_t total) mutable {
      if (!always && !shown && std::chrono::steady_clock::now() - start < std::chrono::seconds(3)) return;
      shown = true;
      const int width = 40;
      const auto filled = static_cast<int>(width * done / std::max<std::int64_t>(total, 1));
      std::string line = fmt::format("[{}{}] {}/{} {}", std::string(static_cast<std::size_t>(filled), '#'),
                                     std::string(static_cast<std::size_t>(width - filled), '.'), done, total, phase);
      if (tty) {
        std::cerr << ("\r" + line) << std::flush;  // one write: see write_stderr_line
      } else if (line != last && done == total) {
        write_stderr_line(line);  // not a terminal: one line per finished phase
      }
      last = line;
    };
  }
  cfg.thread_timing = o.timing;  // a clock read per plan costs ~2%: only --timing prints them
  auto r = simulate(cfg, progress);
  if (bar && tty) std::cerr << ("\r" + std::string(70, ' ') + "\r") << std::flush;
  if (!r.ok()) return fail(r.error());

  std::string out = o.json ? sim_json(*r) : o.csv ? sim_csv(*r) : sim_table(*r);
  if (o.report) {
    Status s = write_report_atomically(*r, *o.report);
    if (!s.ok()) return fail(s);
    if (!o.json && !o.csv) out += "\nReport written to " + *o.report + "/index.md\n";
  }
  if (o.timing) {
    const auto& t = r->timing;
    std::cerr << fmt::format(
        "timing: wall {:.2f} s (load {:.2f} s, end-to-end phase {:.2f} s); process CPU {:.2f} s; thread CPU summed "
        "over threads: placement {:.2f} s, make_plan {:.2f} s ({} plans), cost model {:.2f} s; peak RSS {} MB\n",
        t.total_s, t.load_s, t.end_to_end_s, t.cpu_s, t.placement_s, t.plan_s, t.plans, t.cost_s,
        t.peak_rss_kb / 1024);
    for (const auto& [kind, v] : t.by_kind) {
      std::cerr << fmt::format("  make_plan for {:<20} {:8.2f} s CPU {:7d} plans {:8.2f} ms/plan\n", kind, v.first,
                               v.second, 1e3 * v.first / static_cast<double>(std::max<std::int64_t>(v.second, 1)));
    }
  }
  Status s = write_file_atomic(o.output, out);
  if (!s.ok()) return fail(s);
  return kExitOk;
}

const bool registered = register_command(50, [](CLI::App& app) {
  auto* sub = app.add_subcommand(
      "simulate", "Replay a corpus through the planners for candidate (P, H, B) and predict step latency");
  auto o = std::make_shared<SimulateOptions>();
  sub->add_option("source", o->source, "corpus: file or builtin:NAME (default builtin:paper-1m; same as --source)");
  sub->add_option("--config", o->config, "JSON config file (keys as the flags, '_' for '-'); flags override it");
  for (const SimSetting& st : sim_settings()) {
    auto& dst = o->values[std::string(st.key)];
    auto* opt = sub->add_option(std::string(st.flag), dst, std::string(st.help));
    // A list is split by the settings' parser, which refuses an empty item
    // ("1,,2", ","); CLI11's delimiter dropped it, or named no flag.
    if (st.type != SettingType::kIntList) opt->allow_extra_args(false);
  }
  sub->add_flag("--no-end-to-end", o->no_end_to_end, "skip the DP sweep and microbatch model (= --end-to-end false)");
  sub->add_option("--config-out", o->config_out, "write the effective settings as a JSON config to this file");
  sub->add_flag("--json", o->json, "JSON output");
  sub->add_flag("--csv", o->csv, "CSV output, one row per candidate");
  sub->add_option("--report", o->report, "write plots, data and index.md into this directory");
  sub->add_flag("--timing", o->timing, "print where the time went on stderr (wall and CPU time)");
  sub->add_flag("--progress", o->progress, "progress on stderr from the start (default: once a run takes 3 s)");
  sub->add_flag("--quiet", o->quiet, "no progress on stderr");
  sub->add_option("-o,--output", o->output, "output file (default stdout)");
  sub->add_flag("--elastic", o->elastic,
                "elastic pools: vrsp-elastic against vrsp for one (P, H, B) (default 8, 8, 16384), every window");
  o->elastic_flags = {
      sub->add_option("--elastic-k", o->elastic_options.max_pools, "with --elastic: at most k pools per domain (default 2)"),
      sub->add_option("--elastic-threshold", o->elastic_options.threshold,
                      "with --elastic: fuse above this excess over the mean pool load (default 0.05)"),
      sub->add_option("--elastic-rule", o->elastic_rule, "with --elastic: buddy (default) or lightest"),
      sub->add_flag("--elastic-unpriced", o->elastic_unpriced,
                    "with --elastic: run fused every window vrsp-elastic fuses (default: only where predicted faster)"),
      sub->add_option("--elastic-plan-mode", o->elastic_plan_mode,
                      "with --elastic: tile placement of pools and domains, tap (default) or tap-topo"),
  };
  return std::vector<Handler>{{sub, [o] { return run_simulate(*o); }}};
});

}  // namespace
}  // namespace libra::cli
