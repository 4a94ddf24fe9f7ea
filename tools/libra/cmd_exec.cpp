// `libra exec` (run a pool's attention forward and backward through a
// distributed executor, under mpirun or as in-process ranks, and check it
// against a single-process reference) and `libra bench exec` (per-worker
// compute time with the real kernel, straggler per mode, speedups over
// Ulysses).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "plan_flags.hpp"
#include "core/fault.hpp"
#include "exec/harness.hpp"
#include "libra/comm.hpp"
#include "libra/corpus.hpp"
#include "libra/executor.hpp"
#include "libra/plan.hpp"

namespace libra::cli {
namespace {

struct ShapeOptions {
  std::string source = "builtin:paper-1m";
  PlanFlags flags;  // as given; the fields below are resolved from them (or a --plan file)
  std::int64_t seq_len = 0;
  int cp = 0;
  std::int64_t block = 0;
  int head_shards = 0;
  int heads_q = 0, heads_kv = 0, head_dim = 0;
  std::string dtype = "bf16";
  std::optional<std::int64_t> window;
  double tau = 0.03;
  int chunks = 1;
  int pool_size = 0;     // 0: ranks / cp (exec), 4 (bench)
  std::int64_t pool_index = 0;
  int threads = 1;
};

struct ExecOptionsCli {
  ShapeOptions shape;
  std::string mode = "tap";
  std::uint64_t seed = 1;
  bool check = false;
  std::string reference = "auto";
  std::string trace;
  int ranks = 0;  // > 0: in-process ranks instead of MPI
  std::string plan;  // a saved plan: pool and shape come from it
  bool json = false;
  const CLI::Option* reference_flag = nullptr;
  double check_tolerance = 0;  // with check_tolerance_flag: one relative tolerance for every tensor
  const CLI::Option* check_tolerance_flag = nullptr;
  const CLI::Option* ranks_flag = nullptr;
  std::vector<const CLI::Option*> pool_flags;  // source, --pool-size, --pool-index, --mode: fixed by --plan
  int repeat = 1;    // forward + backward runs; timings and check of the last
  double timeout = 300;  // seconds a rank waits to hear from a peer
};

// Bounds that keep a typo from becoming a run that never ends.
constexpr int kMaxRepeat = 100000;
constexpr int kMaxThreads = 1024;  // the kernel's own limit

struct BenchOptionsCli {
  ShapeOptions shape;
  int pools = 4;
  bool backward = false;
  int repeat = 1;
};

std::vector<const CLI::Option*> add_shape_options(CLI::App* sub, ShapeOptions& o, bool bench) {
  std::vector<const CLI::Option*> pool_flags;
  pool_flags.push_back(sub->add_option("source", o.source, "pool: JSON Lines file (one packed sequence per line) or "
                                                           "builtin:NAME, whose sequences are scaled to --seq-len"));
  add_plan_flags(sub, o.flags, bench ? "default: a CPU-sized pool, see docs/executor.md" : "required unless --plan");
  if (!bench) o.flags.instead = "--plan FILE, whose plan carries the shape";
  pool_flags.push_back(sub->add_option("--pool-size", o.pool_size,
                                       bench ? "slots per pool P (default 4)" : "slots per pool P (default: ranks / cp)"));
  pool_flags.push_back(
      sub->add_option("--pool-index", o.pool_index, "first pool drawn from the source: sequences [index*P, ...)"));
  sub->add_option("--threads", o.threads, "kernel threads per rank");
  return pool_flags;
}

// The resolved shape fields of `so` from a configuration (flags or a plan file).
void adopt_config(ShapeOptions& so, const PlanConfig& c) {
  so.seq_len = c.seq_len;
  so.cp = c.cp;
  so.block = c.block_size;
  so.head_shards = c.head_shards;
  so.heads_q = c.shape.heads_q;
  so.heads_kv = c.shape.heads_kv;
  so.head_dim = c.shape.head_dim;
  so.dtype = dtype_name(c.shape.dtype);
  so.window = c.shape.window == kFullCausal ? std::nullopt : std::optional<std::int64_t>(c.shape.window);
  so.tau = c.tau;
  so.chunks = c.chunks;
}

// Packed sequences of the source at --seq-len. A built-in corpus made for
// another packed length is packed at its own length and every sample length
// scaled by seq_len / default (at least 1), so its long-tail shape is kept at
// a CPU-sized length.
Result<std::vector<PackedSequence>> load_scaled(const std::string& source, std::int64_t seq_len, double* scale) {
  *scale = 1.0;
  if (source.rfind("builtin:", 0) != 0) return load_packed_sequences(source, seq_len);
  LIBRA_ASSIGN_OR_RETURN(Corpus corpus, load_corpus(source));
  const std::int64_t D = corpus.default_seq_len;
  if (D <= 0 || D == seq_len) return load_packed_sequences(source, seq_len);
  LIBRA_ASSIGN_OR_RETURN(std::vector<PackedSequence> packed, load_packed_sequences(source, std::nullopt));
  *scale = static_cast<double>(seq_len) / static_cast<double>(D);
  for (PackedSequence& seq : packed) {
    PackedSequence out;
    std::int64_t total = 0;
    for (std::int64_t l : seq) {
      const std::int64_t s = std::max<std::int64_t>(1, l * seq_len / D);  // l, L <= 2^31: no overflow
      if (total + s > seq_len) break;
      out.push_back(s);
      total += s;
    }
    seq = std::move(out);
  }
  return packed;
}

Result<std::vector<PackedSequence>> draw_pool(const std::vector<PackedSequence>& all, const std::string& source,
                                              std::int64_t index, int P) {
  const std::int64_t first = index * P;
  if (index < 0 || first + P > static_cast<std::int64_t>(all.size())) {
    return invalid_input(fmt::format("{}: pool {} needs sequences [{}, {}) but the source has {}", source, index, first,
                                     first + P, all.size()));
  }
  return std::vector<PackedSequence>(all.begin() + first, all.begin() + first + P);
}

Status check_threads(int threads) {
  if (threads < 1 || threads > kMaxThreads) {
    return invalid_input(fmt::format("--threads {}: must be in [1, {}]", threads, kMaxThreads));
  }
  return Status();
}

// FNV-1a: a fingerprint of bytes that every rank computes alike.
std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Every rank's fingerprint equal, else one error naming the groups of ranks
// that hold each (the same text on every rank: built from gathered values).
Status agree_on(Communicator& world, std::uint64_t mine, const std::string& what, const std::string& hint) {
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, world.allgather(mine));
  std::vector<std::pair<std::uint64_t, std::vector<int>>> groups;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == all[r]; });
    if (it == groups.end()) {
      groups.push_back({all[r], {static_cast<int>(r)}});
    } else {
      it->second.push_back(static_cast<int>(r));
    }
  }
  if (groups.size() == 1) return Status();
  std::vector<std::string> parts;
  for (const auto& [fp, ranks] : groups) parts.push_back(fmt::format("rank(s) {} hold {:016x}", fmt::join(ranks, ","), fp));
  return invalid_input(fmt::format("{} differ across the {} ranks: {}; {}", what, all.size(), fmt::join(parts, "; "), hint));
}

