// The distributed check of the executors (harness.hpp, run_check): rank
// layout, data seeds, the runs, gathering the homes and the error
// statistics. `libra exec` keeps only its flags and printing; the tests run
// the same function.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include "core/fault.hpp"
#include "exec/harness.hpp"
#include "libra/relay.hpp"

namespace libra {
namespace {

// Plain values in and out of a byte string, in the sender's own layout:
// every rank of a job runs the same build.
template <class T>
void put(std::string& out, const T& x) {
  out.append(reinterpret_cast<const char*>(&x), sizeof(T));
}
template <class T>
T take(const std::string& in, std::size_t& at) {
  T x{};
  if (at + sizeof(T) <= in.size()) std::memcpy(&x, in.data() + at, sizeof(T));
  at += sizeof(T);
  return x;
}

std::string pack_result(const PoolResult& p) {
  std::string s;
  put(s, p.pool);
  put(s, p.samples);
  put(s, static_cast<std::int64_t>(p.tokens_per_slot.size()));
  for (std::int64_t t : p.tokens_per_slot) put(s, t);
  put(s, static_cast<std::uint8_t>(p.planned));
  put(s, p.tiles);
  put(s, p.comm_bytes);
  put(s, p.relayed_pairs);
  put(s, p.imbalance);
  for (const ErrorStats& e : p.errors) {
    put(s, e.max_abs);
    put(s, e.max_ref);
  }
  put(s, static_cast<std::uint8_t>(p.reference));
  return s;
}

PoolResult unpack_result(const std::string& s) {
  PoolResult p;
  std::size_t at = 0;
  p.pool = take<std::int64_t>(s, at);
  p.samples = take<std::int64_t>(s, at);
  p.tokens_per_slot.resize(static_cast<std::size_t>(take<std::int64_t>(s, at)));
  for (std::int64_t& t : p.tokens_per_slot) t = take<std::int64_t>(s, at);
  p.planned = take<std::uint8_t>(s, at) != 0;
  p.tiles = take<std::int64_t>(s, at);
  p.comm_bytes = take<std::int64_t>(s, at);
  p.relayed_pairs = take<std::int64_t>(s, at);
  p.imbalance = take<double>(s, at);
  for (ErrorStats& e : p.errors) {
    e.max_abs = take<double>(s, at);
    e.max_ref = take<double>(s, at);
  }
  p.reference = static_cast<ReferenceKind>(take<std::uint8_t>(s, at));
  return p;
}

Result<MaxMean> max_mean(Communicator& comm, double x) {
  std::uint64_t bits;
  std::memcpy(&bits, &x, 8);
  LIBRA_ASSIGN_OR_RETURN(std::vector<std::uint64_t> all, comm.allgather(bits));
  std::vector<double> per_rank(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) std::memcpy(&per_rank[i], &all[i], 8);
  return max_mean_of(per_rank);
}

// W ranks as pools of P x CP; the messages name the flags of `libra exec`.
Status check_layout(int W, int cp, int pool_size) {
  const int P = pool_size > 0 ? pool_size : W / cp;
  if (pool_size > 0 && W % (P * cp) != 0) {
    return invalid_input(fmt::format("{} ranks: must be a multiple of --pool-size {} x --cp {} = {} (one pool of W = "
                                     "P x CP ranks, or several side by side)",
                                     W, P, cp, P * cp));
  }
  if (pool_size <= 0 && W < cp) {
    return invalid_input(fmt::format("{} rank(s): fewer than --cp {}; one pool needs --pool-size x --cp ranks", W, cp));
  }
  if (pool_size <= 0 && W % cp != 0) {
    return invalid_input(fmt::format("{} ranks: must be a multiple of --cp {} (--pool-size defaults to ranks / cp)", W, cp));
  }
  return Status();
}

// The pool's homes gathered on its rank 0 and compared there with the
// reference of each slot; the other ranks' errors stay empty.
Status check_pool(Communicator& pc, const CheckJob& job, const PlanConfig& cfg, std::uint64_t data_seed,
                  const std::vector<PackedSequence>& pool, const ForwardOutputs& f, const BackwardOutputs& g,
                  PoolResult& out) {
  std::string mine;
  mine.reserve((2 * f.o.size() + f.lse.size() + 2 * g.dk.size()) * sizeof(float));
  for (const std::vector<float>* t : {&f.o, &f.lse, &g.dq, &g.dk, &g.dv}) {
    mine.append(reinterpret_cast<const char*>(t->data()), t->size() * sizeof(float));
  }
  Result<std::vector<std::string>> gathered = gather_strings(pc, 0, mine);
  if (!gathered.ok()) {
    if (job.on_fatal) job.on_fatal(gathered.error());
    return gathered.error();
  }
  if (pc.rank() != 0) return Status();
  const int cp = cfg.cp, hq = cfg.shape.heads_q;
  const std::int64_t lc = cfg.seq_len / cp, qw = hq * cfg.shape.head_dim, kw = cfg.shape.heads_kv * cfg.shape.head_dim;
  // The pool's other ranks wait for the verdict meanwhile: the kernel
  // reference may use their threads (up to the machine's).
  const int reference_threads =
      std::max(job.threads, std::min(static_cast<int>(std::thread::hardware_concurrency()), pc.size() * job.threads));
  for (std::size_t slot = 0; slot < pool.size(); ++slot) {
    const PackedSequence& seq = pool[slot];
    double work = 0;
    for (std::int64_t l : seq) work += 0.5 * static_cast<double>(l) * static_cast<double>(l);
    work *= hq * cfg.shape.head_dim;
    const ReferenceKind kind = job.reference.value_or(work > 2e8 ? ReferenceKind::kKernel : ReferenceKind::kNaive);
    if (kind == ReferenceKind::kKernel) out.reference = ReferenceKind::kKernel;
    LIBRA_ASSIGN_OR_RETURN(SlotReference ref,
                           harness_reference(data_seed, cfg, seq, static_cast<int>(slot), kind, reference_threads));
    const std::vector<double>* refs[] = {&ref.o, &ref.lse, &ref.dq, &ref.dk, &ref.dv};
    const std::int64_t widths[] = {qw, hq, qw, kw, kw};
    for (int c = 0; c < cp; ++c) {
      const int w = static_cast<int>(slot) * cp + c;
      const auto* at = reinterpret_cast<const float*>((*gathered)[static_cast<std::size_t>(w)].data());
      for (int i = 0; i < kCheckedTensors; ++i) {
        const auto n = static_cast<std::size_t>(lc * widths[i]);
        out.errors[static_cast<std::size_t>(i)].merge(compare_home({at, n}, *refs[i], cfg, w, widths[i]));
        at += n;
      }
    }
  }
  return Status();
}

// The pool of this rank's pool communicator, agreed on by every rank; the
// same flags may still read different files on different machines, so the
// inputs read are compared too.
Result<std::vector<PackedSequence>> agreed_pool(Communicator& world, const CheckJob& job, const CheckReport& layout,
                                                int pool_id) {
  const std::span<const PackedSequence> all = job.plan ? job.plan->pool() : job.sequences;
  Result<std::vector<PackedSequence>> drawn = draw_pool(all, job.source, job.plan ? 0 : job.first_pool + pool_id,
                                                        layout.pool_size);
  LIBRA_TRY(agree_on_status(world, drawn.status(), "libra exec"));
  std::string bytes = job.plan ? fmt::format("{:016x}", job.plan->fingerprint()) : std::string();
  for (const PackedSequence& seq : all) bytes += fmt::format("{};", fmt::join(seq, ","));
  LIBRA_TRY(agree_on_value(world, fingerprint_of(bytes), job.source + ": the inputs read differ",
                           "every rank must read the same file", ErrorCode::kInvalidInput));
  return drawn;
}

// The executor of one pool and what it runs on. Filled in place: the
// executor may keep references to the plan and the backend.
struct PoolExecutor {
  std::unique_ptr<AttentionBackend> backend;
  std::optional<Plan> made;        // the plan made from the pool, when the job has none
  const Plan* plan = nullptr;      // the plan run, if any (direct Ulysses has none)
  std::unique_ptr<Executor> exec;
};

Status make_pool_executor(Communicator& world, Communicator& pc, const CheckJob& job, const PlanConfig& cfg,
                          const std::vector<PackedSequence>& pool, PoolExecutor& out) {
  Result<std::unique_ptr<AttentionBackend>> backend = make_backend(job.backend);
  LIBRA_TRY(agree_on_status(world, backend.status(), "libra exec"));
  out.backend = std::move(*backend);
  ExecOptions eo;
  eo.threads = job.threads;
  eo.relay = job.relay;
  eo.trace = job.trace;
  eo.backend = out.backend.get();
  Result<std::unique_ptr<Executor>> ex = internal_error("no executor");
  if (job.plan) {
    ex = make_plan_executor(pc, *job.plan, eo);
  } else if (job.ulysses_direct) {
    ex = make_ulysses_executor(pc, pool, cfg, eo);
  } else if (Result<Plan> p = make_plan(pool, cfg); p.ok()) {
    out.made = std::move(*p);
    ex = make_plan_executor(pc, *out.made, eo);
  } else {
    ex = p.error();
  }
  LIBRA_TRY(agree_on_status(world, ex.status(), "libra exec"));
  out.exec = std::move(*ex);
  out.plan = job.plan ? job.plan : (out.made ? &*out.made : nullptr);
  return Status();
}

// A vector of fp32 values in `dt`'s bits (empty for fp32 itself).
std::vector<std::uint16_t> in_type(const std::vector<float>& x, DType dt) {
  std::vector<std::uint16_t> b(dt == DType::kF32 ? 0 : x.size());
  if (!b.empty()) store_all_from_f32(x.data(), static_cast<std::int64_t>(x.size()), dt, b.data());
  return b;
}

// One rank's deterministic inputs, in fp32 and in the plan's type (a bf16
// or fp16 plan gets its tensors in its own type, as a model in that type
// holds them, so the timed runs convert nothing), and its outputs. Outputs
// live in buffers kept across runs, as a training framework's caching
// allocator keeps them, so later runs time attention, not page faults.
struct RankData {
  DType dt = DType::kF32;
  std::vector<float> q, k, v, d_o;
  std::vector<std::uint16_t> q16, k16, v16, d_o16, o16;
  ForwardOutputs f;
  BackwardOutputs g;

