// The wlb baseline's repacker and the simulator's JSON config file.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "libra/simulator.hpp"

namespace libra {

Result<WlbRepack> wlb_repack(std::span<const PackedSequence> window, std::int64_t seq_len, std::int64_t count) {
  if (seq_len < 1) return invalid_input(fmt::format("wlb repack: seq_len {} must be positive", seq_len));
  if (count < 1) return invalid_input(fmt::format("wlb repack: sequence count {} must be positive", count));
  std::vector<std::int64_t> samples;
  for (const auto& s : window) {
    for (std::int64_t l : s) {
      if (l < 1) return invalid_input(fmt::format("wlb repack: sample length {} must be positive", l));
      samples.push_back(l);
    }
  }
  std::vector<std::size_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return samples[a] > samples[b]; });
  WlbRepack out;
  const auto n = static_cast<std::size_t>(count);
  out.sequences.resize(n);
  std::vector<std::int64_t> room(n, seq_len);
  // F stays exact: every sequence holds at most seq_len tokens, and the
  // corpus stage already bounds seq_len^2 within int64.
  std::vector<std::int64_t> load(n, 0);
  for (std::size_t i : order) {
    std::int64_t l = samples[i];
    // Least F among sequences with room (ties: lowest index). Sequences are
    // few (GBS), so a linear scan is simplest and exact.
    std::size_t best = n;
    for (std::size_t k = 0; k < n; ++k) {
      if (room[k] >= l && (best == n || load[k] < load[best])) best = k;
    }
    if (best != n) {
      out.sequences[best].push_back(l);
      room[best] -= l;
      load[best] += l * l;
      continue;
    }
    // Fits nowhere: cut it, filling the sequences with the most room first.
    ++out.split_samples;
    while (l > 0) {
      const std::size_t k = static_cast<std::size_t>(std::max_element(room.begin(), room.end()) - room.begin());
      if (room[k] == 0) {
        return invalid_input(fmt::format("wlb repack: the window's tokens exceed {} sequences of {} tokens", count,
                                         seq_len));
      }
      const std::int64_t piece = std::min(l, room[k]);
      out.sequences[k].push_back(piece);
      room[k] -= piece;
      load[k] += piece * piece;
      l -= piece;
    }
  }
  return out;
}

namespace {

Result<std::vector<std::int64_t>> int_list(const nlohmann::json& v, const std::string& where) {
  std::vector<std::int64_t> out;
  if (v.is_number_integer()) {
    out.push_back(v.get<std::int64_t>());
    return out;
  }
  if (!v.is_array() || v.empty()) return invalid_input(where + ": must be an integer or a non-empty array of integers");
  for (const auto& x : v) {
    if (!x.is_number_integer()) return invalid_input(where + ": must be an integer or a non-empty array of integers");
    out.push_back(x.get<std::int64_t>());
  }
  return out;
}

}  // namespace

Status apply_sim_config_json(std::string_view text, const std::string& name, SimConfig& c) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid_input(name + ": not a JSON object (simulator config)");
  // "model" first, so that explicit head counts in the same file override it.
  if (j.contains("model")) {
    if (!j["model"].is_string()) return invalid_input(name + ": \"model\" must be a preset name");
    auto m = model_preset(j["model"].get<std::string>());
    if (!m.ok()) return invalid_input(name + ": " + m.error().message());
    c.model = *m;
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    const std::string where = name + ": \"" + key + "\"";
    auto integer = [&](std::int64_t& dst) -> Status {
      if (!v.is_number_integer()) return invalid_input(where + ": must be an integer");
      dst = v.get<std::int64_t>();
      return {};
    };
    auto number = [&](double& dst) -> Status {
      if (!v.is_number()) return invalid_input(where + ": must be a number");
      dst = v.get<double>();
      return {};
    };
    auto list = [&](std::vector<std::int64_t>& dst) -> Status {
      LIBRA_ASSIGN_OR_RETURN(dst, int_list(v, where));
      return {};
    };
    Status s;
    if (key == "model") continue;
    if (key == "source") {
      if (!v.is_string()) return invalid_input(where + ": must be a string");
      c.source = v.get<std::string>();
    } else if (key == "seq_len") s = integer(c.seq_len);
    else if (key == "gbs") s = integer(c.gbs);
    else if (key == "dp") s = integer(c.dp);
    else if (key == "cp") s = integer(c.cp);
    else if (key == "heads_q") s = integer(c.model.heads_q);
    else if (key == "heads_kv") s = integer(c.model.heads_kv);
    else if (key == "head_dim") s = integer(c.model.head_dim);
    else if (key == "elem_bytes") s = integer(c.model.elem_bytes);
    else if (key == "layers") s = integer(c.model.layers);
    else if (key == "active_params") s = number(c.model.active_params);
    else if (key == "grad_bytes_per_gpu") s = number(c.model.grad_bytes_per_gpu);
    else if (key == "pool_sizes" || key == "pool_size") s = list(c.pool_sizes);
    else if (key == "head_shards") s = list(c.head_shards);
    else if (key == "block_sizes" || key == "block_size") s = list(c.block_sizes);
    else if (key == "scaling_dp") s = list(c.scaling_dp);
    else if (key == "chunks") s = integer(c.chunks);
    else if (key == "tau") s = number(c.tau);
    else if (key == "windows") s = integer(c.max_windows);
    else if (key == "threads") s = integer(c.threads);
    else if (key == "seed") {
      if (!v.is_number_unsigned()) return invalid_input(where + ": must be a non-negative integer");
      c.seed = v.get<std::uint64_t>();
    } else if (key == "gpus_per_node") s = integer(c.cost.net.gpus_per_node);
    else if (key == "intra_node_gbps") s = number(c.cost.net.intra_node_gbps);
    else if (key == "inter_node_gbps") s = number(c.cost.net.inter_node_gbps);
    else if (key == "latency_us") s = number(c.cost.net.latency_us);
    else if (key == "noise_sigma") s = number(c.cost.noise.sigma);
    else if (key == "noise_seed") {
      if (!v.is_number_unsigned()) return invalid_input(where + ": must be a non-negative integer");
      c.cost.noise.seed = v.get<std::uint64_t>();
    } else if (key == "linear_tflops") s = number(c.cost.step.linear_tflops);
    else if (key == "comment") continue;
    else return invalid_input(where + ": unknown key");
    if (!s.ok()) return s;
  }
  return {};
}

}  // namespace libra
