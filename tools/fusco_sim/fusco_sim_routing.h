// Routing for tools/fusco_sim: the generator moe_perf uses too (perf/moe_routing.h: the patterns,
// their skew and their flags), on a simulated cluster of `nodes` x `gpus` ranks numbered
// node-major. Its defaults are the simulator's: 8 x 8, 256 experts, top-8, real-world routing.
#pragma once

#include "moe_routing.h"

namespace fusco {
namespace sim {

using perf::Pattern;

struct SimRoutingSpec : perf::RoutingSpec {
  int nodes = 8;
  int gpus = 8;  // ranks per node
  SimRoutingSpec() { pattern = Pattern::RealWorld; }
};

// The shared router over the simulated cluster's node layout.
class SimRouter : public perf::Router {
 public:
  explicit SimRouter(const SimRoutingSpec& s)
      : perf::Router(s, perf::contiguousNodes(s.nodes, s.gpus)) {}
};

}  // namespace sim
}  // namespace fusco