// The configuration of the flags for one executor mode; also fills the
// resolved shape fields of `o`.
Result<PlanConfig> make_config(ShapeOptions& o, const std::string& mode) {
  LIBRA_ASSIGN_OR_RETURN(PlanConfig cfg, plan_config_from(o.flags));
  LIBRA_TRY(check_threads(o.threads));
  const std::string plan_mode = mode == "ulysses" ? "ulysses" : (mode == "ulysses-plan" ? "ulysses" : mode);
  LIBRA_ASSIGN_OR_RETURN(cfg.mode, parse_plan_mode(plan_mode));
  if (mode == "ulysses") cfg.chunks = 1;
  LIBRA_TRY(name_preset_fields(o.flags, validate_plan_config(cfg)));
  adopt_config(o, cfg);
  return cfg;
}

std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}
double double_of(std::uint64_t u) {
  double x;
  std::memcpy(&x, &u, 8);
  return x;
}

// Max and mean over ranks of a per-rank value.
Result<std::pair<double, double>> max_mean(Communicator& comm, double x) {
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, comm.allgather(bits_of(x)));
  double mx = 0, sum = 0;
  for (std::uint64_t u : all) {
    mx = std::max(mx, double_of(u));
    sum += double_of(u);
  }
  return std::make_pair(mx, sum / static_cast<double>(all.size()));
}

