// Outputs of the simulator: terminal table, JSON, CSV and the report folder
// (data files, gnuplot PNGs, index.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "libra/io.hpp"
#include "libra/simulator.hpp"
#include "sim/step_model.hpp"

namespace libra {

namespace {

std::string cand(const SimCandidate& c) { return fmt::format("P={} H={} B={}", c.pool_size, c.head_shards, c.block_size); }
double ms(double s) { return s * 1e3; }
// Several M listed: each pipelined variant ran at its best (VariantLatency::chunks).
bool chooses_m(const SimResult& r) { return r.config.chunks.size() > 1; }
std::string m_list(const SimConfig& c) {
  return fmt::format("{}", fmt::join(c.chunks, ","));
}
// The chosen M of the pipelined variants, in candidate_variants() order.
std::vector<std::pair<Variant, std::int64_t>> chosen_m(const CandidateResult& k) {
  std::vector<std::pair<Variant, std::int64_t>> out;
  for (Variant v : candidate_variants()) {
    const VariantLatency* l = k.find(v);
    if (variant_pipelined(v) && l != nullptr) out.emplace_back(v, l->chunks);
  }
  return out;
}
std::string vname(Variant v) { return std::string(variant_name(v)); }
std::string mname(PlacementMode m) { return std::string(placement_mode_name(m)); }
// A candidate's latency of `v`, or NaN when it was not timed (distca at scale).
Stat lat_of(const CandidateResult& k, Variant v) {
  const VariantLatency* l = k.find(v);
  return l == nullptr ? Stat{std::nan(""), std::nan("")} : l->seconds;
}

}  // namespace

namespace {

std::string coupling_label(std::int64_t span) { return detail::coupling_name(span); }

// The end-to-end table: throughput and efficiency at the configured
// coupling, then the speedup and ulysses' efficiency at every setting.
std::string end_to_end_table(const SimResult& r) {
  const SimConfig& c = r.config;
  std::string o = fmt::format(
      "\nEnd-to-end throughput at fixed GBS (tokens/s) and scaling efficiency: {} pipeline stage{} (1F1B), coupling "
      "{} (a coupled group of replicas waits for its slowest member per micro-batch), trained model h_kv {}\n",
      c.pp, c.pp == 1 ? "" : "s", coupling_label(c.coupling), c.trained_heads_kv > 0 ? c.trained_heads_kv : c.model.heads_kv);
  o += fmt::format("  {:>4} {:>4} {:>12} {:>7} {:>12} {:>7} {:>8} |", "DP", "P", "ulysses", "eff", "libra", "eff",
                   "speedup");
  if (!r.dp_scaling.empty()) {
    for (const CouplingPoint& k : r.dp_scaling[0].couplings) {
      o += fmt::format(" {:>16}", "coupling " + coupling_label(k.coupling));
    }
  }
  o += "\n";
  for (const auto& p : r.dp_scaling) {
    o += fmt::format("  {:>4} {:>4} {:>12.0f} {:>6.1f}% {:>12.0f} {:>6.1f}% {:>7.2f}x |", p.dp, p.pool_size,
                     p.ulysses_tokens_per_s, 100 * p.ulysses_efficiency, p.libra_tokens_per_s,
                     100 * p.libra_efficiency, p.libra_tokens_per_s / p.ulysses_tokens_per_s);
    for (const CouplingPoint& k : p.couplings) {
      o += fmt::format(" {:>6.2f}x u {:>5.1f}%", k.libra_tokens_per_s / k.ulysses_tokens_per_s,
                       100 * k.ulysses_efficiency);
    }
    o += "\n";
  }
  o += "  (per coupling: libra's speedup over ulysses and ulysses' scaling efficiency)\n";
  return o;
}

}  // namespace

namespace {

// The run's setting: corpus, model, candidates, hardware, topology, and what was skipped.
std::string table_setting(const SimResult& r) {
  const SimConfig& c = r.config;
  std::string o;
  o += fmt::format("libra simulate: {}  L={}  GBS={}  DP={}  CP={}  model {} (h_q={} h_kv={} d={} e={})\n", c.source,
                   r.seq_len, c.gbs, c.dp, c.cp, c.model.name, c.model.heads_q, c.model.heads_kv, c.model.head_dim,
                   c.model.elem_bytes);
  o += fmt::format("{} windows, {} GA steps, {} candidates, M={} chunks{}, tau={}, hardware {} (kernel '{}'), noise sigma {}\n",
                   r.windows, r.steps, r.candidates.size(), m_list(c),
                   chooses_m(r) ? " (each pipelined variant at its best M)" : "", c.tau, c.hardware, c.cost.kernel.device,
                   c.cost.noise.sigma);
  o += fmt::format("topology: {} GPUs/node at {} GB/s, {} nodes/supernode at {} GB/s, {} GB/s across supernodes{}\n",
                   c.cost.net.gpus_per_node, c.cost.net.intra_node_gbps, c.cost.net.nodes_per_supernode,
                   c.cost.net.inter_node_gbps, c.cost.net.inter_supernode_gbps,
                   c.cost.net.pxn ? ", cross-node sends routed as NCCL's PXN (--pxn)" : "");
  if (!r.distca_skipped.empty()) o += fmt::format("{}\n", r.distca_skipped);
  for (const auto& s : r.skipped) {
    o += fmt::format("skipped {}{}: {}\n", cand(s.candidate), s.chunks ? fmt::format(" M={}", s.chunks) : "", s.reason);
  }
  return o;
}

// The baselines' latencies.
std::string table_baselines(const SimResult& r) {
  std::string o;
  o += "\nCore-attention forward latency per layer per GA step (slowest GPU), ms, mean / worst over steps\n";
  o += fmt::format("  baselines: ulysses {:.3f} / {:.3f}   wlb {:.3f} / {:.3f}{}   wlb-loader {:.3f} / {:.3f}\n",
                   ms(r.ulysses.mean), ms(r.ulysses.worst), ms(r.wlb.mean), ms(r.wlb.worst),
                   r.wlb_split_samples ? fmt::format(" ({} samples cut to fit)", r.wlb_split_samples) : "",
                   ms(r.wlb_loader.mean), ms(r.wlb_loader.worst));
  o += "  (wlb: the window repacked and sorted, its heaviest sequences in GA step 0; wlb-loader: each GA step's own "
       "samples repacked in that step)\n";
  return o;
}

// One row per candidate: imbalance, bytes and every variant's latency.
std::string table_candidates(const SimResult& r) {
  std::string o;
  o += "\n";
  o += fmt::format("{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>17} {:>17} {:>17} {:>17} {:>17} {:>17}{}\n",
                   "candidate", "R-1 vrsp", "R-1 samp", "R-1 rand", "R-1 refn", "intra", "intra+", "MB/pool",
                   "tap", "tap-vrsp", "full", "plus", "distca", "topo", chooses_m(r) ? "  M full/plus/distca/topo" : "");
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& k = r.candidates[i];
    std::string name = cand(k.candidate);
    if (static_cast<std::int64_t>(i) == r.recommended) name += " *";
    if (static_cast<std::int64_t>(i) == r.runner_up) name += " +";
    o += fmt::format("{:<24} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>10.1f}", name,
                     k.inter(PlacementMode::kVrsp).mean, k.inter(PlacementMode::kSampler).mean,
                     k.inter(PlacementMode::kRandom).mean, k.inter(PlacementMode::kVrspRefine).mean,
                     k.intra_imbalance.mean, k.intra_imbalance_plus.mean, k.comm_bytes.mean / 1e6);
    for (Variant v : candidate_variants()) {
      const Stat l = lat_of(k, v);
      // A variant not timed (distca above --distca-max-gpus) says so
      // instead of printing nan/nan.
      o += std::isnan(l.mean) ? fmt::format(" {:>17}", "not timed") : fmt::format(" {:>8.3f}/{:<8.3f}", ms(l.mean), ms(l.worst));
    }
    if (chooses_m(r)) {
      std::vector<std::int64_t> m;
      for (const auto& [v, n] : chosen_m(k)) m.push_back(n);
      o += fmt::format("  {}", fmt::join(m, "/"));
    }
    o += "\n";
  }
  o += "(R-1: inter-pool imbalance, mean over windows (rand: mean of --random-seeds groupings); intra: TAP on VRSP pools; intra+: tap-split + per-KV-head dedup on\n"
       " vrsp-refine pools; MB/pool: exchanged bytes per pool per layer; latencies mean/worst ms; * recommended, + runner-up)\n";
  return o;
}

// The recommendation and its per-step decomposition (empty when none was made).
std::string table_recommendation(const SimResult& r) {
  std::string o;
  if (r.recommended >= 0) {
    o += "\nRecommendation: " + r.recommendation_reason + "\n";
    auto row = [&](const char* what, const StepDecomposition& d) {
      return fmt::format("  {:<12} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>9.3f}\n", what,
                         ms(d.total), ms(d.compute), ms(d.chunk_loss), ms(d.comm), ms(d.first_dispatch),
                         ms(d.exposed_chunks), ms(d.last_return), ms(d.workload_bound), d.recv_cross_node / 1e9);
    };
    o += fmt::format("\nPer-step decomposition of the recommended candidate, {}{} (forward, ms; noise-free):\n",
                     variant_name(r.end_to_end_variant),
                     chooses_m(r) ? fmt::format(" at M = {}", r.end_to_end_chunks) : "");
    o += fmt::format("  {:<12} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n", "", "total", "compute",
                     "chunk-", "comm", "exposed:", "exposed:", "exposed:", "workload", "X-node");
    o += fmt::format("  {:<12} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n", "", "", "", "loss", "total",
                     "first", "chunks", "last", "bound", "recv GB");
    o += row("mean step", r.mean_step);
    o += row("worst step", r.worst_step);
  }
  return o;
}

// Corpus calibration and the comparison with the paper's figures.
std::string table_calibration_and_paper(const SimResult& r) {
  const SimConfig& c = r.config;
  std::string o;
  if (!r.calibration.random.empty()) {
    o += fmt::format("\nCorpus calibration statistics over the simulated windows (GBS {}):", c.gbs);
    for (std::size_t i = 0; i < r.calibration.random.size(); ++i) {
      o += fmt::format("  P={}: random R-1 {:.4f}, vrsp R-1 {:.4f};", r.calibration.random[i].first,
                       r.calibration.random[i].second, r.calibration.vrsp[i].second);
    }
    o += "\n";
  }
  if (!r.paper.empty()) {
    o += fmt::format("\nPaper comparison: the paper's {} dataset, same setting (P=8 figures use the best P=8 candidate)\n",
                     r.paper_dataset == "1m" ? "1M" : "256K");
    o += fmt::format("  {:<9} {:<58} {:>10} {:>10}\n", "figure", "what", "paper", "libra");
    for (const auto& p : r.paper) {
      o += fmt::format("  {:<9} {:<58} {:>10.4g} {:>10.4g}{}\n", p.figure, p.what, p.paper, p.measured,
                       p.note.empty() ? std::string() : fmt::format("  ({})", p.note));
    }
  }
  return o;
}

}  // namespace

