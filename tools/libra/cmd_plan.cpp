// `libra plan`: SH-Tile placement, exchange plan and chunks of one pool;
// prints a per-worker summary or the plan's JSON and writes the plan file.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "plan_flags.hpp"
#include "libra/corpus.hpp"
#include "libra/io.hpp"
#include "libra/plan.hpp"
#include "libra/relay.hpp"

namespace libra::cli {
namespace {

struct PlanOptions {
  std::string source;
  std::string load;
  PlanFlags plan;
  std::string mode = "tap";
  bool dedup_per_kv_head = false;
  std::optional<std::int64_t> pool_size;
  std::int64_t pool_index = 0;
  bool json = false;
  std::string output;
  std::string format;
  std::vector<const CLI::Option*> pool_flags;  // --mode, --dedup-per-kv-head, --pool-size, --pool-index
  PlanTopology topology;                       // tap-topo's placement and every mode's bytes by tier
  bool relay = false;                          // append plan_relays' summary
};

// What libra::plan_relays would relay (libra exec --relay): per chunk, the
// pairs moved and the busiest NIC's cross-node input bytes before and after.
std::string relay_summary(const Plan& plan) {
  const RelayTable r = plan_relays(plan);
  std::string out = fmt::format("# relays (nodes of {} GPUs): {} (chunk, sender, receiver) pairs relayed\n",
                                plan.config().topology.gpus_per_node, r.relayed_pairs());
  for (int m = 0; m < r.chunks(); ++m) {
    std::int64_t pairs = 0;
    for (int s = 0; s < r.workers(); ++s)
      for (int t = 0; t < r.workers(); ++t) pairs += r.relayed(m, s, t);
    out += fmt::format("#   chunk {}: {} pairs; busiest NIC's cross-node input bytes {} direct, {} relayed\n", m,
                       pairs, r.busiest_nic_direct[static_cast<std::size_t>(m)],
                       r.busiest_nic_relayed[static_cast<std::size_t>(m)]);
  }
  return out;
}

std::string summary(const Plan& plan) {
  const PlanConfig& c = plan.config();
  const int W = plan.num_workers();
  std::int64_t kv = 0;
  for (const Transfer& x : plan.all_transfers()) kv += x.kind == TransferKind::kKv ? x.bytes : 0;
  std::int64_t total = 0;
  for (std::int64_t f : plan.worker_flops()) total += f;
  const double mean = static_cast<double>(total) / W;
  std::string out = fmt::format(
      "# plan mode {}{}  slots {}  cp {}  workers {}  tiles {}  block {}  head-shards {}  chunks {}{}  tau {}\n",
      plan_mode_name(c.mode),
      std::string(c.dedup_per_kv_head ? " (dedup per KV head)" : "") +
          (c.home_layout == HomeLayout::kContiguous ? "" : " (home layout " + std::string(home_layout_name(c.home_layout)) + ")") +
          (c.kv_prefix ? " (KV prefix)" : ""),
      plan.pool_size(), c.cp, W,
      plan.tiles().size(), c.block_size, c.head_shards, c.chunks,
      c.chunk_split == ChunkSplit::kEqual ? std::string() : " (" + tapered_chunks_text(c) + ")", c.tau);
  out += fmt::format("# fingerprint 0x{:016x}\n", plan.fingerprint());
  out += fmt::format("{:>6} {:>6} {:>9} {:>20} {:>9} {:>16} {:>16}\n", "worker", "tiles", "kv_groups", "flops",
                     "load/mean", "send_bytes", "recv_bytes");
  for (int r = 0; r < W; ++r) {
    const std::int64_t f = plan.worker_flops()[static_cast<std::size_t>(r)];
    out += fmt::format("{:>6} {:>6} {:>9} {:>20} {:>9.6f} {:>16} {:>16}\n", r, plan.worker_tiles(r).size(),
                       plan.worker_groups(r).size(), f, mean > 0 ? static_cast<double>(f) / mean : 0.0,
                       plan.send_bytes(r), plan.recv_bytes(r));
  }
  out += fmt::format("# imbalance {:.6f}  comm_bytes {}  (kv {}, q+o {})\n", plan.imbalance(), plan.comm_bytes(), kv,
                     plan.comm_bytes() - kv);
  return out;
}

Result<PlanConfig> config_from(const PlanOptions& o) {
  LIBRA_ASSIGN_OR_RETURN(PlanConfig c, plan_config_from(o.plan));
  auto m = parse_plan_mode(o.mode);
  if (!m.ok()) return invalid_input("--mode " + o.mode + ": must be one of tap, ulysses, tap-split, tap-topo");
  c.mode = *m;
  c.dedup_per_kv_head = o.dedup_per_kv_head;
  c.topology = o.topology;
  LIBRA_TRY(name_preset_fields(o.plan, name_chunk_flags(o.plan, c, validate_plan_config(c))));
  return c;
}

Result<Plan> plan_from_options(const PlanOptions& o) {
  if (!o.load.empty()) {
    if (!o.source.empty()) return invalid_input("--load " + o.load + ": give either a pool or --load, not both");
    std::string given = first_plan_flag_given(o.plan);
    for (const CLI::Option* f : o.pool_flags) {
      if (given.empty() && f->count() > 0) given = f->get_name();
    }
    if (!given.empty()) {
      return invalid_input("--load " + o.load + ": the saved plan fixes " + given + "; drop " + given +
                           " or plan a pool instead");
    }
    LIBRA_TRY(check_plan_path(o.load, "--load"));
    return load_plan(o.load);
  }
  if (o.source.empty()) return invalid_input("no pool given: name a POOL.jsonl (one line per slot) or --load PLAN");
  LIBRA_ASSIGN_OR_RETURN(PlanConfig c, config_from(o));
  LIBRA_ASSIGN_OR_RETURN(std::vector<PackedSequence> seqs, load_packed_sequences(o.source, c.seq_len));
  std::vector<PackedSequence> pool;
  if (o.pool_size) {
    if (*o.pool_size < 1) return invalid_input("--pool-size " + std::to_string(*o.pool_size) + ": must be at least 1");
    if (o.pool_index < 0) return invalid_input("--pool-index " + std::to_string(o.pool_index) + ": must be >= 0");
    const auto n = static_cast<std::int64_t>(seqs.size());
    if (o.pool_index >= n / *o.pool_size) {
      return invalid_input("--pool-index " + std::to_string(o.pool_index) + ": " + o.source + " holds " +
                           std::to_string(n / *o.pool_size) + " whole pools of --pool-size " +
                           std::to_string(*o.pool_size));
    }
    const auto first = seqs.begin() + o.pool_index * *o.pool_size;
    pool.assign(first, first + *o.pool_size);
  } else {
    pool = std::move(seqs);
  }
  auto plan = make_plan(pool, c);
  if (!plan.ok()) return Error(plan.error().code(), o.source + ": " + plan.error().message());
  return plan;
}

int run_plan(const PlanOptions& o) {
  if (!o.format.empty() && o.output.empty()) {
    return fail(invalid_input("--format " + o.format + ": only sets the format of -o FILE; add -o FILE (--json prints "
                              "the plan as JSON)"));
  }
  auto plan = plan_from_options(o);
  if (!plan.ok()) return fail(plan.error());
  if (!o.output.empty()) {
    PlanFileFormat format = plan_format_for_path(o.output);
    if (o.format == "json") {
      format = PlanFileFormat::kJson;
    } else if (o.format == "binary") {
      format = PlanFileFormat::kBinary;
    } else if (!o.format.empty()) {
      return fail(invalid_input("--format " + o.format + ": must be json or binary"));
    }
    if (Status s = save_plan(*plan, o.output, format); !s.ok()) return fail(s);
  }
  if (o.relay && o.json) return fail(invalid_input("--relay: adds to the text summary; not with --json (the plan file's JSON)"));
  return fail(write_file_atomic("-", o.json ? plan_to_json(*plan) : summary(*plan) + (o.relay ? relay_summary(*plan) : "")));
}

const bool registered = register_command(40, [](CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Place one pool's SH-Tiles (TAP), build the exchange plan and chunks, print or save the plan");
  sub->add_option("pool", o->source, "Packed sequences, one per slot: JSONL file (or any corpus with --pool-size)");
  sub->add_option("--load", o->load, "Load a saved plan (JSON or binary) instead of planning");
  add_plan_flags(sub, o->plan, "required unless --load");
  o->plan.instead = "--load PLAN";
  o->pool_flags = {
      sub->add_option("--mode", o->mode, "tap, ulysses, tap-split or tap-topo"),
      sub->add_flag("--dedup-per-kv-head", o->dedup_per_kv_head, "Fetch KV once per KV head instead of per head shard"),
      sub->add_option("--pool-size", o->pool_size, "Take --pool-size consecutive sequences as the pool"),
      sub->add_option("--pool-index", o->pool_index, "Which pool of --pool-size sequences"),
      // The topology: tap-topo places by it, every mode reports bytes by
      // tier with it (defaults: the simulator's h200 network).
      sub->add_option("--gpus-per-node", o->topology.gpus_per_node, "topology: GPUs per node")->capture_default_str(),
      sub->add_option("--nodes-per-supernode", o->topology.nodes_per_supernode, "topology: nodes per supernode")
          ->capture_default_str(),
      sub->add_option("--intra-node-gbps", o->topology.intra_node_gbps, "topology: NVLink GB/s per GPU")
          ->capture_default_str(),
      sub->add_option("--inter-node-gbps", o->topology.inter_node_gbps, "topology: NIC GB/s per GPU")
          ->capture_default_str(),
      sub->add_option("--inter-supernode-gbps", o->topology.inter_supernode_gbps,
                      "topology: spine share GB/s per GPU")
          ->capture_default_str(),
      sub->add_option("--congestion-per-node", o->topology.congestion_per_node,
                      "topology: NIC share 1 / (1 + c (nodes - 2)) beyond two nodes")
          ->capture_default_str(),
  };
  sub->add_flag("--json", o->json, "Print the plan as JSON instead of the per-worker summary");
  sub->add_flag("--relay", o->relay,
                "Add what libra::plan_relays relays per chunk (libra exec --relay) to the summary, by the "
                "--gpus-per-node topology");
  sub->add_option("--output,-o", o->output, "Write the plan file (.json: JSON, otherwise binary)");
  sub->add_option("--format", o->format, "Plan file format: json or binary (default: by extension)");
  return std::vector<Handler>{{sub, [o] { return run_plan(*o); }}};
});

}  // namespace
}  // namespace libra::cli
