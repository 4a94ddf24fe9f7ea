// python/src/plan.cpp: the planner, plans as tables and plan files (libra/plan.hpp).
#include "binding.hpp"

#include <algorithm>
#include <limits>
#include <optional>
#include <span>

namespace libra_py {

namespace {

const char* kTileColumns[] = {"id",    "slot",  "block", "shard",  "piece",          "begin",       "end",
                              "heads_begin", "heads_end", "kv_heads_begin", "kv_heads_end", "flops",
                              "home", "worker", "fragment_begin", "fragment_end"};

py::dict tiles_table(const libra::Plan& plan) {
  Columns c;
  for (const char* n : kTileColumns) c.emplace_back(n, std::vector<I64>{});
  for (const libra::Tile& t : plan.tiles()) {
    const I64 v[] = {t.id,         t.slot,     t.block,          t.shard,        t.piece, t.begin,
                     t.end,        t.heads.begin, t.heads.end,   t.kv_heads.begin, t.kv_heads.end,
                     t.flops,      t.home,     t.worker,         t.fragment_begin, t.fragment_end};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

py::dict fragments_table(const libra::Plan& plan) {
  Columns c = {{"tile", {}}, {"slot", {}}, {"sample", {}}, {"group", {}}, {"sample_start", {}},
               {"sample_length", {}}, {"a", {}}, {"e", {}}, {"key_begin", {}}};
  for (const libra::Fragment& f : plan.fragments()) {
    const I64 v[] = {f.tile, f.slot, f.sample, f.group, f.sample_start, f.sample_length, f.a, f.e, f.key_begin};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

py::dict groups_table(const libra::Plan& plan) {
  Columns c = {{"slot", {}}, {"sample", {}}, {"key", {}}, {"kv_heads_begin", {}}, {"kv_heads_end", {}},
               {"begin", {}}, {"end", {}}};
  for (const libra::KvGroup& g : plan.groups()) {
    const I64 v[] = {g.slot, g.sample, g.key, g.kv_heads.begin, g.kv_heads.end, g.begin, g.end};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

py::dict transfers_table(std::span<const libra::Transfer> xs) {
  Columns c = {{"kind", {}}, {"src", {}}, {"dst", {}}, {"slot", {}}, {"begin", {}}, {"end", {}},
               {"heads_begin", {}}, {"heads_end", {}}, {"tile", {}}, {"group", {}}, {"bytes", {}}};
  for (const libra::Transfer& x : xs) {
    const I64 v[] = {static_cast<I64>(x.kind), x.src, x.dst, x.slot, x.begin, x.end, x.heads.begin,
                     x.heads.end, x.tile, x.group, x.bytes};
    for (std::size_t i = 0; i < c.size(); ++i) c[i].second.push_back(v[i]);
  }
  return table(std::move(c));
}

std::string dtype_of(const libra::PlanConfig& c) { return libra::dtype_name(c.shape.dtype); }

py::dict config_dict(const libra::Plan& plan) {
  const libra::PlanConfig& c = plan.config();
  py::dict o;
  o["seq_len"] = c.seq_len;
  o["cp"] = c.cp;
  o["block_size"] = c.block_size;
  o["head_shards"] = c.head_shards;
  o["heads_q"] = c.shape.heads_q;
  o["heads_kv"] = c.shape.heads_kv;
  o["head_dim"] = c.shape.head_dim;
  o["dtype"] = dtype_of(c);
  o["window"] = c.shape.window == libra::kFullCausal ? py::object(py::none()) : py::object(py::int_(c.shape.window));
  o["tau"] = c.tau;
  o["chunks"] = c.chunks;
  o["chunk_split"] = std::string(libra::chunk_split_name(c.chunk_split));
  o["mode"] = std::string(libra::plan_mode_name(c.mode));
  o["dedup_per_kv_head"] = c.dedup_per_kv_head;
  o["home_layout"] = std::string(libra::home_layout_name(c.home_layout));
  o["kv_prefix"] = c.kv_prefix;
  // tap-topo places by it; every mode's tier_bytes splits by it.
  const libra::PlanTopology& t = c.topology;
  py::dict topo;
  topo["gpus_per_node"] = t.gpus_per_node;
  topo["nodes_per_supernode"] = t.nodes_per_supernode;
  topo["intra_node_gbps"] = t.intra_node_gbps;
  topo["inter_node_gbps"] = t.inter_node_gbps;
  topo["inter_supernode_gbps"] = t.inter_supernode_gbps;
  topo["congestion_per_node"] = t.congestion_per_node;
  o["topology"] = topo;
  return o;
}

// make_plan's topology= : a mapping of any of PlanTopology's fields (the
// rest keep the h200 defaults); the planner's own checks judge the values.
libra::PlanTopology topology_from(const py::object& obj) {
  libra::PlanTopology t;
  if (obj.is_none()) return t;
  if (!py::isinstance<py::dict>(obj)) {
    bad("topology: must be a dict of gpus_per_node, nodes_per_supernode, intra_node_gbps, inter_node_gbps, "
        "inter_supernode_gbps, congestion_per_node; got a " +
        std::string(py::str(obj.get_type().attr("__name__"))));
  }
  for (const auto& [key_obj, value] : obj.cast<py::dict>()) {
    const std::string key = py::str(key_obj);
    const std::string where = "topology['" + key + "']";
    auto integer = [&](int& out) {
      if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) bad(where + ": must be an integer");
      const long long v = value.cast<long long>();
      if (v < 1 || v > std::numeric_limits<int>::max()) bad(where + " " + std::to_string(v) + ": must be in [1, 2^31)");
      out = static_cast<int>(v);
    };
    auto number = [&](double& out) {
      if (!(py::isinstance<py::int_>(value) || py::isinstance<py::float_>(value)) || py::isinstance<py::bool_>(value)) {
        bad(where + ": must be a number");
      }
      out = value.cast<double>();
    };
    if (key == "gpus_per_node") integer(t.gpus_per_node);
    else if (key == "nodes_per_supernode") integer(t.nodes_per_supernode);
    else if (key == "intra_node_gbps") number(t.intra_node_gbps);
    else if (key == "inter_node_gbps") number(t.inter_node_gbps);
    else if (key == "inter_supernode_gbps") number(t.inter_supernode_gbps);
    else if (key == "congestion_per_node") number(t.congestion_per_node);
    else {
      bad(where + ": unknown key; keys: gpus_per_node, nodes_per_supernode, intra_node_gbps, inter_node_gbps, "
          "inter_supernode_gbps, congestion_per_node");
    }
  }
  return t;
}

}  // namespace

// binding.hpp: worker r's home rows, from the plan's HomeMap.
HomeRows home_rows(const libra::Plan& plan, int r) {
  const libra::PlanConfig& c = plan.config();
  const libra::HomeMap map = c.home_map();
  const libra::PackedSequence& seq = plan.pool()[static_cast<std::size_t>(r / c.cp)];
  std::vector<I64> starts;
  I64 tokens = 0;
  for (I64 l : seq) {
    starts.push_back(tokens);
    tokens += l;
  }
  const I64 rows = map.rows();
  HomeRows h;
  std::vector<I64>&packed = h.packed, &sample = h.sample, &position = h.position, &cu = h.cu;
  packed.resize(static_cast<std::size_t>(rows));
  sample.resize(packed.size());
  position.resize(packed.size());
  cu = {0};
  I64 home_tokens = 0;
  for (I64 i = 0; i < rows; ++i) {
    const I64 x = map.packed_row(r % c.cp, i);
    packed[static_cast<std::size_t>(i)] = x;
    if (x >= tokens) {
      sample[static_cast<std::size_t>(i)] = -1;
      position[static_cast<std::size_t>(i)] = x - tokens;
      continue;
    }
    // Home rows mostly follow packed rows: the previous row's sample or the next, else a search.
    const auto in = [&](I64 k) {
      return k >= 0 && k < static_cast<I64>(starts.size()) && starts[static_cast<std::size_t>(k)] <= x &&
             (k + 1 == static_cast<I64>(starts.size()) || x < starts[static_cast<std::size_t>(k + 1)]);
    };
    const I64 prev = i > 0 ? sample[static_cast<std::size_t>(i - 1)] : -1;
    const I64 j = in(prev)       ? prev
                  : in(prev + 1) ? prev + 1
                                 : static_cast<I64>(std::upper_bound(starts.begin(), starts.end(), x) - starts.begin()) - 1;
    sample[static_cast<std::size_t>(i)] = j;
    position[static_cast<std::size_t>(i)] = x - starts[static_cast<std::size_t>(j)];
    // Padding is a suffix of every home, so token rows are [0, home_tokens).
    if (i > 0 && (sample[static_cast<std::size_t>(i - 1)] != j || packed[static_cast<std::size_t>(i - 1)] != x - 1)) {
      cu.push_back(i);
    }
    home_tokens = i + 1;
  }
  if (home_tokens > 0) cu.push_back(home_tokens);
  h.layout = std::string(libra::home_layout_name(c.home_layout));
  h.rows = rows;
  h.tokens = home_tokens;
  for (std::size_t i = 1; i < cu.size(); ++i) h.max_seqlen = std::max(h.max_seqlen, cu[i] - cu[i - 1]);
  h.packed_cu = {0};
  for (I64 l : seq) h.packed_cu.push_back(h.packed_cu.back() + l);
  return h;
}

namespace {

// home_rows (binding.hpp) as a dict of int64 arrays.
py::dict home_layout_dict(const libra::Plan& plan, int r) {
  HomeRows h = home_rows(plan, r);
  py::dict o;
  o["home_layout"] = h.layout;
  o["home_rows"] = h.rows;
  o["home_tokens"] = h.tokens;
  o["packed_rows"] = int_array(std::move(h.packed));
  o["sample"] = int_array(std::move(h.sample));
  o["position_ids"] = int_array(std::move(h.position));
  o["cu_seqlens"] = int_array(std::move(h.cu));
  return o;
}

void check_chunk(const libra::Plan& p, int m) {
  if (m < 0 || m >= p.config().chunks) {
    bad("chunk " + std::to_string(m) + ": must be in [0, " + std::to_string(p.config().chunks) + ")");
  }
}

libra::Plan plan_from_bytes(const py::bytes& b, const std::string& source) {
  std::string bytes = b;
  libra::Result<libra::Plan> r = [&] {
    py::gil_scoped_release release;
    return libra::plan_from_binary(bytes, source);
  }();
  return unwrap(std::move(r));
}

}  // namespace

void bind_plan(py::module_& m) {
  // ---- plans
  py::class_<libra::Plan>(m, "Plan")
      .def_property_readonly("fingerprint", &libra::Plan::fingerprint)
      .def_property_readonly("config", &config_dict)
      .def_property_readonly("pool_size", &libra::Plan::pool_size)
      .def_property_readonly("num_workers", &libra::Plan::num_workers)
      .def_property_readonly("head_width", &libra::Plan::head_width)
      .def_property_readonly("pool",
                             [](const libra::Plan& p) {
                               return std::vector<libra::PackedSequence>(p.pool().begin(), p.pool().end());
                             })
      .def_property_readonly("tiles", &tiles_table)
      .def_property_readonly("fragments", &fragments_table)
      .def_property_readonly("groups", &groups_table)
      .def_property_readonly("worker_flops",
                             [](const libra::Plan& p) {
                               return int_array({p.worker_flops().begin(), p.worker_flops().end()});
                             })
      .def_property_readonly("imbalance", &libra::Plan::imbalance)
      .def_property_readonly("comm_bytes", &libra::Plan::comm_bytes)
      // Per worker, the bytes its tiles read in place and what it sends and
      // receives inside its node and across nodes (config topology).
      .def_property_readonly("tier_bytes",
                             [](const libra::Plan& p) {
                               py::dict d;
                               auto col = [&](const char* name, auto field) {
                                 std::vector<I64> v;
                                 for (const libra::TierBytes& t : p.tier_bytes()) v.push_back(t.*field);
                                 d[name] = int_array(std::move(v));
                               };
                               col("kept", &libra::TierBytes::kept);
                               col("send_intra_node", &libra::TierBytes::send_intra_node);
                               col("send_cross_node", &libra::TierBytes::send_cross_node);
                               col("send_cross_supernode", &libra::TierBytes::send_cross_supernode);
                               col("recv_intra_node", &libra::TierBytes::recv_intra_node);
                               col("recv_cross_node", &libra::TierBytes::recv_cross_node);
                               col("recv_cross_supernode", &libra::TierBytes::recv_cross_supernode);
                               return d;
                             })
      .def_property_readonly("busiest_receiver", &libra::Plan::busiest_receiver)
      .def_property_readonly("max_recv_cross_node", &libra::Plan::max_recv_cross_node)
      .def_property_readonly("byte_matrix",
                             [](const libra::Plan& p) {
                               return int_array({p.byte_matrix().begin(), p.byte_matrix().end()}, p.num_workers());
                             })
      .def(
          "worker_tiles",
          [](const libra::Plan& p, int r) {
            check_worker(p, r, "worker");
            auto s = p.worker_tiles(r);
            return int_array({s.begin(), s.end()});
          },
          py::arg("worker"))
      .def(
          "worker_groups",
          [](const libra::Plan& p, int r) {
            check_worker(p, r, "worker");
            auto s = p.worker_groups(r);
            return int_array({s.begin(), s.end()});
          },
          py::arg("worker"))
      .def(
          "transfers",
          [](const libra::Plan& p, int src, int dst) {
            check_worker(p, src, "src");
            check_worker(p, dst, "dst");
            return transfers_table(p.transfers(src, dst));
          },
          py::arg("src"), py::arg("dst"))
      .def("all_transfers", [](const libra::Plan& p) { return transfers_table(p.all_transfers()); })
      .def(
          "chunk_transfers",
          [](const libra::Plan& p, int chunk, int src, int dst) {
            check_chunk(p, chunk);
            check_worker(p, src, "src");
            check_worker(p, dst, "dst");
            return transfers_table(p.chunk_transfers(chunk, src, dst));
          },
          py::arg("chunk"), py::arg("src"), py::arg("dst"))
      .def(
          "chunk_heads",
          [](const libra::Plan& p, int tile, int chunk) {
            check_chunk(p, chunk);
            if (tile < 0 || tile >= static_cast<int>(p.tiles().size())) {
              bad("tile " + std::to_string(tile) + ": must be in [0, " + std::to_string(p.tiles().size()) + ")");
            }
            libra::HeadRange h = p.chunk_heads(p.tiles()[static_cast<std::size_t>(tile)], chunk);
            return std::pair<int, int>(h.begin, h.end);
          },
          py::arg("tile"), py::arg("chunk"))
      .def(
          "save",
          [](const libra::Plan& p, const std::string& path) {
            libra::Status s = [&] {
              py::gil_scoped_release release;
              return libra::save_plan(p, path);
            }();
            check(s);
          },
          py::arg("path"))
      .def("to_json", [](const libra::Plan& p) { return libra::plan_to_json(p); })
      .def("to_bytes", [](const libra::Plan& p) { return py::bytes(libra::plan_to_binary(p)); })
      .def("__eq__", [](const libra::Plan& a, const libra::Plan& b) {
        return a.fingerprint() == b.fingerprint() && libra::plan_to_binary(a) == libra::plan_to_binary(b);
      })
      .def("__hash__", [](const libra::Plan& p) { return static_cast<py::ssize_t>(p.fingerprint() >> 1); })
      .def("__repr__",
           [](const libra::Plan& p) {
             return "<libra.Plan " + std::string(libra::plan_mode_name(p.config().mode)) + " P=" +
                    std::to_string(p.pool_size()) + " cp=" + std::to_string(p.config().cp) + " tiles=" +
                    std::to_string(p.tiles().size()) + " fingerprint=" + std::to_string(p.fingerprint()) + ">";
           })
      .def(py::pickle([](const libra::Plan& p) { return py::make_tuple(py::bytes(libra::plan_to_binary(p))); },
                      [](const py::tuple& t) {
                        if (t.size() != 1) bad("pickled libra.Plan: expected one bytes field");
                        return plan_from_bytes(t[0].cast<py::bytes>(), "pickled plan");
                      }));

  m.def(
      "make_plan",
      [](const py::object& pool, I64 seq_len, int cp, I64 block_size, int head_shards, int heads_q, int heads_kv,
         int head_dim, const std::string& dtype, std::optional<I64> window, double tau, int chunks,
         const std::string& chunk_split, const std::string& mode, bool dedup_per_kv_head, const std::string& home_layout, bool kv_prefix,
         const py::object& topology) {
        std::vector<libra::PackedSequence> seqs = to_sequences(pool, "pool");
        libra::PlanConfig c;
        c.seq_len = seq_len;
        c.cp = cp;
        c.block_size = block_size;
        c.head_shards = head_shards;
        c.shape.heads_q = heads_q;
        c.shape.heads_kv = heads_kv;
        c.shape.head_dim = head_dim;
        if (auto t = libra::parse_dtype(dtype); t.ok()) c.shape.dtype = *t;
        else bad("dtype " + dtype + ": must be bf16, fp16 or fp32");
        if (window) {
          if (*window < 1) bad("window " + std::to_string(*window) + ": must be >= 1 (None for plain causal)");
          c.shape.window = *window;
        }
        c.tau = tau;
        c.chunks = chunks;
        c.chunk_split = unwrap(libra::parse_chunk_split(chunk_split));
        c.mode = unwrap(libra::parse_plan_mode(mode));
        c.dedup_per_kv_head = dedup_per_kv_head;
        if (auto l = libra::parse_home_layout(home_layout); l.ok()) c.home_layout = *l;
        else bad("home_layout " + home_layout + ": must be contiguous or zigzag");
        c.kv_prefix = kv_prefix;
        c.topology = topology_from(topology);
        libra::Result<libra::Plan> r = [&] {
          py::gil_scoped_release release;
          return libra::make_plan(seqs, c);
        }();
        return unwrap(std::move(r));
      },
      py::arg("pool"), py::kw_only(), py::arg("seq_len"), py::arg("cp"), py::arg("block_size"),
      py::arg("head_shards"), py::arg("heads_q"), py::arg("heads_kv"), py::arg("head_dim"),
      py::arg("dtype") = "bf16", py::arg("window") = py::none(), py::arg("tau") = 0.03, py::arg("chunks") = 1,
      py::arg("chunk_split") = "equal", py::arg("mode") = "tap", py::arg("dedup_per_kv_head") = false, py::arg("home_layout") = "contiguous",
      py::arg("kv_prefix") = false, py::arg("topology") = py::none());
  m.def(
      "home_layout",
      [](const libra::Plan& plan, int worker) {
        check_worker(plan, worker, "worker");
        return home_layout_dict(plan, worker);
      },
      py::arg("plan"), py::arg("worker"));
  m.def(
      "load_plan",
      [](const std::string& path) {
        libra::Result<libra::Plan> r = [&] {
          py::gil_scoped_release release;
          return libra::load_plan(path);
        }();
        return unwrap(std::move(r));
      },
      py::arg("path"));
  m.def("plan_from_bytes", &plan_from_bytes, py::arg("data"), py::arg("source") = "plan bytes");
  m.def(
      "plan_from_json",
      [](const std::string& text, const std::string& source) { return unwrap(libra::plan_from_json(text, source)); },
      py::arg("text"), py::arg("source") = "plan json");
}

}  // namespace libra_py