std::string sim_table(const SimResult& r) {
  std::string o = table_setting(r);
  o += table_baselines(r);
  o += table_candidates(r);
  o += table_recommendation(r);
  o += table_calibration_and_paper(r);
  for (const auto& n : r.not_comparable) o += fmt::format("Not compared: {}\n", n);
  if (!r.dp_scaling.empty()) {
    o += end_to_end_table(r);
    o += fmt::format("Microbatch forward time (x libra mean): ulysses {:.2f}..{:.2f} mean {:.2f}; libra {:.2f}..{:.2f}\n",
                     r.microbatch_ulysses.min, r.microbatch_ulysses.max, r.microbatch_ulysses.mean,
                     r.microbatch_libra.min, r.microbatch_libra.max);
  }
  return o;
}

namespace {

using J = nlohmann::ordered_json;

J stat_json(const Stat& s) { return J{{"mean", s.mean}, {"worst", s.worst}}; }

// The simulated setting, as given (the chunks list collapses to a number when one M was listed).
J config_json(const SimResult& r) {
  const SimConfig& c = r.config;
  return {{"seq_len", r.seq_len}, {"gbs", c.gbs}, {"dp", c.dp}, {"cp", c.cp},
          {"chunks", c.chunks.size() == 1 ? J(c.chunks[0]) : J(c.chunks)}, {"tau", c.tau}, {"model", c.model.name},
          {"heads_q", c.model.heads_q},
          {"heads_kv", c.model.heads_kv}, {"head_dim", c.model.head_dim}, {"elem_bytes", c.model.elem_bytes},
          {"layers", c.model.layers}, {"gpus_per_node", c.cost.net.gpus_per_node},
          {"intra_node_gbps", c.cost.net.intra_node_gbps}, {"inter_node_gbps", c.cost.net.inter_node_gbps},
          {"latency_us", c.cost.net.latency_us}, {"noise_sigma", c.cost.noise.sigma},
          {"nodes_per_supernode", c.cost.net.nodes_per_supernode},
          {"inter_supernode_gbps", c.cost.net.inter_supernode_gbps},
          {"congestion_per_node", c.cost.net.congestion_per_node}, {"hardware", c.hardware},
          {"random_seeds", c.random_seeds}, {"worst_weight", c.worst_weight},
          {"kernel_profile", c.cost.kernel.device}, {"coupling", coupling_label(c.coupling)},
          {"pp", c.pp}, {"trained_heads_kv", c.trained_heads_kv}};
}

// The step model at --dp per libra variant and coupling (tokens/s); empty when no variant has one.
J end_to_end_at_dp_json(const CandidateResult& k) {
  J steps = J::object();
  for (const auto& v : k.latency) {
    if (v.step_at_dp.empty()) continue;
    J per = J::object();
    for (const StepAtDp& st : v.step_at_dp) {
      per[coupling_label(st.coupling)] = {{"ulysses_tokens_per_s", st.ulysses_tokens_per_s},
                                          {"libra_tokens_per_s", st.libra_tokens_per_s}};
    }
    steps[vname(v.variant)] = per;
  }
  return steps;
}

// One candidate: imbalance, bytes, latencies per variant, end-to-end, and the M chosen per pipelined variant.
J candidate_json(const SimResult& r, const CandidateResult& k) {
  auto stat = stat_json;
  J e;
  e["pool_size"] = k.candidate.pool_size;
  e["head_shards"] = k.candidate.head_shards;
  e["block_size"] = k.candidate.block_size;
  J inter;
  for (const auto& [m, s] : k.inter_imbalance) inter[mname(m)] = stat(s);
  e["inter_imbalance"] = inter;
  e["inter_imbalance_lower_bound"] = stat(k.lower_bound);
  e["intra_imbalance"] = stat(k.intra_imbalance);
  e["intra_imbalance_plus"] = stat(k.intra_imbalance_plus);
  e["comm_bytes"] = stat(k.comm_bytes);
  e["comm_bytes_plus"] = stat(k.comm_bytes_plus);
  e["intra_imbalance_topo"] = stat(k.intra_imbalance_topo);
  e["max_recv_cross_node_bytes"] = stat(k.max_recv_cross_node);
  e["max_recv_cross_node_bytes_topo"] = stat(k.max_recv_cross_node_topo);
  e["home_layout_topo"] = std::string(home_layout_name(k.home_layout_topo));
  if (const VariantLatency* t = k.find(Variant::kLibraTopo)) {
    e["relay_topo"] = t->relayed;
    e["chunk_split_topo"] = std::string(chunk_split_name(t->chunk_split));
  }
  e["max_send_bytes"] = stat(k.max_send_bytes);
  e["max_recv_bytes"] = stat(k.max_recv_bytes);
  e["comm_seconds"] = stat(k.comm_seconds);
  J lat;
  for (const auto& v : k.latency) lat[vname(v.variant)] = stat(v.seconds);
  e["latency"] = lat;
  J steps = end_to_end_at_dp_json(k);
  if (!steps.empty()) e["end_to_end_at_dp"] = steps;
  if (chooses_m(r)) {
    // The M each pipelined variant's latency comes from, and every M priced.
    J chosen = J::object(), by = J::object();
    for (const auto& [v, m] : chosen_m(k)) {
      chosen[vname(v)] = m;
      J per = J::object();
      for (const auto& [mm, st] : k.find(v)->by_chunks) per[std::to_string(mm)] = stat(st);
      by[vname(v)] = per;
    }
    e["chunks"] = chosen;
    e["latency_by_chunks"] = by;
  }
  return e;
}

J decomposition_json(const StepDecomposition& d) {
  return J{{"total", d.total},
           {"compute", d.compute},
           {"chunk_loss", d.chunk_loss},
           {"comm", d.comm},
           {"exposed_first_dispatch", d.first_dispatch},
           {"exposed_chunks", d.exposed_chunks},
           {"exposed_last_return", d.last_return},
           {"workload_bound", d.workload_bound},
           {"recv_cross_node_bytes", d.recv_cross_node}};
}

// Throughput against DP, at the configured coupling and at every coupling.
J dp_scaling_json(const SimResult& r) {
  J out = J::array();
  for (const auto& p : r.dp_scaling) {
    out.push_back({{"dp", p.dp},
                   {"pool_size", p.pool_size},
                   {"ulysses_tokens_per_s", p.ulysses_tokens_per_s},
                   {"libra_tokens_per_s", p.libra_tokens_per_s},
                   {"ulysses_efficiency", p.ulysses_efficiency},
                   {"libra_efficiency", p.libra_efficiency},
                   {"couplings", J::array()}});
    for (const CouplingPoint& k : p.couplings) {
      out.back()["couplings"].push_back({{"coupling", coupling_label(k.coupling)},
                                         {"ulysses_tokens_per_s", k.ulysses_tokens_per_s},
                                         {"libra_tokens_per_s", k.libra_tokens_per_s},
                                         {"ulysses_efficiency", k.ulysses_efficiency},
                                         {"libra_efficiency", k.libra_efficiency}});
    }
  }
  return out;
}

}  // namespace

