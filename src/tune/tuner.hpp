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
#include <vector>

#include "common/status.hpp"
#include "plan/plan.hpp"
#include "tune/cost_model.hpp"

namespace chorus::tune {

struct Choice {
  const plan::Algorithm* algo = nullptr;
  uint64_t chunk_bytes = 0;    // 0 = no chunking
  double predicted_s = -1;     // the cost model's time for the priced size (< 0: not priced)
};

// What the tuner knows about the communicator's links.
// The pipeline slice between ranks of one machine over TCP
// (CHORUS_TRANSPORT=tcp): the kernel copies both ends on the same cores, and
// slices below the TCP clear-to-send threshold go eagerly; 2-rank loopback
// allreduce of 4 / 16 / 64 MiB took 0.90-0.93 / 5.3-5.5 / 21.4 ms in 128 KiB
// slices against 1.4 / 6.8-7.1 / 27.4-27.8 ms in 1 MiB ones
// (docs/performance.md).  The tuner's choice for such communicators; the
// plans' own defaults (one host, across hosts) are plan::kChunkBytes*.
constexpr uint64_t kChunkBytesLoopback = 128u << 10;
// The slice of a compressed call across hosts, in wire bytes (its fp32 slice
// is 2x that for bf16, ~4x for fp8).  The compressed allreduce forwards the
// owners' quantized sums around a ring, n - 1 hops a slice must take one after
// another, so a block is cut in several slices for the hops to overlap: 4
// hosts x 1 rank at 1 Gbit/s, 4 MiB bf16 1.51-1.93x the uncompressed call in
// the across-hosts 1 MiB fp32 slices (one per block), 1.93-2.04x in 256 KiB
// ones; fp8 in 256 KiB fp32 slices (64 KiB on the wire) fell to 2.64-2.77x at
// 8 MiB in one repeat of three, twice (docs/algorithms.md, "Compressed
// reductions").  One rank per host only: on 2 hosts x 2 ranks the
// hierarchical plan's bf16 calls fell to 0.84-0.89x in some repeats with
// 256 KiB slices (1.80-2.16x with 1 MiB).
constexpr uint64_t kWireSliceCompressed = 128u << 10;

struct Topology {
  int nranks = 1;
  int local_ranks = 1;       // ranks of this rank's host group (joined by a host-local transport)
  bool all_local = true;     // every peer in this rank's host group
  std::vector<int> host_of;  // host group of every rank (equal = a host-local transport joins them)
  bool one_machine = true;   // every rank on this machine (a network transport, if any, is loopback)
  Links links;               // the transports within and between host groups (the profile's link keys)
};

class Tuner {
 public:
  // Parses overrides (spec = CHORUS_ALGO's value); unknown collectives or
  // algorithm names are errors naming them and listing the valid ones.
  static Result<Tuner> create(const plan::Registry& registry, Topology topo, std::string_view spec,
                              uint64_t chunk_bytes_override, CostProfile profile = {});

  // The algorithm for shape (shape.chunk_elems is ignored): the CHORUS_ALGO
  // override, else the cheapest candidate under the cost model, cached per
  // (collective, power-of-two size class, in place).  Not thread-safe: the
  // communicator calls it from its one executing thread.
  Result<Choice> choose(const plan::Shape& shape, chorusDataType_t dtype);

  // The model's time for algo on shape (shape.chunk_elems as given), in
  // seconds: a plain double, as the communicator's predictions and traces
  // take it.
  Result<double> price(const plan::Algorithm& algo, const plan::Shape& shape, chorusDataType_t dtype) const;
  [[nodiscard]] const CostProfile& profile() const { return profile_; }
  [[nodiscard]] const Topology& topology() const { return topo_; }
  [[nodiscard]] const plan::Registry& registry() const { return *registry_; }
  // The CHORUS_ALGO override of collective c, or nullptr.
  [[nodiscard]] const plan::Algorithm* forced(plan::Collective c) const { return forced_[static_cast<size_t>(c)]; }

 private:
  Tuner(const plan::Registry& registry, Topology topo) : registry_(&registry), topo_(topo) {}
  [[nodiscard]] const plan::Algorithm* defaultFor(const plan::Shape& shape) const;
  [[nodiscard]] uint64_t defaultChunk() const;

  struct Defaults {
    std::array<const plan::Algorithm*, plan::kNumCollectives> by_coll{};  // kCollectiveFacts' default_algo
    const plan::Algorithm *rd_allreduce = nullptr, *binomial_bcast = nullptr, *rd_allgather = nullptr;  // small messages
  };
  Defaults defaults_{};

  const plan::Registry* registry_;
  Topology topo_;
  std::array<const plan::Algorithm*, plan::kNumCollectives> forced_{};
  // Forced by a plan file (`coll:file:PATH`): a call the plan does not take is an error, not the tuner's.
  std::array<bool, plan::kNumCollectives> strict_{};
  uint64_t chunk_override_ = 0;
  bool hosts_of_one_rank_ = false;  // every rank on a host of its own (the same on every rank)
  CostProfile profile_;
  struct Key {
    uint8_t coll;
    uint8_t size_class;
    bool inplace;
    uint8_t dtype;
    uint8_t wire = 0;  // 0: uncompressed; else 1 + Shape::wire's kind (formats price differently)
    uint8_t exact_words = 0;  // Shape::exact_words (exact calls take exact plans only)
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return (size_t{k.exact_words} << 40) | (size_t{k.wire} << 32) | (size_t{k.coll} << 24) | (size_t{k.size_class} << 16) |
             (size_t{k.inplace} << 8) | k.dtype;
    }
  };
  std::unordered_map<Key, Choice, KeyHash> cache_;
};

}  // namespace chorus::tune
