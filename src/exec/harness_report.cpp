// The report of a run (harness.hpp, "the report of a run"): the statistics
// over ranks, the check's verdict and the JSON document `libra exec --json`
// prints, for the CLI, the tests and the Python binding (python/src/report.cpp).
#include <nlohmann/json.hpp>

#include <algorithm>

#include "exec/harness.hpp"

namespace libra {

namespace {

// The run as asked for: shape, mode, chunks, source, threads.
void describe_run(nlohmann::ordered_json& out, const RunDescription& run, const CheckReport& r) {
  const PlanConfig& cfg = run.config;
  out["ranks"] = r.ranks;
  out["pool_ranks"] = r.pool_ranks;
  out["pool_size"] = r.pool_size;
  out["cp"] = cfg.cp;
  out["mode"] = run.mode;
  out["chunks"] = cfg.chunks;
  if (cfg.chunk_split != ChunkSplit::kEqual) {
    out["chunk_split"] = std::string(chunk_split_name(cfg.chunk_split));
    out["chunk_widths"] = run.chunk_widths;
  }
  out["seq_len"] = cfg.seq_len;
  out["heads_q"] = cfg.shape.heads_q;
  out["heads_kv"] = cfg.shape.heads_kv;
  out["head_dim"] = cfg.shape.head_dim;
  out["dtype"] = dtype_name(cfg.shape.dtype);
  out["window"] = cfg.shape.window != kFullCausal ? nlohmann::ordered_json(cfg.shape.window) : nlohmann::ordered_json(nullptr);
  out["threads"] = run.threads;
  out["source"] = run.source;
  out["length_scale"] = run.length_scale;
}

// Every pool's sequences and, when planned, its plan (keys in name order).
std::vector<nlohmann::json> pools_json(const RunDescription& run, const CheckReport& r) {
  std::vector<nlohmann::json> pools;
  for (const PoolResult& p : r.pool_results) {
    nlohmann::json d;
    d["pool"] = p.pool;
    d["samples"] = p.samples;
    d["tokens_per_slot"] = p.tokens_per_slot;
    if (p.planned) {
      d["tiles"] = p.tiles;
      d["imbalance"] = p.imbalance;
      d["comm_bytes"] = p.comm_bytes;
      if (run.relay) d["relayed_pairs"] = p.relayed_pairs;
    }
    pools.push_back(d);
  }
  return pools;
}

void timings_json(nlohmann::ordered_json& out, const CheckReport& r) {
  out["forward"] = {{"wall_s", r.forward_wall.max}, {"compute_max_s", r.forward_compute.max},
                    {"compute_mean_s", r.forward_compute.mean}};
  out["backward"] = {{"wall_s", r.backward_wall.max}, {"compute_max_s", r.backward_compute.max},
                     {"compute_mean_s", r.backward_compute.mean}};
  out["executor_cpu_over_kernel_cpu"] = {{"forward", r.forward_own.max}, {"backward", r.backward_own.max}};
}

nlohmann::ordered_json tensors_json(const CheckVerdict& v, const std::array<ErrorStats, kCheckedTensors>& e) {
  nlohmann::ordered_json t;
  for (int i = 0; i < kCheckedTensors; ++i) {
    const auto k = static_cast<std::size_t>(i);
    t[kCheckedTensorNames[i]] = {{"max_abs_error", e[k].max_abs},
                                 {"relative_error", e[k].rel()},
                                 {"tolerance", v.tolerance[k]},
                                 {"ok", v.within(e, i)}};
  }
  return t;
}

nlohmann::ordered_json check_json(const CheckVerdict& v, const CheckReport& r) {
  nlohmann::ordered_json c;
  c["within_tolerance"] = v.ok;
  c["tensors"] = tensors_json(v, v.total);
  c["pools"] = nlohmann::ordered_json::array();
  for (const PoolResult& p : r.pool_results) {
    c["pools"].push_back({{"pool", p.pool}, {"reference", reference_name(p.reference)}, {"tensors", tensors_json(v, p.errors)}});
  }
  return c;
}

}  // namespace

MaxMean max_mean_of(std::span<const double> per_rank) {
  MaxMean m;
  for (double v : per_rank) {
    m.max = std::max(m.max, v);
    m.mean += v;
  }
  m.mean /= static_cast<double>(per_rank.size());
  return m;
}

Tolerance uniform_tolerance(double tolerance) { return {tolerance, tolerance, tolerance, tolerance, tolerance}; }

CheckVerdict check_verdict(const CheckReport& report, const Tolerance& tolerance) {
  CheckVerdict v;
  v.tolerance = {tolerance.o, tolerance.lse, tolerance.dq, tolerance.dk, tolerance.dv};
  for (const PoolResult& p : report.pool_results) {
    for (std::size_t i = 0; i < kCheckedTensors; ++i) v.total[i].merge(p.errors[i]);
  }
  for (int i = 0; i < kCheckedTensors && v.ok; ++i) {
    if (!v.within(v.total, i)) {
      v.ok = false;
      v.first_failed = i;
    }
  }
  return v;
}

const char* reference_name(ReferenceKind kind) {
  return kind == ReferenceKind::kKernel ? "fp32 kernel in one process" : "naive fp64";
}

std::string run_report_json(const RunDescription& run, const CheckReport& report, const CheckVerdict* verdict) {
  nlohmann::ordered_json out;
  describe_run(out, run, report);
  out["pools"] = pools_json(run, report);
  timings_json(out, report);
  if (!run.trace.empty()) out["trace"] = run.trace;
  if (verdict != nullptr) out["check"] = check_json(*verdict, report);
  return out.dump(1);
}

}  // namespace libra