std::string bytes_text(std::int64_t b) {
  const double x = static_cast<double>(b);
  if (x >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", x / (1024.0 * 1024 * 1024));
  if (x >= 1024.0 * 1024) return fmt::format("{:.2f} MiB", x / (1024.0 * 1024));
  return fmt::format("{:.1f} KiB", x / 1024.0);
}

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
bool g_in_process = false;  // --ranks: the ranks are threads of this process
bool in_process_ranks() { return g_in_process; }

[[noreturn]] void abort_job(Communicator& world, const Error& e) {
  const int silent = silent_rank(e);
  if (silent >= 0 && !in_process_ranks() && world.rank() != (silent == 0 ? 1 : 0)) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
  world.abort(printable(e.message()));
  std::abort();  // not reached: abort ends the job
}

// Every rank learns of a failure and of the same message (the lowest failed
// rank's, naming the ranks); world rank 0 alone prints it, so the job prints
// one line however many ranks failed. kExitOk when no rank failed.
int fail_on_all_ranks(Communicator& world, const Status& local) {
  const Status agreed = agree_on_status(world, local, "libra exec");
  if (agreed.ok()) return kExitOk;
  // The agreement itself timed out: a peer went silent, and rank 0 may be
  // the one, so this ends the job like any silent peer.
  if (silent_rank(agreed.error()) >= 0) abort_job(world, agreed.error());
  if (world.rank() == 0) return fail(agreed.error());
  return agreed.error().code() == ErrorCode::kInternal ? kExitFailure : kExitUsage;
}

// The body every rank runs. Returns the exit status; only world rank 0
// prints.
int exec_rank(Communicator& world, const ExecOptionsCli& opt) {
  const bool root = world.rank() == 0;
  ShapeOptions so = opt.shape;
  detail::set_fault_rank(world.rank());

  // Agreement before work: ranks started with different flags would build
  // different schedules and wait on messages that never come.
  std::string args;
  for (const std::string& a : command_line()) args += a + '\0';
  if (int rc = fail_on_all_ranks(world, agree_on(world, fnv1a(args), "the command lines",
                                                 "start every rank with the same flags"));
      rc != kExitOk) {
    return rc;
  }

  // Configuration and pool: every rank derives the same from the flags, or
  // loads the same plan file (which carries both).
  std::optional<Plan> saved;
  if (!opt.plan.empty()) {
    Result<Plan> p = load_plan(opt.plan);
    if (int rc = fail_on_all_ranks(world, p.status()); rc != kExitOk) return rc;
    saved = *p;
    adopt_config(so, saved->config());
    so.pool_size = saved->pool_size();
    so.source = opt.plan;
  }
  Result<PlanConfig> cfg = saved ? Result<PlanConfig>(saved->config()) : make_config(so, opt.mode);
  if (int rc = fail_on_all_ranks(world, cfg.status()); rc != kExitOk) return rc;
  const int W = world.size();
  const int P = so.pool_size > 0 ? so.pool_size : W / so.cp;
  Status layout;
  if (so.pool_size > 0 && W % (P * so.cp) != 0) {
    layout = invalid_input(fmt::format("{} ranks: must be a multiple of --pool-size {} x --cp {} = {} (one pool of W = "
                                       "P x CP ranks, or several side by side)",
                                       W, P, so.cp, P * so.cp));
  } else if (so.pool_size <= 0 && W < so.cp) {
    layout = invalid_input(fmt::format("{} rank(s): fewer than --cp {}; one pool needs --pool-size x --cp ranks", W, so.cp));
  } else if (so.pool_size <= 0 && W % so.cp != 0) {
    layout = invalid_input(fmt::format("{} ranks: must be a multiple of --cp {} (--pool-size defaults to ranks / cp)", W,
                                       so.cp));
  }
  if (int rc = fail_on_all_ranks(world, layout); rc != kExitOk) return rc;
  const int Wp = P * so.cp;
  const int pools = W / Wp;
  const int pool_id = world.rank() / Wp;

  double scale = 1.0;
  Result<std::vector<PackedSequence>> all =
      saved ? Result<std::vector<PackedSequence>>(std::vector<PackedSequence>(saved->pool().begin(), saved->pool().end()))
            : load_scaled(so.source, so.seq_len, &scale);
  Result<std::vector<PackedSequence>> pool = all.ok() ? draw_pool(*all, so.source, saved ? 0 : so.pool_index + pool_id, P)
                                                      : Result<std::vector<PackedSequence>>(all.error());
  if (int rc = fail_on_all_ranks(world, pool.status()); rc != kExitOk) return rc;
  {
    // The same flags may still read different files on different machines.
    std::string bytes = saved ? fmt::format("{:016x}", saved->fingerprint()) : std::string();
    for (const PackedSequence& seq : *all) {
      bytes += fmt::format("{};", fmt::join(seq, ","));
    }
    if (int rc = fail_on_all_ranks(world, agree_on(world, fnv1a(bytes), so.source + ": the inputs read",
                                                   "every rank must read the same file"));
        rc != kExitOk) {
      return rc;
    }
  }

  // The pool communicator: ranks numbered as the contract numbers workers.
  Result<std::unique_ptr<Communicator>> pool_comm = world.split(pool_id, world.rank());
  if (int rc = fail_on_all_ranks(world, pool_comm.status()); rc != kExitOk) return rc;
  Communicator& pc = **pool_comm;

  TraceRecorder trace;
  ExecOptions eo;
  eo.threads = so.threads;
  eo.trace = opt.trace.empty() ? nullptr : &trace;
  std::optional<Plan> plan;
  Result<std::unique_ptr<Executor>> ex = internal_error("no executor");
  if (saved) {
    plan = *saved;
    ex = make_plan_executor(pc, *plan, eo);
  } else if (opt.mode == "ulysses") {
    ex = make_ulysses_executor(pc, *pool, *cfg, eo);
  } else {
    Result<Plan> p = make_plan(*pool, *cfg);
    if (p.ok()) {
      plan = *p;
      ex = make_plan_executor(pc, *plan, eo);
    } else {
      ex = p.error();
    }
  }
  if (int rc = fail_on_all_ranks(world, ex.status()); rc != kExitOk) return rc;

  const std::uint64_t data_seed = opt.seed * 1000003ULL + static_cast<std::uint64_t>(so.pool_index + pool_id);
  const int r = pc.rank();
  const std::vector<float> q = harness_home_tensor(data_seed, *cfg, r, 0), k = harness_home_tensor(data_seed, *cfg, r, 1),
                           v = harness_home_tensor(data_seed, *cfg, r, 2), d_o = harness_home_tensor(data_seed, *cfg, r, 3);

  // --repeat: the executor is reused as a model reuses it across layers;
  // the last run is timed and checked (earlier ones pay first-touch costs).
  // Outputs live in buffers kept across runs, as a training framework's
  // caching allocator keeps them, so later runs time attention, not page
  // faults.
  Result<ForwardOutputs> f = ForwardOutputs{std::vector<float>((*ex)->q_elements()), std::vector<float>((*ex)->lse_elements())};
  Result<BackwardOutputs> g = BackwardOutputs{std::vector<float>((*ex)->q_elements()),
                                              std::vector<float>((*ex)->kv_elements()),
                                              std::vector<float>((*ex)->kv_elements())};
  // A bf16 or fp16 plan gets its tensors in its own type, as a model in
  // that type holds them, so the timed runs convert nothing.
  const DType dt = cfg->shape.dtype;
  auto in_type = [&](const std::vector<float>& x) {
    std::vector<std::uint16_t> b(dt == DType::kF32 ? 0 : x.size());
    if (!b.empty()) store_all_from_f32(x.data(), static_cast<std::int64_t>(x.size()), dt, b.data());
    return b;
  };
  const std::vector<std::uint16_t> q16 = in_type(q), k16 = in_type(k), v16 = in_type(v), d_o16 = in_type(d_o);
  std::vector<std::uint16_t> o16(dt == DType::kF32 ? 0 : f->o.size());
  auto home = [&](const std::vector<float>& x32, const std::vector<std::uint16_t>& x16) {
    return dt == DType::kF32 ? HomeTensor(x32) : HomeTensor(x16, dt);
  };
  const AttentionInputs inputs{home(q, q16), home(k, k16), home(v, v16)};
  const HomeOutput o_out = dt == DType::kF32 ? HomeOutput(f->o) : HomeOutput(o16, dt);
  double fwd_wall = 0, bwd_wall = 0, fwd_compute = 0, bwd_compute = 0;
  PassStats fwd_stats, bwd_stats;
  for (int rep = 0; rep < opt.repeat; ++rep) {
    if (Status s = world.barrier(); !s.ok()) abort_job(world, s.error());
    auto t0 = std::chrono::steady_clock::now();
    if (Status s = (*ex)->forward_into(inputs, {o_out, f->lse}); !s.ok()) abort_job(world, s.error());
    fwd_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fwd_compute = (*ex)->last_compute_seconds();
    fwd_stats = (*ex)->last_stats();
    t0 = std::chrono::steady_clock::now();
    if (Status s = (*ex)->backward_into(inputs, home(f->o, o16), f->lse, home(d_o, d_o16), {g->dq, g->dk, g->dv}); !s.ok()) {
      abort_job(world, s.error());
    }
    bwd_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bwd_compute = (*ex)->last_compute_seconds();
    bwd_stats = (*ex)->last_stats();
  }
  // The executor's own CPU work per rank (packing, unpacking, conversions)
  // relative to its kernel CPU time.
  auto own = [](const PassStats& s) { return s.kernel_cpu > 0 ? (s.cpu - s.kernel_cpu) / s.kernel_cpu : 0.0; };
  auto fo = max_mean(world, own(fwd_stats)), bo = max_mean(world, own(bwd_stats));
  if (!fo.ok() || !bo.ok()) abort_job(world, internal_error("allgather of timings failed"));

  auto fw = max_mean(world, fwd_wall), fc = max_mean(world, fwd_compute), bw = max_mean(world, bwd_wall),
       bc = max_mean(world, bwd_compute);
  if (!fw.ok() || !fc.ok() || !bw.ok() || !bc.ok()) abort_job(world, internal_error("allgather of timings failed"));

  // Nothing is printed or written before this point, so a rank failing
  // here leaves no partial output.
  if (Status s = detail::fault_point(detail::FaultPoint::kOutput); !s.ok()) abort_job(world, s.error());

  // Every pool's figures, gathered on world rank 0 from the pool roots, so a
  // multi-pool run reports every pool, not pool 0 alone.
  std::string desc;
  if (pc.rank() == 0) {
    nlohmann::json d;
    std::vector<std::int64_t> tokens;
    std::size_t samples = 0;
    for (const auto& seq : *pool) {
      tokens.push_back(std::accumulate(seq.begin(), seq.end(), std::int64_t{0}));
      samples += seq.size();
    }
    d["pool"] = saved ? 0 : so.pool_index + pool_id;
    d["samples"] = samples;
    d["tokens_per_slot"] = tokens;
    if (plan) {
      d["tiles"] = plan->tiles().size();
      d["imbalance"] = plan->imbalance();
      d["comm_bytes"] = plan->comm_bytes();
    }
    desc = d.dump();
  }
  Result<std::vector<std::string>> descs = gather_strings(world, 0, desc);
  if (!descs.ok()) abort_job(world, descs.error());
  nlohmann::ordered_json report;
  std::vector<nlohmann::json> pool_info;
  if (root) {
    for (int p = 0; p < pools; ++p) pool_info.push_back(nlohmann::json::parse((*descs)[static_cast<std::size_t>(p * Wp)]));
    const std::string mode_text = saved ? fmt::format("{} (plan {})", plan_mode_name(cfg->mode), opt.plan) : opt.mode;
    if (opt.json) {
      report["ranks"] = W;
      report["pool_ranks"] = Wp;
      report["pool_size"] = P;
      report["cp"] = so.cp;
      report["mode"] = mode_text;
      report["chunks"] = cfg->chunks;
      report["seq_len"] = so.seq_len;
      report["heads_q"] = so.heads_q;
      report["heads_kv"] = so.heads_kv;
      report["head_dim"] = so.head_dim;
      report["dtype"] = so.dtype;
      report["window"] = so.window ? nlohmann::ordered_json(*so.window) : nlohmann::ordered_json(nullptr);
      report["threads"] = so.threads;
      report["source"] = so.source;
      report["length_scale"] = scale;
      report["pools"] = pool_info;
      report["forward"] = {{"wall_s", fw->first}, {"compute_max_s", fc->first}, {"compute_mean_s", fc->second}};
      report["backward"] = {{"wall_s", bw->first}, {"compute_max_s", bc->first}, {"compute_mean_s", bc->second}};
      report["executor_cpu_over_kernel_cpu"] = {{"forward", fo->first}, {"backward", bo->first}};
    } else {
      fmt::print("libra exec: {} ranks = {} pool(s) x W {} (P {} x CP {}); mode {}, M {}, L {}, h_q {}, h_kv {}, d {}, "
                 "{}, window {}, {} kernel thread(s) per rank\n",
                 W, pools, Wp, P, so.cp, mode_text, cfg->chunks, so.seq_len, so.heads_q, so.heads_kv, so.head_dim,
                 so.dtype, so.window ? std::to_string(*so.window) : std::string("full"), so.threads);
      if (scale != 1.0) fmt::print("pool source: {} with sample lengths scaled by {:.6g}\n", so.source, scale);
      for (const nlohmann::json& d : pool_info) {
        fmt::print("pool {}: {} samples, tokens per slot: {}\n", d["pool"].get<std::int64_t>(),
                   d["samples"].get<std::int64_t>(), fmt::join(d["tokens_per_slot"].get<std::vector<std::int64_t>>(), " "));
        if (d.contains("tiles")) {
          fmt::print("pool {} plan: {} tiles, intra-pool imbalance {:.4f}, exchanged {} per pass\n",
                     d["pool"].get<std::int64_t>(), d["tiles"].get<std::int64_t>(), d["imbalance"].get<double>(),
                     bytes_text(d["comm_bytes"].get<std::int64_t>()));
        }
      }
      fmt::print("forward:  wall {:.4f} s (slowest rank), kernel compute {:.4f} s slowest / {:.4f} s mean rank\n",
                 fw->first, fc->first, fc->second);
      fmt::print("backward: wall {:.4f} s (slowest rank), kernel compute {:.4f} s slowest / {:.4f} s mean rank\n",
                 bw->first, bc->first, bc->second);
      fmt::print("overhead: wall over the busiest rank's kernel time forward {:+.1f}%, backward {:+.1f}%; executor CPU "
                 "outside the kernel (thread CPU time, max over ranks) forward {:.1f}%, backward {:.1f}% of kernel CPU\n",
                 100 * (fw->first / fc->first - 1), 100 * (bw->first / bc->first - 1), 100 * fo->first, 100 * bo->first);
    }
  }

  if (!opt.trace.empty()) {
    Status ts = write_trace(world, trace, opt.trace);
    if (!ts.ok()) {
      if (root) return fail(ts.error());
      return kExitUsage;
    }
    if (root && opt.json) report["trace"] = opt.trace;
    if (root && !opt.json) {
      fmt::print("trace: {} (Chrome trace-event JSON; lanes per rank: compute, transfer, wait)\n", opt.trace);
    }
  }

  auto print_report = [&] {
    if (root && opt.json) fmt::print("{}\n", report.dump(1));
  };
  if (!opt.check) {
    print_report();
    return kExitOk;
  }

  if (dt != DType::kF32) load_all_as_f32(o16.data(), static_cast<std::int64_t>(o16.size()), dt, f->o.data());

  // Gather every home of the pool on its rank 0, which compares each slot
  // with the single-process reference on the whole sequence.
  const std::int64_t lc = so.seq_len / so.cp;
  std::vector<ErrorStats> errs(5);
  std::string which = "naive";
  Status check_status;
  {
    std::string mine;
    mine.reserve((2 * f->o.size() + f->lse.size() + 2 * g->dk.size()) * sizeof(float));
    for (const std::vector<float>* t : {&f->o, &f->lse, &g->dq, &g->dk, &g->dv}) {
      mine.append(reinterpret_cast<const char*>(t->data()), t->size() * sizeof(float));
    }
    Result<std::vector<std::string>> gathered = gather_strings(pc, 0, mine);
    if (!gathered.ok()) abort_job(world, gathered.error());
    if (pc.rank() == 0) {
      // The pool's other ranks wait for the verdict meanwhile: the kernel
      // reference may use their threads (up to the machine's).
      const int reference_threads = std::max(
          so.threads, std::min(static_cast<int>(std::thread::hardware_concurrency()), pc.size() * so.threads));
      const std::int64_t qw = so.heads_q * so.head_dim, kw = so.heads_kv * so.head_dim;
      for (int slot = 0; slot < P && check_status.ok(); ++slot) {
        const PackedSequence& seq = (*pool)[static_cast<std::size_t>(slot)];
        double work = 0;
        for (std::int64_t l : seq) work += 0.5 * static_cast<double>(l) * static_cast<double>(l);
        work *= so.heads_q * so.head_dim;
        ReferenceKind kind = ReferenceKind::kNaive;
        if (opt.reference == "kernel" || (opt.reference == "auto" && work > 2e8)) kind = ReferenceKind::kKernel;
        // One pool may mix references (auto): report the weaker one.
        if (kind == ReferenceKind::kKernel) which = "kernel";
        Result<SlotReference> ref = harness_reference(data_seed, *cfg, seq, slot, kind, reference_threads);
        if (!ref.ok()) {
          check_status = ref.error();
          break;
        }
        for (int c = 0; c < so.cp; ++c) {
          const std::string& blob = (*gathered)[static_cast<std::size_t>(slot * so.cp + c)];
          const float* base = reinterpret_cast<const float*>(blob.data());
          std::size_t off = 0;
          auto take = [&](std::int64_t n) {
            std::span<const float> s(base + off, static_cast<std::size_t>(n));
            off += static_cast<std::size_t>(n);
            return s;
          };
          const int w = slot * so.cp + c;
          errs[0].merge(compare_home(take(lc * qw), ref->o, *cfg, w, qw));
          errs[1].merge(compare_home(take(lc * so.heads_q), ref->lse, *cfg, w, so.heads_q));
          errs[2].merge(compare_home(take(lc * qw), ref->dq, *cfg, w, qw));
          errs[3].merge(compare_home(take(lc * kw), ref->dk, *cfg, w, kw));
          errs[4].merge(compare_home(take(lc * kw), ref->dv, *cfg, w, kw));
        }
      }
    }
  }
  // Pool roots hold the errors; world rank 0 (root of pool 0) collects them.
  if (Status s = agree_on_status(world, check_status, "--check reference"); !s.ok()) {
    if (root) return fail(s.error());
    return kExitUsage;
  }
  std::string stats;
  for (const ErrorStats& e : errs) stats += fmt::format("{:a} {:a} ", e.max_abs, e.max_ref);
  stats += which;
  Result<std::vector<std::string>> all_stats = gather_strings(world, 0, stats);
  if (!all_stats.ok()) abort_job(world, all_stats.error());
  int verdict = kExitOk;
  if (root) {
    const Tolerance tol = tolerance_for(cfg->shape.dtype);
    double tols[] = {tol.o, tol.lse, tol.dq, tol.dk, tol.dv};
    if (opt.check_tolerance_flag != nullptr && opt.check_tolerance_flag->count() > 0) {
      for (double& t : tols) t = opt.check_tolerance;
    }
    const char* names[] = {"O", "LSE", "dQ", "dK", "dV"};
    auto refname = [](const std::string& w) {
      return w == "kernel" ? std::string("fp32 kernel in one process") : std::string("naive fp64");
    };
    std::vector<ErrorStats> total(5);
    std::vector<std::vector<ErrorStats>> per_pool(static_cast<std::size_t>(pools), std::vector<ErrorStats>(5));
    std::vector<std::string> pool_ref(static_cast<std::size_t>(pools));
    for (int p = 0; p < pools; ++p) {
      std::istringstream in((*all_stats)[static_cast<std::size_t>(p * Wp)]);
      for (int i = 0; i < 5; ++i) {
        std::string a, b;
        in >> a >> b;
        const ErrorStats e{std::strtod(a.c_str(), nullptr), std::strtod(b.c_str(), nullptr)};
        per_pool[static_cast<std::size_t>(p)][static_cast<std::size_t>(i)] = e;
        total[static_cast<std::size_t>(i)].merge(e);
      }
      in >> pool_ref[static_cast<std::size_t>(p)];
    }
    auto within = [&](const std::vector<ErrorStats>& e, int i) { return e[static_cast<std::size_t>(i)].rel() <= tols[i]; };
    bool ok = true;
    for (int i = 0; i < 5; ++i) ok = ok && within(total, i);
    auto tensors_json = [&](const std::vector<ErrorStats>& e) {
      nlohmann::ordered_json t;
      for (int i = 0; i < 5; ++i) {
        t[names[i]] = {{"max_abs_error", e[static_cast<std::size_t>(i)].max_abs},
                       {"relative_error", e[static_cast<std::size_t>(i)].rel()},
                       {"tolerance", tols[i]},
                       {"ok", within(e, i)}};
      }
      return t;
    };
    if (opt.json) {
      nlohmann::ordered_json c;
      c["within_tolerance"] = ok;
      c["tensors"] = tensors_json(total);
      c["pools"] = nlohmann::ordered_json::array();
      for (int p = 0; p < pools; ++p) {
        c["pools"].push_back({{"pool", pool_info[static_cast<std::size_t>(p)]["pool"]},
                              {"reference", refname(pool_ref[static_cast<std::size_t>(p)])},
                              {"tensors", tensors_json(per_pool[static_cast<std::size_t>(p)])}});
      }
      report["check"] = c;
      print_report();
    } else {
      fmt::print("check ({} pool(s), every home gathered on its pool's rank 0, reference on whole sequences):\n", pools);
      for (int p = 0; p < pools && pools > 1; ++p) {
        const auto& e = per_pool[static_cast<std::size_t>(p)];
        bool pool_ok = true;
        std::string rels;
        for (int i = 0; i < 5; ++i) {
          pool_ok = pool_ok && within(e, i);
          rels += fmt::format(" {} {:.2e}", names[i], e[static_cast<std::size_t>(i)].rel());
        }
        fmt::print("  pool {} ({}): relative{}  {}\n", pool_info[static_cast<std::size_t>(p)]["pool"].get<std::int64_t>(),
                   refname(pool_ref[static_cast<std::size_t>(p)]), rels, pool_ok ? "ok" : "FAIL");
      }
      if (pools == 1) fmt::print("  reference: {}\n", refname(pool_ref[0]));
      for (int i = 0; i < 5; ++i) {
        fmt::print("  {:<4} max abs error {:.3e}  relative {:.3e}  (tolerance {:.0e})  {}\n", names[i],
                   total[static_cast<std::size_t>(i)].max_abs, total[static_cast<std::size_t>(i)].rel(), tols[i],
                   within(total, i) ? "ok" : "FAIL");
      }
      fmt::print("result: {}\n", ok ? "within tolerance" : "BEYOND TOLERANCE");
    }
    for (int i = 0; i < 5 && !ok; ++i) {
      if (within(total, i)) continue;
      std::fflush(stdout);
      fmt::print(stderr, "libra: error: --check: {} relative error {:.3e} is beyond the tolerance {:.0e} (exit status 3)\n",
                 names[i], total[static_cast<std::size_t>(i)].rel(), tols[i]);
      break;
    }
    verdict = ok ? kExitOk : kExitCheckFailed;
  }
  Result<std::vector<std::uint64_t>> verdicts = world.allgather(static_cast<std::uint64_t>(verdict));
  if (!verdicts.ok()) abort_job(world, verdicts.error());
  return static_cast<int>((*verdicts)[0]);
}
// The flag errors run_exec finds before starting any rank.
Status check_exec_flags(const ExecOptionsCli& opt, bool under_mpirun) {
  static const char* kModes[] = {"tap", "tap-split", "tap-topo", "ulysses", "ulysses-plan"};
  if (std::find_if(std::begin(kModes), std::end(kModes), [&](const char* m) { return opt.mode == m; }) == std::end(kModes)) {
    return invalid_input("--mode " + opt.mode + ": expected tap, tap-split, tap-topo, ulysses or ulysses-plan");
  }
  if (opt.repeat < 1 || opt.repeat > kMaxRepeat) {
    return invalid_input(fmt::format("--repeat {}: must be in [1, {}]", opt.repeat, kMaxRepeat));
  }
  if (!(opt.timeout > 0) || opt.timeout > 86400) {
    return invalid_input(fmt::format("--timeout {}: must be more than 0 and at most 86400 seconds", opt.timeout));
  }
  LIBRA_TRY(check_threads(opt.shape.threads));
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
    std::string given = first_plan_flag_given(opt.shape.flags);
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
  const bool several = under_mpirun || opt.ranks > 1;
  if (opt.plan.empty() && opt.shape.source == "-" && several) {
    return invalid_input("-: standard input cannot feed several ranks (each would read a different part of it); save "
                         "the pool to a file and name the file");
  }
  const bool ranks_given = opt.ranks_flag != nullptr && opt.ranks_flag->count() > 0;
  if (under_mpirun) {
    // Every process would start --ranks threads of its own: the job would
    // run (and print) once per process.
    if (ranks_given) {
      return invalid_input(fmt::format("--ranks {}: starts in-process ranks, but this is already one of the processes "
                                       "of mpirun; drop --ranks (mpirun -np sets the ranks)",
                                       opt.ranks));
    }
    return Status();
  }
  if (!ranks_given) return invalid_input("no ranks: run under mpirun -np N, or give --ranks N for N in-process ranks");
  if (opt.ranks < 1) return invalid_input(fmt::format("--ranks {}: must be at least 1", opt.ranks));
  if (opt.ranks > 256) return invalid_input(fmt::format("--ranks {}: at most 256 in-process ranks", opt.ranks));
  return Status();
}

// One MPI process's share of the job: `refused` (a flag error of this
// process) is agreed on with the others first, so that rank 0 alone prints
// it and no rank exits before it has (mpirun kills the job at the first
// nonzero exit).
int run_mpi_rank(const ExecOptionsCli* opt, const Status& refused) {
  const double timeout = opt != nullptr && refused.ok() ? opt->timeout : 300;
  if (Status s = mpi_init(); !s.ok()) {
    if (refused.ok()) return fail(s.error());
    // Without MPI the ranks cannot agree; the launcher's rank 0 prints.
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (rank == nullptr) rank = std::getenv("PMI_RANK");
    if (rank == nullptr || std::string(rank) == "0") fail(refused);
    return refused.error().code() == ErrorCode::kInternal ? kExitFailure : kExitUsage;
  }
  int rc = kExitFailure;
  {
    Result<std::unique_ptr<Communicator>> world = mpi_world(timeout);
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
  mpi_finalize();
  return rc;
}

int run_exec(const ExecOptionsCli& opt) {
  const bool mpi = under_mpirun();
  const Status flags = check_exec_flags(opt, mpi);
  if (mpi) return run_mpi_rank(&opt, flags);
  if (!flags.ok()) return fail(flags);
  g_in_process = true;
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

bool under_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

int fail_under_mpirun(const Status& error) { return run_mpi_rank(nullptr, error); }

namespace {

// ---- bench -----------------------------------------------------------------

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? 0.0 : x[x.size() / 2];
}

// Kernel seconds of worker `w` of the pool for one mode, measured alone
// through a loopback communicator (remote inputs stay zero; the kernel's
// time does not depend on the values).
Result<double> worker_seconds(const std::vector<PackedSequence>& pool, const PlanConfig& cfg, const std::optional<Plan>& plan,
                              int w, const BenchOptionsCli& opt) {
  const int W = static_cast<int>(pool.size()) * cfg.cp;
  auto comm = make_loopback_communicator(w, W);
  ExecOptions eo;
  eo.threads = opt.shape.threads;
  std::unique_ptr<Executor> ex;
  if (plan) {
    LIBRA_ASSIGN_OR_RETURN(ex, make_plan_executor(*comm, *plan, eo));
  } else {
    LIBRA_ASSIGN_OR_RETURN(ex, make_ulysses_executor(*comm, pool, cfg, eo));
  }
  const std::vector<float> q = harness_home_tensor(1, cfg, w, 0), k = harness_home_tensor(1, cfg, w, 1),
                           v = harness_home_tensor(1, cfg, w, 2), d_o = harness_home_tensor(1, cfg, w, 3);
  std::vector<double> times;
  for (int rep = 0; rep < opt.repeat; ++rep) {
    LIBRA_ASSIGN_OR_RETURN(ForwardOutputs f, ex->forward({q, k, v}));
    double t = ex->last_compute_seconds();
    if (opt.backward) {
      LIBRA_ASSIGN_OR_RETURN(BackwardOutputs g, ex->backward({q, k, v}, f, d_o));
      t += ex->last_compute_seconds();
    }
    times.push_back(t);
  }
  return median(times);
}

int run_bench(BenchOptionsCli opt) {
  ShapeOptions& so = opt.shape;
  // CPU-sized defaults scaled from the paper's setting (P = 8, CP = 8,
  // L = 1M, B = 8192, H = 8, h_q = 32, h_kv = 4, d = 128).
  PlanFlags& f = so.flags;
  if (!f.seq_len) f.seq_len = 16384;
  if (!f.cp) f.cp = 4;
  if (*f.cp < 1) return fail(invalid_input(fmt::format("--cp {}: must be at least 1", *f.cp)));
  if (so.pool_size == 0) so.pool_size = 4;
  if (so.pool_size < 1) return fail(invalid_input(fmt::format("--pool-size {}: must be at least 1", so.pool_size)));
  if (!f.block) f.block = *f.seq_len / *f.cp / 4;
  if (f.model.empty()) {
    if (!f.heads_q) f.heads_q = 8;
    if (!f.heads_kv) f.heads_kv = 2;
    if (!f.head_dim) f.head_dim = 64;
  }
  if (!f.head_shards) f.head_shards = 4;
  if (opt.pools < 1) return fail(invalid_input(fmt::format("--pools {}: must be at least 1", opt.pools)));
  if (opt.repeat < 1 || opt.repeat > kMaxRepeat) {
    return fail(invalid_input(fmt::format("--repeat {}: must be in [1, {}]", opt.repeat, kMaxRepeat)));
  }
  const char* modes[] = {"ulysses", "tap", "tap-split"};
  std::vector<PlanConfig> cfgs;
  for (const char* m : modes) {
    Result<PlanConfig> c = make_config(so, m);
    if (!c.ok()) return fail(c.error());
    cfgs.push_back(*c);
  }
  double scale = 1.0;
  Result<std::vector<PackedSequence>> all = load_scaled(so.source, so.seq_len, &scale);
  if (!all.ok()) return fail(all.error());
  const int P = so.pool_size, W = P * so.cp;
  // Every pool is checked to exist before the first measurement.
  const auto n = static_cast<std::int64_t>(all->size());
  if (so.pool_index < 0 || (so.pool_index + opt.pools) * P > n) {
    return fail(invalid_input(fmt::format("--pools {}: {} holds {} whole pool(s) of --pool-size {}{}", opt.pools, so.source,
                                          n / P, P,
                                          so.pool_index == 0 ? std::string()
                                                             : fmt::format(", {} from --pool-index {}",
                                                                           std::max<std::int64_t>(0, n / P - so.pool_index),
                                                                           so.pool_index))));
  }
  fmt::print("libra bench exec: per-worker attention compute time measured with the real kernel ({}), every worker of a "
             "pool run one after another on this machine ({} kernel thread(s)), not concurrently; straggler = slowest "
             "worker\n",
             opt.backward ? "forward + backward" : "forward", so.threads);
  fmt::print("pools: {} from {} (sample lengths x {:.6g}), L {}, P {}, CP {}, W {}, B {}, H {}, h_q {}, h_kv {}, d {}, {}, "
             "median of {} run(s)\n",
             opt.pools, so.source, scale, so.seq_len, P, so.cp, W, so.block, so.head_shards, so.heads_q, so.heads_kv,
             so.head_dim, so.dtype, opt.repeat);
  {
    // One untimed run first, so that no measured worker pays for first-touch
    // page faults and the kernel's one-time set-up.
    Result<std::vector<PackedSequence>> pool0 = draw_pool(*all, so.source, so.pool_index, P);
    if (!pool0.ok()) return fail(pool0.error());
    Result<double> warm = worker_seconds(*pool0, cfgs[0], std::nullopt, 0, opt);
    if (!warm.ok()) return fail(warm.error());
  }
  fmt::print("{:>4} {:>12} {:>12} {:>9} {:>12} {:>9} {:>10} {:>10}\n", "pool", "ulysses s", "tap s", "speedup",
             "tap-split s", "speedup", "tap R-1", "split R-1");
  std::vector<std::vector<double>> straggler(3);
  for (int k = 0; k < opt.pools; ++k) {
    Result<std::vector<PackedSequence>> pool = draw_pool(*all, so.source, so.pool_index + k, P);
    if (!pool.ok()) return fail(pool.error());
    double imb[3] = {0, 0, 0};
    for (std::size_t mi = 0; mi < 3; ++mi) {
      std::optional<Plan> plan;
      if (mi > 0) {
        Result<Plan> p = make_plan(*pool, cfgs[mi]);
        if (!p.ok()) return fail(p.error());
        plan = *p;
        imb[mi] = plan->imbalance();
      }
      double worst = 0;
      for (int w = 0; w < W; ++w) {
        Result<double> t = worker_seconds(*pool, cfgs[mi], plan, w, opt);
        if (!t.ok()) return fail(t.error());
        worst = std::max(worst, *t);
      }
      straggler[mi].push_back(worst);
    }
    const double u = straggler[0].back(), t = straggler[1].back(), s = straggler[2].back();
    fmt::print("{:>4} {:>12.4f} {:>12.4f} {:>8.2f}x {:>12.4f} {:>8.2f}x {:>10.4f} {:>10.4f}\n", so.pool_index + k, u, t,
               u / t, s, u / s, imb[1], imb[2]);
    std::fflush(stdout);
  }
  for (std::size_t mi = 1; mi < 3; ++mi) {
    double mean_speedup = 0;
    for (int k = 0; k < opt.pools; ++k) mean_speedup += straggler[0][static_cast<std::size_t>(k)] / straggler[mi][static_cast<std::size_t>(k)];
    mean_speedup /= opt.pools;
    const double worst_u = *std::max_element(straggler[0].begin(), straggler[0].end());
    const double worst_m = *std::max_element(straggler[mi].begin(), straggler[mi].end());
    fmt::print("{}: mean straggler speedup over ulysses {:.2f}x, worst-case (slowest pool vs slowest pool) {:.2f}x\n",
               modes[mi], mean_speedup, worst_u / worst_m);
  }
  fmt::print("paper (Libra vs Ulysses, GPU, 1M-token pools): 2.91x and 2.57x mean, 3.14x and 2.90x worst, for its two "
             "model configurations\n");
  return kExitOk;
}

const bool registered = register_command(70, [](CLI::App& app) {
  std::vector<Handler> handlers;
  auto* ex = app.add_subcommand("exec", "Run a pool's attention forward and backward through a distributed executor "
                                        "(under mpirun, or --ranks N in-process) and check it");
  auto eo = std::make_shared<ExecOptionsCli>();
  eo->pool_flags = add_shape_options(ex, eo->shape, false);
  eo->pool_flags.push_back(
      ex->add_option("--mode", eo->mode, "executor: tap, tap-split, tap-topo, ulysses (the baseline executor), ulysses-plan"));
  ex->add_option("--seed", eo->seed, "seed of the random Q, K, V and dO");
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

  CLI::App* bench = command_group(app, "bench", "Measure libra's components on this machine");
  auto* be = bench->add_subcommand("exec", "Per-worker kernel compute time and straggler speedups of tap and tap-split "
                                           "over ulysses on pools of a built-in corpus");
  auto bo = std::make_shared<BenchOptionsCli>();
  add_shape_options(be, bo->shape, true);
  be->add_option("--pools", bo->pools, "pools to measure (default 4)");
  be->add_flag("--backward", bo->backward, "also time the backward pass");
  be->add_option("--repeat", bo->repeat, "runs per worker; the median is used");
  handlers.push_back({be, [bo] { return run_bench(*bo); }});
  return handlers;
});

}  // namespace
}  // namespace libra::cli