std::string sim_json(const SimResult& r) {
  auto stat = stat_json;
  J j;
  j["source"] = r.config.source;
  j["config"] = config_json(r);
  j["windows"] = r.windows;
  j["steps"] = r.steps;
  j["units"] = "latency: seconds per layer per GA step (forward core attention, slowest GPU); bytes per pool per layer";
  j["baselines"] = {{"ulysses", stat(r.ulysses)},
                    {"wlb", stat(r.wlb)},
                    {"wlb_loader", stat(r.wlb_loader)},
                    {"wlb_split_samples", r.wlb_split_samples}};
  j["candidates"] = J::array();
  for (const auto& k : r.candidates) {
    j["candidates"].push_back(candidate_json(r, k));
  }
  j["skipped"] = J::array();
  for (const auto& s : r.skipped) {
    J e = {{"pool_size", s.candidate.pool_size}, {"head_shards", s.candidate.head_shards},
           {"block_size", s.candidate.block_size}, {"reason", s.reason}};
    if (s.chunks != 0) e["chunks"] = s.chunks;  // only this M of the candidate
    j["skipped"].push_back(e);
  }
  j["recommended"] = r.recommended;
  j["recommended_variant"] = std::string(variant_name(r.recommended_variant));
  j["decomposition"] = {{"variant", std::string(variant_name(r.end_to_end_variant))},
                        {"mean_step", decomposition_json(r.mean_step)},
                        {"worst_step", decomposition_json(r.worst_step)}};
  j["end_to_end_variant"] = std::string(variant_name(r.end_to_end_variant));
  if (chooses_m(r)) j["end_to_end_chunks"] = r.end_to_end_chunks;
  j["runner_up"] = r.runner_up;
  j["recommendation"] = r.recommendation_reason;
  j["distca_skipped"] = r.distca_skipped;
  j["calibration"] = J::object();
  for (std::size_t i = 0; i < r.calibration.random.size(); ++i) {
    j["calibration"][fmt::format("P={}", r.calibration.random[i].first)] = {
        {"random", r.calibration.random[i].second}, {"vrsp", r.calibration.vrsp[i].second}};
  }
  j["paper_dataset"] = r.paper_dataset;
  j["paper"] = J::array();
  for (const auto& p : r.paper) {
    j["paper"].push_back({{"figure", p.figure}, {"what", p.what}, {"paper", p.paper}, {"measured", p.measured},
                          {"note", p.note}});
  }
  j["not_comparable"] = r.not_comparable;
  j["dp_scaling"] = dp_scaling_json(r);
  auto mb = [](const MicrobatchStats& m) { return J{{"min", m.min}, {"max", m.max}, {"mean", m.mean}}; };
  j["microbatch"] = {{"ulysses", mb(r.microbatch_ulysses)}, {"libra", mb(r.microbatch_libra)}};
  return j.dump(1) + "\n";
}

