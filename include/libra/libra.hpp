// libra/libra.hpp: the whole public API. Include the per-concept headers
// directly to keep compile times down.
#pragma once

#include "libra/checked.hpp"
#include "libra/io.hpp"
#include "libra/status.hpp"
#include "libra/workload.hpp"
