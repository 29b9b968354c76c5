// Plans: what a collective algorithm does, written once, read by four
// consumers (DESIGN.md): the executor runs a rank's part, the verifier
// executes all ranks' parts symbolically, the tuner and the simulator price it.
//
// Vocabulary
//  - Shape: everything about a call that the steps depend on — collective,
//    rank count, counts, element size, root, in-place — and no pointers.
//  - Program: one rank's part of a plan: a list of Steps over Regions of three
//    buffers (the call's input, its output, and plan-private scratch), with
//    the true data dependencies between steps.  Regions are in elements.
//  - Algorithm: a self-describing value (name, collective, constraints) that
//    generates the Program of any rank for a Shape.  Generating one rank's
//    program costs O(its own steps), never O(ranks x steps), which is what
//    keeps a 131,072-rank ring a few patterned rounds for the simulator.
//
// Matching rule every algorithm relies on: messages between an ordered pair of
// ranks are matched in program order (the transports are FIFO per pair), so a
// rank's i-th Send to p pairs with p's i-th Recv from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.hpp"

namespace chorus::plan {

enum class Collective : uint8_t {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  AllGatherV,
  AllToAllV,
  Gather,
  Scatter,
  SendRecv,  // chorusSend/chorusRecv (groups of point-to-point operations)
  Barrier,
};
constexpr int kNumCollectives = 12;
std::string_view collectiveName(Collective c);  // "allreduce", "reducescatter", ...
bool parseCollective(std::string_view name, Collective* out);
// Whether the collective combines values (needs a reduction op).
constexpr bool reduces(Collective c) {
  return c == Collective::AllReduce || c == Collective::Reduce || c == Collective::ReduceScatter;
}

// Buffers a step can address.  Values from kFirstUserBuf on name further user
// buffers of a group (the k-th point-to-point buffer is kFirstUserBuf + k).
enum class Buf : uint8_t { Input = 0, Output = 1, Scratch = 2 };
constexpr int kFirstUserBuf = 3;
constexpr Buf userBuf(int k) { return static_cast<Buf>(kFirstUserBuf + k); }

struct Region {
  Buf buf = Buf::Input;
  uint64_t offset = 0;  // elements
  uint64_t count = 0;   // elements
  [[nodiscard]] uint64_t end() const { return offset + count; }
  [[nodiscard]] bool overlaps(const Region& o) const {
    return buf == o.buf && count != 0 && o.count != 0 && offset < o.end() && o.offset < end();
  }
};

enum class StepOp : uint8_t {
  Send,        // send src to peer
  Recv,        // receive from peer into dst
  RecvReduce,  // receive from peer x; dst = src (op) x
  Copy,        // dst = src (local)
  Reduce,      // dst = src (op) src2 (local)
};

struct Step {
  StepOp op = StepOp::Copy;
  int32_t peer = -1;
  Region dst;   // Recv, RecvReduce, Copy, Reduce
  Region src;   // Send, RecvReduce (accumulator), Copy, Reduce
  Region src2;  // Reduce
};

// Everything a plan depends on.  For the v-collectives the arrays are this
// rank's view (allgatherv: every rank's count and displacement; alltoallv:
// this rank's send and receive counts/displacements per peer).
struct Shape {
  Collective coll = Collective::AllReduce;
  int nranks = 1;
  // allreduce/broadcast/reduce: the count; allgather/gather: the per-rank send
  // count; reducescatter/scatter: the per-rank receive count; alltoall: the
  // count per peer.
  uint64_t count = 0;
  uint32_t elem_size = 4;
  int root = 0;
  bool inplace = false;
  uint64_t chunk_elems = 0;  // pipeline granularity; 0 = one chunk
  std::span<const size_t> counts, displs;    // allgatherv (recv side); alltoallv send side
  std::span<const size_t> counts2, displs2;  // alltoallv receive side