  HomeTensor home(const std::vector<float>& x32, const std::vector<std::uint16_t>& x16) const {
    return dt == DType::kF32 ? HomeTensor(x32) : HomeTensor(x16, dt);
  }
};

RankData rank_data(const PlanConfig& cfg, std::uint64_t data_seed, int r, const Executor& exec) {
  RankData d;
  d.dt = cfg.shape.dtype;
  d.q = harness_home_tensor(data_seed, cfg, r, 0);
  d.k = harness_home_tensor(data_seed, cfg, r, 1);
  d.v = harness_home_tensor(data_seed, cfg, r, 2);
  d.d_o = harness_home_tensor(data_seed, cfg, r, 3);
  d.f = {std::vector<float>(exec.q_elements()), std::vector<float>(exec.lse_elements())};
  d.g = {std::vector<float>(exec.q_elements()), std::vector<float>(exec.kv_elements()), std::vector<float>(exec.kv_elements())};
  d.q16 = in_type(d.q, d.dt);
  d.k16 = in_type(d.k, d.dt);
  d.v16 = in_type(d.v, d.dt);
  d.d_o16 = in_type(d.d_o, d.dt);
  d.o16.assign(d.dt == DType::kF32 ? 0 : d.f.o.size(), 0);
  return d;
}

// The last run's times on this rank.
struct RunTimes {
  double fwd_wall = 0, bwd_wall = 0, fwd_compute = 0, bwd_compute = 0;
  PassStats fwd, bwd;
};

// --repeat: the executor is reused as a model reuses it across layers;
// the last run is timed and checked (earlier ones pay first-touch costs).
Result<RunTimes> timed_runs(Communicator& world, Executor& exec, RankData& d, int repeat) {
  const AttentionInputs inputs{d.home(d.q, d.q16), d.home(d.k, d.k16), d.home(d.v, d.v16)};
  const HomeOutput o_out = d.dt == DType::kF32 ? HomeOutput(d.f.o) : HomeOutput(d.o16, d.dt);
  RunTimes t;
  for (int rep = 0; rep < std::max(1, repeat); ++rep) {
    LIBRA_TRY(world.barrier());
    auto t0 = std::chrono::steady_clock::now();
    LIBRA_TRY(exec.forward_into(inputs, {o_out, d.f.lse}));
    t.fwd_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.fwd_compute = exec.last_compute_seconds();
    t.fwd = exec.last_stats();
    t0 = std::chrono::steady_clock::now();
    LIBRA_TRY(exec.backward_into(inputs, d.home(d.f.o, d.o16), d.f.lse, d.home(d.d_o, d.d_o16), {d.g.dq, d.g.dk, d.g.dv}));
    t.bwd_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.bwd_compute = exec.last_compute_seconds();
    t.bwd = exec.last_stats();
  }
  return t;
}

// Every rank's times, as the slowest and the mean over the world.
Status gather_times(Communicator& world, const RunTimes& t, CheckReport& report) {
  auto own = [](const PassStats& s) { return own_cpu_fraction(s.cpu, s.kernel_cpu); };
  for (auto [into, x] : {std::pair<MaxMean*, double>{&report.forward_wall, t.fwd_wall},
                         {&report.forward_compute, t.fwd_compute},
                         {&report.backward_wall, t.bwd_wall},
                         {&report.backward_compute, t.bwd_compute},
                         {&report.forward_own, own(t.fwd)},
                         {&report.backward_own, own(t.bwd)}}) {
    Result<MaxMean> m = max_mean(world, x);
    if (!m.ok()) return internal_error("allgather of timings failed");
    *into = *m;
  }
  return Status();
}

// The pool's sequences and, when planned, its plan's figures.
PoolResult pool_figures(const CheckJob& job, std::int64_t pool_index, const std::vector<PackedSequence>& pool,
                        const Plan* plan) {
  PoolResult mine;
  mine.pool = job.plan ? 0 : pool_index;
  for (const PackedSequence& seq : pool) {
    mine.tokens_per_slot.push_back(std::accumulate(seq.begin(), seq.end(), std::int64_t{0}));
    mine.samples += static_cast<std::int64_t>(seq.size());
  }
  if (plan) {
    mine.planned = true;
    mine.tiles = static_cast<std::int64_t>(plan->tiles().size());
    mine.imbalance = plan->imbalance();
    mine.comm_bytes = plan->comm_bytes();
    if (job.relay) mine.relayed_pairs = plan_relays(*plan).relayed_pairs();
  }
  return mine;
}

// W ranks as pools of P x CP ranks.
CheckReport report_layout(int W, const PlanConfig& cfg, const CheckJob& job) {
  CheckReport report;
  report.ranks = W;
  report.pool_size = job.pool_size > 0 ? job.pool_size : W / cfg.cp;
  report.pool_ranks = report.pool_size * cfg.cp;
  report.pools = W / report.pool_ranks;
  return report;
}

}  // namespace

Result<std::vector<PackedSequence>> draw_pool(std::span<const PackedSequence> all, const std::string& source,
                                              std::int64_t index, int P) {
  const std::int64_t first = index * P;
  if (index < 0 || first + P > static_cast<std::int64_t>(all.size())) {
    return invalid_input(fmt::format("{}: pool {} needs sequences [{}, {}) but the source has {}", source, index, first,
                                     first + P, all.size()));
  }
  return std::vector<PackedSequence>(all.begin() + first, all.begin() + first + P);
}

Result<CheckReport> run_check(Communicator& world, const CheckJob& job) {
  const PlanConfig& cfg = job.plan ? job.plan->config() : job.config;
  LIBRA_TRY(agree_on_status(world, check_layout(world.size(), cfg.cp, job.pool_size), "libra exec"));
  CheckReport report = report_layout(world.size(), cfg, job);
  const int pool_id = world.rank() / report.pool_ranks;
  LIBRA_ASSIGN_OR_RETURN(const std::vector<PackedSequence> pool, agreed_pool(world, job, report, pool_id));
  // The pool communicator: ranks numbered as the contract numbers workers.
  Result<std::unique_ptr<Communicator>> split = world.split(pool_id, world.rank());
  LIBRA_TRY(agree_on_status(world, split.status(), "libra exec"));
  Communicator& pc = **split;
  PoolExecutor ex;
  LIBRA_TRY(make_pool_executor(world, pc, job, cfg, pool, ex));

  // From here a rank's own failure may leave its peers waiting on it.
  auto fatal = [&](const Error& e) {
    if (job.on_fatal) job.on_fatal(e);
    return e;
  };
  const std::int64_t pool_index = job.first_pool + pool_id;
  const std::uint64_t data_seed = job.seed * 1000003ULL + static_cast<std::uint64_t>(pool_index);
  RankData data = rank_data(cfg, data_seed, pc.rank(), *ex.exec);
  Result<RunTimes> times = timed_runs(world, *ex.exec, data, job.repeat);
  if (!times.ok()) return fatal(times.error());
  if (Status s = gather_times(world, *times, report); !s.ok()) return fatal(s.error());

  // Nothing is printed or written before this point, so a rank failing
  // here leaves no partial output. It comes before the check, so that such
  // a failure ends the job without its peers first waiting out a reference.
  if (Status s = detail::fault_point(detail::FaultPoint::kOutput); !s.ok()) return fatal(s.error());

  PoolResult mine = pool_figures(job, pool_index, pool, ex.plan);
  if (job.check) {
    if (data.dt != DType::kF32) load_all_as_f32(data.o16.data(), static_cast<std::int64_t>(data.o16.size()), data.dt, data.f.o.data());
    Status checked = check_pool(pc, job, cfg, data_seed, pool, data.f, data.g, mine);
    // Pool roots hold the errors; every rank learns whether a reference failed.
    LIBRA_TRY(agree_on_status(world, checked, "--check reference"));
  }

  // Every pool's figures and errors, gathered on world rank 0 from the pool
  // roots as binary values.
  Result<std::vector<std::string>> results = gather_strings(world, 0, pc.rank() == 0 ? pack_result(mine) : std::string());
  if (!results.ok()) return fatal(results.error());
  if (world.rank() == 0) {
    for (int p = 0; p < report.pools; ++p) {
      report.pool_results.push_back(unpack_result((*results)[static_cast<std::size_t>(p * report.pool_ranks)]));
    }
  }
  return report;
}

}  // namespace libra