std::string sim_csv(const SimResult& r) {
  std::string o = "pool_size,head_shards,block_size";
  if (!r.candidates.empty()) {
    for (const auto& [m, s] : r.candidates[0].inter_imbalance) o += ",inter_" + mname(m);
  }
  o += ",lower_bound,intra,intra_plus,comm_bytes,comm_bytes_plus,max_send_bytes,max_recv_bytes";
  for (Variant v : candidate_variants()) o += fmt::format(",{}_mean_s,{}_worst_s", vname(v), vname(v));
  o += ",ulysses_mean_s,ulysses_worst_s,wlb_mean_s,wlb_worst_s,recommended";
  if (chooses_m(r)) {
    for (Variant v : candidate_variants()) {
      if (variant_pipelined(v)) o += fmt::format(",{}_chunks", vname(v));
    }
  }
  o += "\n";
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    const auto& k = r.candidates[i];
    o += fmt::format("{},{},{}", k.candidate.pool_size, k.candidate.head_shards, k.candidate.block_size);
    for (const auto& [m, s] : k.inter_imbalance) o += fmt::format(",{:.6g}", s.mean);
    o += fmt::format(",{:.6g},{:.6g},{:.6g},{:.0f},{:.0f},{:.0f},{:.0f}", k.lower_bound.mean, k.intra_imbalance.mean,
                     k.intra_imbalance_plus.mean, k.comm_bytes.mean, k.comm_bytes_plus.mean, k.max_send_bytes.mean,
                     k.max_recv_bytes.mean);
    for (Variant v : candidate_variants()) {
      const Stat l = lat_of(k, v);
      o += fmt::format(",{:.6g},{:.6g}", l.mean, l.worst);
    }
    o += fmt::format(",{:.6g},{:.6g},{:.6g},{:.6g},{}", r.ulysses.mean, r.ulysses.worst, r.wlb.mean, r.wlb.worst,
                     static_cast<std::int64_t>(i) == r.recommended ? 1 : 0);
    if (chooses_m(r)) {
      for (Variant v : candidate_variants()) {
        if (!variant_pipelined(v)) continue;
        const VariantLatency* l = k.find(v);
        o += l == nullptr ? std::string(",") : fmt::format(",{}", l->chunks);
      }
    }
    o += "\n";
  }
  return o;
}

