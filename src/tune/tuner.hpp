// Algorithm selection.
//
// For every call the tuner picks an algorithm and a pipeline chunk size from
// the communicator's registry: CHORUS_ALGO overrides first (NCCL_ALGO-style,
// "allreduce:ring;allgather:recursive_doubling"), then the cost model's
// choice.  Choices are cached per (collective, size class).
#pragma once

#include <array>
#include <string>
#include <unordered_map>

#include "common/status.hpp"
#include "plan/plan.hpp"

namespace chorus::tune {

struct Choice {
  const plan::Algorithm* algo = nullptr;
  uint64_t chunk_bytes = 0;  // 0 = no chunking
};

// What the tuner knows about the communicator's links.
struct Topology {
  int nranks = 1;
  int local_ranks = 1;       // ranks on this host (shared memory)
  bool all_local = true;     // every peer reachable over shared memory
};

class Tuner {
 public:
  // Parses overrides (spec = CHORUS_ALGO's value); unknown collectives or
  // algorithm names are errors naming them and listing the valid ones.
  static Result<Tuner> create(const plan::Registry& registry, Topology topo, std::string_view spec,
                              uint64_t chunk_bytes_override);

  // The algorithm for shape (shape.chunk_elems is ignored).
  Result<Choice> choose(const plan::Shape& shape) const;

 private:
  Tuner(const plan::Registry& registry, Topology topo) : registry_(&registry), topo_(topo) {}

  const plan::Registry* registry_;
  Topology topo_;
  std::array<const plan::Algorithm*, plan::kNumCollectives> forced_{};
  uint64_t chunk_override_ = 0;
};

}  // namespace chorus::tune