  // Elements of the input and output buffers this rank must provide.
  [[nodiscard]] uint64_t inputElems(int rank) const;
  [[nodiscard]] uint64_t outputElems(int rank) const;
};

// One rank's part of a plan, with its dependency graph.
struct Program {
  int rank = 0;
  std::vector<Step> steps;
  // Step i waits for steps deps[dep_begin[i] .. dep_begin[i+1]).
  std::vector<uint32_t> dep_begin;
  std::vector<uint32_t> deps;
  // Reverse edges (CSR): succ[succ_begin[i] .. succ_begin[i+1]) wait for i.
  std::vector<uint32_t> succ_begin;
  std::vector<uint32_t> succ;
  uint64_t scratch_elems = 0;

  [[nodiscard]] size_t size() const { return steps.size(); }
  [[nodiscard]] std::span<const uint32_t> depsOf(size_t i) const {
    return {deps.data() + dep_begin[i], deps.data() + dep_begin[i + 1]};
  }
  [[nodiscard]] std::span<const uint32_t> succOf(size_t i) const {
    return {succ.data() + succ_begin[i], succ.data() + succ_begin[i + 1]};
  }
};

// Builds a Program: algorithms emit steps in an order that is a valid serial
// execution; the builder derives the dependencies (read-after-write,
// write-after-read, write-after-write on overlapping regions, and program
// order between messages to/from the same peer).
// In-place calls: one buffer lives inside the other.  The builder rewrites
// regions of `from` into `to` at `offset` (elements) so that dependencies
// between the aliased buffers are seen and the executor binds one pointer.
struct Alias {
  Buf from = Buf::Input;
  Buf to = Buf::Input;  // from == to: no alias
  uint64_t offset = 0;
};
// The alias of an in-place call of shape on rank (NCCL's conventions).
Alias inplaceAlias(const Shape& shape, int rank);

class ProgramBuilder {
 public:
  void reset(int rank, Alias alias = {});

  void send(int peer, Region src);
  void recv(int peer, Region dst);
  void recvReduce(int peer, Region dst, Region accum);
  void copy(Region dst, Region src);
  void reduce(Region dst, Region a, Region b);
  // Scratch regions are allocated bump-style; returns the region.
  Region scratch(uint64_t count);
  // Orders every later step after every earlier one (for messages that carry
  // no data, such as a barrier's tokens).
  void fence();

  // Computes the dependency graph and moves the result into out.
  void finish(Program* out);

 private:
  Region alias(Region r) const;
  void add(Step s);

  Program prog_;
  Alias alias_;
  uint64_t scratch_top_ = 0;
  std::vector<uint32_t> fences_;  // step indices where a fence was placed
};

// Convenience for regions.
constexpr Region in(uint64_t off, uint64_t n) { return {Buf::Input, off, n}; }
constexpr Region out(uint64_t off, uint64_t n) { return {Buf::Output, off, n}; }
constexpr Region scr(uint64_t off, uint64_t n) { return {Buf::Scratch, off, n}; }

// An algorithm: a self-describing value in a registry the communicator owns.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;  // "ring", "recursive_doubling", ...
  [[nodiscard]] virtual Collective collective() const = 0;
  // Whether the algorithm handles this shape (e.g. a power-of-two constraint).
  [[nodiscard]] virtual bool supports(const Shape& shape) const {
    (void)shape;
    return true;
  }
  // Emits rank's program for shape (the builder is already reset).
  virtual void generate(const Shape& shape, int rank, ProgramBuilder& b) const = 0;
};

// Generates rank's program of algo for shape.
void expand(const Algorithm& algo, const Shape& shape, int rank, Program* out);

// The algorithms a communicator can choose from.
class Registry {
 public:
  // A registry with every built-in algorithm.
  static Registry builtin();

  void add(std::unique_ptr<Algorithm> algo);
  [[nodiscard]] const Algorithm* find(Collective c, std::string_view name) const;
  [[nodiscard]] std::vector<const Algorithm*> forCollective(Collective c) const;
  [[nodiscard]] std::span<const std::unique_ptr<Algorithm>> all() const { return algos_; }

 private:
  std::vector<std::unique_ptr<Algorithm>> algos_;
};

// Built-in algorithm families (one file each under src/plan/).
void addRingAlgorithms(Registry& r);
void addTreeAlgorithms(Registry& r);
void addRecursiveDoublingAlgorithms(Registry& r);
void addExchangeAlgorithms(Registry& r);  // pairwise alltoall(v), barrier, send/recv, direct

}  // namespace chorus::plan