namespace {

// The report's data files, in gnuplot's format.
struct ReportData {
  std::string imbalance;            // sim-imbalance.dat: R-1 against P per placement mode
  std::string bytes;                // sim-bytes.dat: exchanged bytes against P
  std::vector<std::string> modes;   // the placement modes, in the columns of sim-imbalance.dat
};

// Imbalance and bytes against P per placement mode, for the recommended (H, B).
ReportData imbalance_and_bytes(const SimResult& r) {
  const SimCandidate rec = r.recommended >= 0 ? r.candidates[static_cast<std::size_t>(r.recommended)].candidate
                                              : SimCandidate{};
  std::map<std::int64_t, const CandidateResult*> by_p;
  for (const auto& k : r.candidates) {
    if (k.candidate.head_shards == rec.head_shards && k.candidate.block_size == rec.block_size) by_p[k.candidate.pool_size] = &k;
  }
  std::string imb = "# P";
  std::vector<std::string> modes;
  if (!by_p.empty()) {
    for (const auto& [m, s] : by_p.begin()->second->inter_imbalance) {
      modes.push_back(mname(m));
      imb += fmt::format(" {}", mname(m));
    }
  }
  imb += " lower_bound intra_tap\n";
  std::string bytes = "# P tap_MB tap_plus_MB max_send_MB max_recv_MB tap_MB_per_worker\n";
  for (const auto& [p, k] : by_p) {
    imb += std::to_string(p);
    for (const auto& [m, s] : k->inter_imbalance) imb += fmt::format(" {:.6g}", s.mean);
    imb += fmt::format(" {:.6g} {:.6g}\n", k->lower_bound.mean, k->intra_imbalance.mean);
    bytes += fmt::format("{} {:.6g} {:.6g} {:.6g} {:.6g} {:.6g}\n", p, k->comm_bytes.mean / 1e6,
                         k->comm_bytes_plus.mean / 1e6, k->max_send_bytes.mean / 1e6, k->max_recv_bytes.mean / 1e6,
                         k->comm_bytes.mean / 1e6 / static_cast<double>(p * r.config.cp));
  }
  return {imb, bytes, modes};
}

std::string latency_dat(const SimResult& r) {
  std::string lat = "# candidate_index ulysses wlb";
  for (Variant v : candidate_variants()) lat += fmt::format(" {}", vname(v));
  lat += "  (mean ms)\n";
  for (std::size_t i = 0; i < r.candidates.size(); ++i) {
    lat += fmt::format("\"{}\" {:.6g} {:.6g}", cand(r.candidates[i].candidate), ms(r.ulysses.mean), ms(r.wlb.mean));
    for (Variant v : candidate_variants()) lat += fmt::format(" {:.6g}", ms(lat_of(r.candidates[i], v).mean));
    lat += "\n";
  }
  return lat;
}

std::string microbatch_dat(const SimResult& r) {
  std::string mb = "# normalised microbatch forward time: ulysses libra (sorted)\n";
  {
    auto u = r.microbatch_ulysses.values;
    auto l = r.microbatch_libra.values;
    std::sort(u.begin(), u.end());
    std::sort(l.begin(), l.end());
    const std::size_t n = std::max(u.size(), l.size());
    for (std::size_t i = 0; i < n; ++i) {
      mb += fmt::format("{} {} {}\n", i, i < u.size() ? fmt::format("{:.6g}", u[i]) : "NaN",
                        i < l.size() ? fmt::format("{:.6g}", l[i]) : "NaN");
    }
  }
  return mb;
}

std::string dp_scaling_dat(const SimResult& r) {
  std::string dps =
      "# dp pool_size ulysses_tok_s libra_tok_s ulysses_eff libra_eff ideal_tok_s (configured coupling), then "
      "ulysses_tok_s libra_tok_s uncoupled\n";
  for (const auto& p : r.dp_scaling) {
    const double ideal = r.dp_scaling.empty() ? 0
                                              : r.dp_scaling[0].libra_tokens_per_s * static_cast<double>(p.dp) /
                                                    static_cast<double>(r.dp_scaling[0].dp);
    const CouplingPoint none = p.couplings.empty() ? CouplingPoint{} : p.couplings.front();
    dps += fmt::format("{} {} {:.6g} {:.6g} {:.6g} {:.6g} {:.6g} {:.6g} {:.6g}\n", p.dp, p.pool_size,
                       p.ulysses_tokens_per_s, p.libra_tokens_per_s, p.ulysses_efficiency, p.libra_efficiency, ideal,
                       none.ulysses_tokens_per_s, none.libra_tokens_per_s);
  }
  return dps;
}

// gnuplot script: one PNG per figure, from the data files above.
std::string gnuplot_script(const std::vector<std::string>& modes) {
  std::string gp = "set terminal pngcairo size 900,560 noenhanced\nset key top right inside\nset grid\n";
  gp += "set output 'sim-imbalance.png'\nset title 'Inter-pool imbalance R-1 vs pool size (mean over windows)'\n"
        "set logscale x 2\nset logscale y 10\nset format y \"1e%L\"\nset xlabel 'pool size P'\nset ylabel 'R - 1'\nplot ";
  for (std::size_t m = 0; m < modes.size(); ++m) {
    gp += fmt::format("'sim-imbalance.dat' using 1:($" "{}" "+1e-6) with linespoints title '{}', ", m + 2, modes[m]);
  }
  gp += fmt::format("'sim-imbalance.dat' using 1:(${}+1e-6) with lines dt 2 title 'lower bound'\n", modes.size() + 2);
  // Every later plot has plain linear labels: the decade format above must not leak.
  gp += "unset logscale\nset format y \"% h\"\nset logscale x 2\nset logscale y\nset key top left inside\n";
  gp += "set output 'sim-bytes.png'\nset title 'Exchanged bytes per pool per layer vs pool size'\nset ylabel 'MB'\n"
        "plot 'sim-bytes.dat' using 1:2 with linespoints title 'tap (VRSP pools)', "
        "'sim-bytes.dat' using 1:3 with linespoints title 'tap-split + per-KV-head dedup', "
        "'sim-bytes.dat' using 1:4 with linespoints title 'busiest worker send', "
        "'sim-bytes.dat' using 1:5 with linespoints title 'busiest worker receive', "
        "'sim-bytes.dat' using 1:6 with linespoints title 'mean per worker (tap)'\n";
  gp += "unset logscale\nset output 'sim-microbatch.png'\nset title 'Per-microbatch forward time (x Libra mean), sorted'\n"
        "set xlabel 'microbatch rank'\nset ylabel 'normalised time'\nset logscale y\n"
        "plot 'sim-microbatch.dat' using 1:2 with lines title 'ulysses', 'sim-microbatch.dat' using 1:3 with lines "
        "title 'libra-full'\nunset logscale\n";
  gp += "set output 'sim-dp-scaling.png'\nset title 'Throughput vs DP at fixed GBS'\nset logscale x 2\nset key top left inside\n"
        "set xlabel 'DP'\nset ylabel 'tokens/s'\n"
        "plot 'sim-dp-scaling.dat' using 1:3 with linespoints title 'ulysses, configured coupling', 'sim-dp-scaling.dat' "
        "using 1:4 with linespoints title 'libra (end-to-end variant), configured coupling', 'sim-dp-scaling.dat' using "
        "1:8 with linespoints dt 3 title 'ulysses, uncoupled replicas', "
        "'sim-dp-scaling.dat' using 1:9 with linespoints dt 3 title 'libra, uncoupled replicas', "
        "'sim-dp-scaling.dat' using 1:7 with lines dt 2 title 'ideal (libra)'\n"
        "unset logscale\n";
  gp += "set output 'sim-latency.png'\nset title 'Core-attention forward latency per layer-step (mean)'\n"
        "set key outside right\nset style data histograms\nset style fill solid 0.8\nset xtics rotate by -60\nset ylabel 'ms'\nset yrange [0:*]\n"
        "set xlabel ''\nplot 'sim-latency.dat' using 2:xtic(1) title 'ulysses', '' using 3 title 'wlb', "
        "'' using 4 title 'libra-tap', '' using 5 title 'libra-tap-vrsp', '' using 6 title 'libra-full', "
        "'' using 7 title 'libra-plus', '' using 8 title 'distca', '' using 9 title 'libra-topo'\n";
  return gp;
}

std::string index_md(const SimResult& r, bool plotted) {
  std::string md = "# libra simulate report\n\n";
  md += fmt::format("Corpus `{}`, L = {}, GBS = {}, DP = {}, CP = {}, model {}; {} windows, {} GA steps.\n\n",
                    r.config.source, r.seq_len, r.config.gbs, r.config.dp, r.config.cp, r.config.model.name, r.windows,
                    r.steps);
  if (r.recommended >= 0) md += "**Recommendation:** " + r.recommendation_reason + "\n\n";
  md += plotted ? "" : "(The figures below were not rendered (gnuplot missing or failed); render them with "
                       "`gnuplot sim-plots.gp` in this directory.)\n\n";
  md += "## Inter-pool imbalance vs P (paper figures 4 and 8)\n\n![imbalance](sim-imbalance.png)\n\n";
  md += "## Exchanged bytes vs P (paper figure 14)\n\n![bytes](sim-bytes.png)\n\n";
  md += "## Core-attention latency per candidate (paper section 8.4)\n\n![latency](sim-latency.png)\n\n";
  md += "## Per-microbatch forward time (paper section 8.3)\n\n![microbatch](sim-microbatch.png)\n\n";
  md += "## Throughput vs DP at fixed GBS (paper section 8.2)\n\n![dp scaling](sim-dp-scaling.png)\n\n";
  md += "## Full table\n\n```\n" + sim_table(r) + "```\n";
  return md;
}

}  // namespace

Status write_sim_report(const SimResult& r, const std::string& dir, bool rendered) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return io_error(fmt::format("--report {}: cannot create directory: {}", dir,
                                ec ? ec.message() : std::string("a file of that name exists")));
  }
  auto put = [&](const std::string& name, const std::string& text) {
    return write_file_atomic(dir + "/" + name, text);
  };
  const ReportData data = imbalance_and_bytes(r);
  LIBRA_TRY(put("sim-imbalance.dat", data.imbalance));
  LIBRA_TRY(put("sim-bytes.dat", data.bytes));
  LIBRA_TRY(put("sim-latency.dat", latency_dat(r)));
  LIBRA_TRY(put("sim-microbatch.dat", microbatch_dat(r)));
  LIBRA_TRY(put("sim-dp-scaling.dat", dp_scaling_dat(r)));
  LIBRA_TRY(put("sim-plots.gp", gnuplot_script(data.modes)));
  LIBRA_TRY(put("index.md", index_md(r, rendered)));
  LIBRA_TRY(put("result.json", sim_json(r)));
  LIBRA_TRY(put("result.csv", sim_csv(r)));
  return {};
}

}  // namespace libra
