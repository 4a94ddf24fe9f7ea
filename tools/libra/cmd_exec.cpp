// `libra exec`: run a pool's attention forward and backward through a
// distributed executor, under mpirun or as in-process ranks, and check it
// against a single-process reference. The distributed check itself is the
// harness's run_check (src/exec/harness.hpp), which the executor tests run
// too, and the report's verdict and JSON are the harness's as well; this
// file holds the flags, the job's start and end on every rank, and the
// printing. `libra bench exec` is cmd_bench_exec.cpp; the flags both take,
// exec_flags.hpp.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "exec_flags.hpp"
#include "exec_job.hpp"
#include "plan_flags.hpp"
#include "core/fault.hpp"
#include "exec/harness.hpp"
#include "libra/comm.hpp"
#include "libra/corpus.hpp"
#include "libra/executor.hpp"
#include "libra/plan.hpp"

namespace libra::cli {
namespace {

struct ExecOptionsCli {
  PoolFlags pool;
  std::string mode = "tap";
  std::uint64_t seed = 1;
  bool check = false;
  std::string reference = "auto";
  std::string trace;
  int ranks = 0;  // > 0: in-process ranks instead of MPI
  std::string plan;  // a saved plan: pool and shape come from it
  std::string backend = "cpu";  // a registered attention backend (attention_backends())
  bool json = false;
  const CLI::Option* reference_flag = nullptr;
  double check_tolerance = 0;  // with check_tolerance_flag: one relative tolerance for every tensor
  const CLI::Option* check_tolerance_flag = nullptr;
  const CLI::Option* ranks_flag = nullptr;
  std::vector<const CLI::Option*> pool_flags;  // source, --pool-size, --pool-index, --mode: fixed by --plan
  int repeat = 1;    // forward + backward runs; timings and check of the last
  double timeout = 300;  // seconds a rank waits to hear from a peer
};

std::string bytes_text(std::int64_t b) {
  const double x = static_cast<double>(b);
  if (x >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", x / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", x / 1024.0);
}

// How the flags asked for the run, as the report names it.
RunDescription describe_run(const ExecOptionsCli& opt, const PlanConfig& cfg, const std::string& source, double scale) {
  RunDescription run;
  run.config = cfg;
  run.mode = (opt.plan.empty() ? opt.mode : fmt::format("{} (plan {})", plan_mode_name(cfg.mode), opt.plan)) +
             (cfg.kv_prefix ? " with KV prefix" : "") + (opt.pool.relay ? ", relayed inputs" : "");
  run.chunk_widths = chunk_widths(cfg);
  run.source = source;
  run.length_scale = scale;
  run.threads = opt.pool.threads;
  run.relay = opt.pool.relay;
  return run;
}

void print_run(const RunDescription& run, const CheckReport& r) {
  const PlanConfig& cfg = run.config;
  fmt::print("libra exec: {} ranks = {} pool(s) x W {} (P {} x CP {}); mode {}, M {}{}, L {}, h_q {}, h_kv {}, d {}, "
             "{}, window {}, {} kernel thread(s) per rank\n",
             r.ranks, r.pools, r.pool_ranks, r.pool_size, cfg.cp, run.mode, cfg.chunks,
             cfg.chunk_split == ChunkSplit::kEqual ? std::string() : " (" + tapered_chunks_text(cfg) + ")", cfg.seq_len,
             cfg.shape.heads_q, cfg.shape.heads_kv, cfg.shape.head_dim, dtype_name(cfg.shape.dtype),
             cfg.shape.window != kFullCausal ? std::to_string(cfg.shape.window) : std::string("full"), run.threads);
  if (run.length_scale != 1.0) {
    fmt::print("pool source: {} with sample lengths scaled by {:.6g}\n", run.source, run.length_scale);
  }
  for (const PoolResult& p : r.pool_results) {
    fmt::print("pool {}: {} samples, tokens per slot: {}\n", p.pool, p.samples, fmt::join(p.tokens_per_slot, " "));
    if (p.planned) {
      fmt::print("pool {} plan: {} tiles, intra-pool imbalance {:.4f}, exchanged {} per pass{}\n", p.pool, p.tiles,
                 p.imbalance, bytes_text(p.comm_bytes),
                 run.relay ? fmt::format(", {} (chunk, sender, receiver) pairs relayed", p.relayed_pairs) : "");
    }
  }
  fmt::print("forward:  wall {:.4f} s (slowest rank), kernel compute {:.4f} s slowest / {:.4f} s mean rank\n",
             r.forward_wall.max, r.forward_compute.max, r.forward_compute.mean);
  fmt::print("backward: wall {:.4f} s (slowest rank), kernel compute {:.4f} s slowest / {:.4f} s mean rank\n",
             r.backward_wall.max, r.backward_compute.max, r.backward_compute.mean);
  fmt::print("overhead: wall over the busiest rank's kernel time forward {:+.1f}%, backward {:+.1f}%; executor CPU "
             "outside the kernel (thread CPU time, max over ranks) forward {:.1f}%, backward {:.1f}% of kernel CPU\n",
             100 * wall_overhead(r.forward_wall, r.forward_compute), 100 * wall_overhead(r.backward_wall, r.backward_compute),
             100 * r.forward_own.max, 100 * r.backward_own.max);
}

void print_check(const CheckVerdict& v, const CheckReport& r) {
  const auto& names = kCheckedTensorNames;
  fmt::print("check ({} pool(s), every home gathered on its pool's rank 0, reference on whole sequences):\n", r.pools);
  for (const PoolResult& p : r.pool_results) {
    if (r.pools == 1) break;
    bool pool_ok = true;
    std::string rels;
    for (int i = 0; i < kCheckedTensors; ++i) {
      pool_ok = pool_ok && v.within(p.errors, i);
      rels += fmt::format(" {} {:.2e}", names[i], p.errors[static_cast<std::size_t>(i)].rel());
    }
    fmt::print("  pool {} ({}): relative{}  {}\n", p.pool, reference_name(p.reference), rels, pool_ok ? "ok" : "FAIL");
  }
  if (r.pools == 1) fmt::print("  reference: {}\n", reference_name(r.pool_results[0].reference));
  for (int i = 0; i < kCheckedTensors; ++i) {
    const ErrorStats& e = v.total[static_cast<std::size_t>(i)];
    fmt::print("  {:<4} max abs error {:.3e}  relative {:.3e}  (tolerance {:.0e})  {}\n", names[i], e.max_abs, e.rel(),
               v.tolerance[static_cast<std::size_t>(i)], v.within(v.total, i) ? "ok" : "FAIL");
  }
  fmt::print("result: {}\n", v.ok ? "within tolerance" : "BEYOND TOLERANCE");
}

// World rank 0's report of a finished run: the run, every pool, the
// timings, the trace and the check (the verdict and JSON are the harness's).
int print_report(Communicator& world, const ExecOptionsCli& opt, const PlanConfig& cfg, const std::string& source,
                 double scale, const CheckReport& r, const TraceRecorder& trace) {
  const bool root = world.rank() == 0;
  RunDescription run = describe_run(opt, cfg, source, scale);
  if (root && !opt.json) print_run(run, r);
  if (!opt.trace.empty()) {
    Status ts = write_trace(world, trace, opt.trace);
    if (!ts.ok()) return root ? fail(ts.error()) : kExitUsage;
    run.trace = opt.trace;
    if (root && !opt.json) {
      fmt::print("trace: {} (Chrome trace-event JSON; lanes per rank: compute, transfer, wait)\n", opt.trace);
    }
  }
  if (!opt.check) {
    if (root && opt.json) fmt::print("{}\n", run_report_json(run, r, nullptr));
    return kExitOk;
  }
  int verdict = kExitOk;
  if (root) {
    const bool uniform = opt.check_tolerance_flag != nullptr && opt.check_tolerance_flag->count() > 0;
    const CheckVerdict v =
        check_verdict(r, uniform ? uniform_tolerance(opt.check_tolerance) : tolerance_for(cfg.shape.dtype));
    if (opt.json) {
      fmt::print("{}\n", run_report_json(run, r, &v));
    } else {
      print_check(v, r);
    }
    if (!v.ok) {
      const auto i = static_cast<std::size_t>(v.first_failed);
      std::fflush(stdout);
      fmt::print(stderr, "libra: error: --check: {} relative error {:.3e} is beyond the tolerance {:.0e} (exit status 3)\n",
                 kCheckedTensorNames[i], v.total[i].rel(), v.tolerance[i]);
    }
    verdict = v.ok ? kExitOk : kExitCheckFailed;
  }
  Result<std::vector<std::uint64_t>> verdicts = world.allgather(static_cast<std::uint64_t>(verdict));
  if (!verdicts.ok()) abort_job(world, verdicts.error());
  return static_cast<int>((*verdicts)[0]);
}

// The body every rank runs. Returns the exit status; only world rank 0
// prints.
int exec_rank(Communicator& world, const ExecOptionsCli& opt) {
  detail::set_fault_rank(world.rank());

  // Agreement before work: ranks started with different flags would build
  // different schedules and wait on messages that never come.
  std::string args;
  for (const std::string& a : command_line()) args += a + '\0';
  if (int rc = finish_agreed(world, agree_on_value(world, fingerprint_of(args), "the command lines differ",
                                                   "start every rank with the same flags", ErrorCode::kInvalidInput));
      rc != kExitOk) {
    return rc;
  }

  // Configuration and pool: every rank derives the same from the flags, or
  // loads the same plan file (which carries both).
  std::optional<Plan> saved;
  if (!opt.plan.empty()) {
    Result<Plan> p = load_plan(opt.plan);
    if (int rc = fail_on_all_ranks(world, p.status()); rc != kExitOk) return rc;
    saved = std::move(*p);
  }
  Result<PlanConfig> cfg = saved ? Result<PlanConfig>(saved->config()) : make_config(opt.pool, opt.mode);
  if (int rc = fail_on_all_ranks(world, cfg.status()); rc != kExitOk) return rc;
  double scale = 1.0;
  Result<std::vector<PackedSequence>> all = std::vector<PackedSequence>();
  if (!saved) all = load_scaled(opt.pool.source, cfg->seq_len, &scale);
  if (int rc = fail_on_all_ranks(world, all.status()); rc != kExitOk) return rc;

  TraceRecorder trace;
  CheckJob job;
  job.config = *cfg;
  job.ulysses_direct = !saved && opt.mode == "ulysses";
  job.plan = saved ? &*saved : nullptr;
  job.sequences = *all;
  job.source = saved ? opt.plan : opt.pool.source;
  job.first_pool = opt.pool.pool_index;
  job.pool_size = saved ? saved->pool_size() : opt.pool.pool_size;
  job.seed = opt.seed;
  job.threads = opt.pool.threads;
  job.relay = opt.pool.relay;
  job.backend = opt.backend;
  job.repeat = opt.repeat;
  job.check = opt.check;
  if (opt.reference == "naive") job.reference = ReferenceKind::kNaive;
  if (opt.reference == "kernel") job.reference = ReferenceKind::kKernel;
  job.trace = opt.trace.empty() ? nullptr : &trace;
  job.on_fatal = [&world](const Error& e) { abort_job(world, e); };
  Result<CheckReport> report = run_check(world, job);
  if (!report.ok()) return finish_agreed(world, report.status());
  return print_report(world, opt, *cfg, job.source, scale, *report, trace);
}

// The flag errors run_exec finds before starting any rank.
Status check_exec_flags(const ExecOptionsCli& opt, const LaunchedWorld* launched) {
  static const char* kModes[] = {"tap", "tap-split", "tap-topo", "ulysses", "ulysses-plan"};
  if (std::find_if(std::begin(kModes), std::end(kModes), [&](const char* m) { return opt.mode == m; }) == std::end(kModes)) {
    return invalid_input("--mode " + opt.mode + ": expected tap, tap-split, tap-topo, ulysses or ulysses-plan");
  }
  if (opt.repeat < 1 || opt.repeat > kMaxRepeat) {
    return invalid_input(fmt::format("--repeat {}: must be in [1, {}]", opt.repeat, kMaxRepeat));
  }
  // The waits count whole milliseconds: a shorter timeout was 0 ms, which
  // blamed a healthy rank for being silent.
  if (!(opt.timeout >= 1e-3) || opt.timeout > 86400) {
    return invalid_input(fmt::format("--timeout {}: must be at least 0.001 (1 ms, the waits' resolution) and at most "
                                     "86400 seconds", opt.timeout));
  }
  LIBRA_TRY(check_threads(opt.pool.threads));
  if (Result<std::unique_ptr<AttentionBackend>> b = make_backend(opt.backend); !b.ok()) {
    return invalid_input("--" + b.error().message());
  }
  if (opt.reference != "auto" && opt.reference != "naive" && opt.reference != "kernel") {
    return invalid_input("--reference " + opt.reference + ": expected auto, naive or kernel");
  }
  if (opt.check_tolerance_flag != nullptr && opt.check_tolerance_flag->count() > 0) {
    if (!opt.check) {
      return invalid_input(fmt::format("--check-tolerance {}: only used by --check; add --check or drop it",
                                       opt.check_tolerance));
    }
    if (!(opt.check_tolerance >= 0) || !std::isfinite(opt.check_tolerance)) {
      return invalid_input(fmt::format("--check-tolerance {}: must be a finite number >= 0", opt.check_tolerance));
    }
  }
  if (opt.reference_flag != nullptr && opt.reference_flag->count() > 0 && !opt.check) {
    return invalid_input("--reference " + opt.reference + ": only used by --check; add --check or drop --reference");
  }
  if (!opt.plan.empty()) {
    std::string given = first_plan_flag_given(opt.pool.flags);
    for (const CLI::Option* f : opt.pool_flags) {
      if (given.empty() && f->count() > 0) given = f->get_name();
    }
    if (!given.empty()) {
      return invalid_input("--plan " + opt.plan + ": the saved plan fixes " + given + "; drop " + given +
                           " or plan from the flags instead");
    }
    LIBRA_TRY(check_plan_path(opt.plan));
  }
  // Each rank would read its own part of one stream, and no two ranks the
  // same pool.
  const bool several = launched != nullptr || opt.ranks > 1;
  if (opt.plan.empty() && opt.pool.source == "-" && several) {
    return invalid_input("-: standard input cannot feed several ranks (each would read a different part of it); save "
                         "the pool to a file and name the file");
  }
  const bool ranks_given = opt.ranks_flag != nullptr && opt.ranks_flag->count() > 0;
  if (launched != nullptr) {
    // Every process would start --ranks threads of its own: the job would
    // run (and print) once per process.
    if (ranks_given) {
      return invalid_input(fmt::format("--ranks {}: starts in-process ranks, but this is already one of the processes "
                                       "of {}; drop --ranks ({} sets the ranks)",
                                       opt.ranks, launched->launcher, launched->start));
    }
    return Status();
  }
  if (!ranks_given) {
    std::string starts;
    for (const LaunchedWorld& w : launched_worlds()) starts += fmt::format("run under {}, or ", w.start);
    return invalid_input("no ranks: " + starts + "give --ranks N for N in-process ranks");
  }
  if (opt.ranks < 1) return invalid_input(fmt::format("--ranks {}: must be at least 1", opt.ranks));
  if (opt.ranks > 256) return invalid_input(fmt::format("--ranks {}: at most 256 in-process ranks", opt.ranks));
  return Status();
}

// One launched process's share of the job (a registered LaunchedWorld, as
// mpirun starts MPI ranks): `refused` (a flag error of this process) is
// agreed on with the others first, so that rank 0 alone prints it and no
// rank exits before it has (mpirun kills the job at the first nonzero exit).
int run_launched_rank(const LaunchedWorld& kind, const ExecOptionsCli* opt, const Status& refused) {
  const double timeout = opt != nullptr && refused.ok() ? opt->timeout : 300;
  auto watchdog = std::make_unique<StartupWatchdog>(timeout, kind.launcher_rank());
  if (Status s = kind.init(); !s.ok()) {
    if (refused.ok()) return fail(s.error());
    // Without the world the ranks cannot agree; the launcher's rank 0 prints.
    const int rank = kind.launcher_rank();
    if (rank <= 0) fail(refused);
    return refused.error().code() == ErrorCode::kInternal ? kExitFailure : kExitUsage;
  }
  int rc = kExitFailure;
  {
    Result<std::unique_ptr<Communicator>> world = kind.world(timeout);
    watchdog.reset();  // started: the communicator's waits have the timeout from here
    if (!world.ok()) {
      rc = fail(world.error());
    } else if (int agreed = fail_on_all_ranks(**world, refused); agreed != kExitOk || opt == nullptr) {
      rc = agreed;
    } else {
      try {
        rc = exec_rank(**world, *opt);
      } catch (const std::bad_alloc& e) {
        // Ends the job from here, in one line, rather than leaving the
        // launcher to notice a process gone.
        abort_job(**world, internal_error(fmt::format("rank {}: out of memory: {}", (*world)->rank(), e.what())));
      }
    }
  }
  kind.finalize();
  return rc;
}

int run_exec(const ExecOptionsCli& opt) {
  const LaunchedWorld* launched = launched_world();
  const Status flags = check_exec_flags(opt, launched);
  if (launched != nullptr) return run_launched_rank(*launched, &opt, flags);
  if (!flags.ok()) return fail(flags);
  set_in_process_ranks();
  std::vector<int> codes(static_cast<std::size_t>(opt.ranks), 0);
  int first = -1;
  const std::vector<Status> st = run_in_process(
      opt.ranks,
      [&](Communicator& c) {
        codes[static_cast<std::size_t>(c.rank())] = exec_rank(c, opt);
        return Status();
      },
      static_cast<int>(std::min(opt.timeout * 1000.0, 86400e3)), &first);
  // A rank that threw or aborted printed nothing: its failure (the first
  // that was not caused by another rank's) is the job's one line.
  if (first >= 0) return fail(st[static_cast<std::size_t>(first)].error());
  return codes[0];
}

}  // namespace

bool under_launcher() { return launched_world() != nullptr; }

int fail_under_launcher(const Status& error) { return run_launched_rank(*launched_world(), nullptr, error); }

namespace {

const bool registered = register_command(70, [](CLI::App& app) {
  std::vector<Handler> handlers;
  auto* ex = app.add_subcommand("exec", "Run a pool's attention forward and backward through a distributed executor "
                                        "(under mpirun, or --ranks N in-process) and check it");
  auto eo = std::make_shared<ExecOptionsCli>();
  eo->pool_flags = add_pool_flags(ex, eo->pool, false);
  eo->pool_flags.push_back(
      ex->add_option("--mode", eo->mode, "executor: tap, tap-split, tap-topo, ulysses (the baseline executor), ulysses-plan"));
  ex->add_option("--seed", eo->seed, "seed of the random Q, K, V and dO");
  {
    std::string names;
    for (const BackendEntry& b : attention_backends()) names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", b.name, b.what);
    ex->add_option("--backend", eo->backend, "attention backend: " + names);
  }
  ex->add_flag("--check", eo->check, "compare with the single-process reference on the whole sequences (exit 3 beyond tolerance)");
  eo->reference_flag =
      ex->add_option("--reference", eo->reference, "reference for --check: auto (naive fp64 when small), naive, kernel");
  eo->check_tolerance_flag = ex->add_option(
      "--check-tolerance", eo->check_tolerance,
      "one relative tolerance for every tensor in --check (default per dtype: fp32 2e-5 to 5e-5, fp16 2e-3 to 5e-3, bf16 2e-2 to 5e-2)");
  ex->add_option("--trace", eo->trace, "write a Chrome trace-event JSON file of compute and transfers per rank");
  eo->ranks_flag = ex->add_option("--ranks", eo->ranks, "run N ranks as threads of this process instead of MPI");
  ex->add_flag("--json", eo->json, "print the run, every pool and the --check result as one JSON document");
  ex->add_option("--repeat", eo->repeat, "run forward and backward N times on the same executor; the last run is timed "
                                         "and checked");
  ex->add_option("--timeout", eo->timeout, "seconds a rank waits to hear from a peer before the job ends with an error "
                                           "naming the silent rank");
  ex->add_option("--plan", eo->plan, "run a saved plan file (libra plan -o FILE): its pool and shape replace the source "
                                     "and shape flags");
  handlers.push_back({ex, [eo] { return run_exec(*eo); }});
  return handlers;
});

}  // namespace
}  // namespace libra::cli
