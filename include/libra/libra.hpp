// libra/libra.hpp: the whole public API, in data-flow order. Including the
// per-concept headers directly keeps compile times down.
//
//   #include "libra/libra.hpp"
//   auto seqs = libra::load_packed_sequences("builtin:paper-1m", std::nullopt);
//   auto window = libra::sequence_workloads(std::span(*seqs).first(128));
//   auto pools = libra::place_window(*window, {.pool_size = 8});
//   // ... make_plan(pool, config) per pool, then execute or simulate it.
#pragma once

// core: errors, exact arithmetic, workload model, files
#include "libra/checked.hpp"
#include "libra/dtype.hpp"
#include "libra/io.hpp"
#include "libra/status.hpp"
#include "libra/workload.hpp"
// corpus -> packing
#include "libra/corpus.hpp"
#include "libra/packing.hpp"
// sequence placement (VRSP)
#include "libra/placement.hpp"
#include "libra/sampler.hpp"
// tile placement, exchange plan, chunks (TAP)
#include "libra/plan.hpp"
// execution
#include "libra/attention_reference.hpp"
#include "libra/backend.hpp"
#include "libra/comm.hpp"
#include "libra/executor.hpp"
#include "libra/relay.hpp"
#include "libra/schedule.hpp"
#include "libra/kernel.hpp"
// simulation
#include "libra/cost_model.hpp"
#include "libra/simulator.hpp"
